"""The hosts' Debian root filesystem and the apt repository they install from.

Built once with mmdebstrap and cached; every host mounts it read-only as the lower layer
of its own overlay. A host is a fresh VM: sshd, python3 and little else, and the login user a Debian
cloud image has (`debian`, uid 1000, passwordless sudo from /etc/sudoers.d/90-cloud-init-users, as
cloud-init writes it; each host's key is added at lab-up, lab/hosts.py). Whatever
provisioning installs (iperf3, ethtool, chrony, ...) comes from an apt repository the lab
serves on the bridge, because the hosts have no route off this machine.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

from lab.config import LOGIN_USERS
from lab.shell import LabError, run

SUITES = ("bookworm", "trixie")  # Debian 12 (Python 3.11), Debian 13 (Python 3.13)
# What a freshly rented Debian VM has.
BASE_PACKAGES = [
    "openssh-server", "python3", "python3-apt", "iproute2", "sudo", "tini",
    "ca-certificates", "procps",
]
# What provisioning may install; served to the hosts by the lab's apt repository.
REPO_PACKAGES = [
    "iperf3", "ethtool", "python3-venv", "rsync", "chrony", "acl", "e2fsprogs",
    "nftables", "pciutils", "kmod", "etcd-server",
]
# Where the controller's Python is not the hosts', provisioning builds fairseq's wheel on a host.
BUILD_PACKAGES = {"bookworm": [], "trixie": ["build-essential", "python3-dev"]}
# The cloud image's login user: a home, a bash shell, a locked password, sudo for everything without one.
CLOUD_USER = "debian"
SUDOERS_FILE = "/etc/sudoers.d/90-cloud-init-users"


def cloud_user_hooks(user: str = CLOUD_USER) -> list[str]:
    """mmdebstrap hooks that create `user` as cloud-init does on a Debian cloud image."""
    uid = LOGIN_USERS[user]
    return [
        f'--customize-hook=chroot "$1" useradd --create-home --uid {uid} --user-group --shell /bin/bash {user}',
        f'--customize-hook=printf "# User rules for {user}\\n{user} ALL=(ALL) NOPASSWD:ALL\\n" '
        f'> "$1"{SUDOERS_FILE} && chmod 0440 "$1"{SUDOERS_FILE}',
    ]


def _key(suite: str) -> str:
    text = " ".join([suite, *BASE_PACKAGES, "|", *REPO_PACKAGES, *BUILD_PACKAGES[suite], "|", *cloud_user_hooks(),
                     "v2"])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def rootfs_dir(cache: Path, suite: str = "bookworm") -> Path:
    return cache / "lab" / f"rootfs-{_key(suite)}"


def repo_dir(cache: Path, suite: str = "bookworm") -> Path:
    return cache / "lab" / f"apt-{_key(suite)}"


def is_built(cache: Path, suite: str = "bookworm") -> bool:
    return (rootfs_dir(cache, suite) / ".complete").exists() and (repo_dir(cache, suite) / "Packages").exists()


def build(cache: Path, suite: str = "bookworm") -> None:
    """Build the root filesystem and the apt repository (about 40 s, once)."""
    if suite not in SUITES:
        raise LabError(f"the lab builds Debian {' or '.join(SUITES)}, not {suite!r}")
    root, repo = rootfs_dir(cache, suite), repo_dir(cache, suite)
    tmp_root, tmp_repo = root.with_name(root.name + ".tmp"), repo.with_name(repo.name + ".tmp")
    for path in (tmp_root, tmp_repo):
        shutil.rmtree(path, ignore_errors=True)
    tmp_repo.mkdir(parents=True)
    if not shutil.which("mmdebstrap"):
        raise LabError("mmdebstrap is not installed: run `make lab-setup` (or apt-get install mmdebstrap)")
    run(
        "mmdebstrap", "--variant=minbase", "--include=" + ",".join(BASE_PACKAGES),
        # Download (not install) what provisioning may ask for, with its dependencies.
        "--customize-hook=chroot \"$1\" apt-get install -y --download-only "
        + " ".join(REPO_PACKAGES + BUILD_PACKAGES[suite]),
        f"--customize-hook=cp \"$1\"/var/cache/apt/archives/*.deb {tmp_repo}/",
        *cloud_user_hooks(),
        # Each host gets its own host keys at lab-up.
        "--customize-hook=rm -f \"$1\"/etc/ssh/ssh_host_*",
        suite, str(tmp_root),
    )
    (tmp_repo / "Packages").write_text(_ftparchive(tmp_repo))
    (tmp_root / ".complete").touch()
    for tmp, final in ((tmp_root, root), (tmp_repo, repo)):
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)


def _ftparchive(repo: Path) -> str:
    # Paths in the index are relative to the working directory: run it in the repository.
    proc = subprocess.run(["apt-ftparchive", "packages", "."], cwd=repo, capture_output=True, text=True)
    if proc.returncode != 0:
        raise LabError(f"apt-ftparchive failed in {repo}: {proc.stderr.strip()}")
    return proc.stdout
