"""The nvidia_driver role's install decisions, on a lab host (Debian 12, no GPU).

What ran on a real GPU (driver present → kept, count, persistence) is in benchmarks/README.md;
these check what the lab can: the Debian package set resolves against Debian's archive, and
Secure Boot with an unsigned (DKMS) module stops before anything is installed.
"""

from __future__ import annotations

import os
import subprocess

import yaml
from labtools import ANSIBLE_PLAYBOOK, TOP, ssh

DEBIAN = "deb http://deb.debian.org/debian bookworm main contrib non-free non-free-firmware\n"


def test_debian_driver_packages_resolve_with_smi_and_libcuda(provisioned, tmp_path):
    """apt-get --simulate of the role's Debian package set (no Recommends, as the role installs it)
    against Debian's archive, from v100a's own installed packages. The lab hosts have no route to
    the archive, so the controller resolves it with v100a's dpkg status."""
    status = ssh(provisioned.cfg, "v100a", "cat /var/lib/dpkg/status")
    assert status.returncode == 0, status.stderr
    (tmp_path / "status").write_text(status.stdout)
    (tmp_path / "sources.list").write_text(DEBIAN)
    for sub in ("lists/partial", "cache/archives/partial"):
        (tmp_path / sub).mkdir(parents=True)
    settings = {"Dir::Etc::SourceList": tmp_path / "sources.list", "Dir::Etc::SourceParts": "/dev/null",
                "Dir::State::Lists": tmp_path / "lists", "Dir::Cache": tmp_path / "cache",
                "Dir::State::status": tmp_path / "status", "APT::Architecture": "amd64"}
    apt = ["apt-get", *(arg for key, value in settings.items() for arg in ("-o", f"{key}={value}"))]
    update = subprocess.run([*apt, "update", "-qq"], capture_output=True, text=True, timeout=300)
    assert update.returncode == 0, update.stderr
    packages = yaml.safe_load((TOP / "roles/nvidia_driver/vars/Debian.yml").read_text())["_nvidia_driver_packages"]
    simulate = subprocess.run([*apt, "--simulate", "install", "--no-install-recommends", *packages,
                               "linux-headers-amd64"], capture_output=True, text=True, timeout=300)
    assert simulate.returncode == 0, simulate.stdout[-2000:] + simulate.stderr
    installed = {line.split()[1] for line in simulate.stdout.splitlines() if line.startswith("Inst ")}
    assert {"nvidia-smi", "libcuda1", "nvidia-kernel-dkms", "nvidia-persistenced"} <= installed


def install_decisions(provisioned, tmp_path, secure_boot: str) -> str:
    """The role's install tasks on v100a in --check mode (nothing can be installed), Secure Boot as given."""
    play = [{"name": "driver install decisions", "hosts": "v100a", "gather_facts": True,
             "tasks": [{"ansible.builtin.include_role": {"name": "nvidia_driver", "tasks_from": "install"}}]}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    run = subprocess.run(
        [ANSIBLE_PLAYBOOK, "-i", str(provisioned.inventory), str(tmp_path / "play.yml"), "--check",
         "-e", f"_nvidia_driver_secure_boot={secure_boot}", "-e", "_nvidia_driver_nvswitch_count=0"],
        cwd=TOP, capture_output=True, text=True, timeout=300,
        env={**os.environ, "ANSIBLE_ROLES_PATH": str(TOP / "roles"), "ANSIBLE_NOCOLOR": "1"},
    )
    return " ".join((run.stdout + run.stderr).split())


def test_secure_boot_with_an_unsigned_module_fails_before_installing(provisioned, tmp_path):
    """v100a is Debian: its driver module would be built by DKMS, unsigned. With Secure Boot on the
    role must stop naming the host and the fix, before the first package."""
    text = install_decisions(provisioned, tmp_path, "enabled")
    assert "v100a: Secure Boot enabled; kernel module built by DKMS, unsigned" in text
    assert "v100a: Secure Boot is enabled and this driver's kernel module would be built by DKMS, unsigned" in text
    assert "nvidia_driver_allow_unsigned_module: true" in text
    assert "Install the running kernel's headers" not in text


def test_without_secure_boot_the_role_goes_on_to_the_packages(provisioned, tmp_path):
    text = install_decisions(provisioned, tmp_path, "disabled")
    assert "v100a: Secure Boot disabled; kernel module built by DKMS, unsigned" in text
    assert "Install the running kernel's headers" in text  # the lab's offline repository has none: it stops there
