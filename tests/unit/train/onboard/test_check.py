"""`fab init`'s check (train/onboard/probe.py, fixes.py, check.py): each problem said with its fix, no network.

The hosts' answers are Facts (or the error SSH raised); the probe's shell line itself runs here, on
this machine, standing in for a host.
"""

from __future__ import annotations

import socket
import subprocess
import sys

import paramiko
import pytest
from rich.console import Console

from train.cluster import Host, HostResult
from train.onboard import check, fixes, probe

FINE = probe.Facts(os_id="ubuntu", os_version="22.04", os_name="Ubuntu 22.04.4 LTS", python="3.12.3", smi="ok",
                       smi_gpus=1, pci_gpus=1, address_local=True, route="10.0.0.11 dev ens5 src 10.0.0.10 uid 1000",
                       nics=("lo", "ens5"), disk_path="/", free_gb=80.0, disks=("nvme0n1 100G",))


def gpu(name="gpu2", **variables) -> Host:
    values = {"gpus": 1, "data_device": "none", "ansible_user": "ubuntu", **variables}
    return Host(name, "203.0.113.11", user="ubuntu", key="~/.ssh/id_ed25519", gpus=int(values["gpus"]),
                nic=values.get("cluster_nic"), vars=values, cluster_address=values.get("cluster_address", ""))


def facts(**changes) -> probe.Facts:
    return probe.Facts(**{**FINE.__dict__, **changes})


def test_a_ready_host_has_no_problem():
    assert fixes.host_problems(gpu(), FINE, 2) == [] and fixes.inventory(gpu()) == []


def test_sudo_that_asks_a_password_says_how_to_make_it_passwordless():
    said = fixes.host_problems(gpu(), facts(sudo_error="sudo: a password is required"), 2)
    assert said == ["gpu2: sudo asks for a password: add `ubuntu ALL=(ALL) NOPASSWD:ALL` to /etc/sudoers.d/ubuntu (as "
                    "root: `visudo -f /etc/sudoers.d/ubuntu`), or set ansible_become_password (in an ansible-vault "
                    "file) for provisioning; fab bench-step's tc caps still need passwordless sudo"]
    assert fixes.sudo(gpu(), facts(sudo_error="sh: 1: sudo: not found"))[0].startswith(
        "gpu2: sudo is not installed: as root, `apt-get install sudo`")
    assert fixes.sudo(gpu(), facts(root=True, sudo_error="sudo: not found")) == []  # root needs none


def test_an_old_python_and_an_unsupported_system_say_what_to_install_or_start():
    assert fixes.system(gpu(), facts(python="3.10.12")) == [
        "gpu2: /usr/bin/python3 is Python 3.10.12; tandem needs 3.11 or newer: `sudo apt-get install python3.11 "
        "python3.11-venv python3.11-dev`, then set train_env_python: /usr/bin/python3.11 in the inventory"]
    assert fixes.system(gpu(), facts(os_id="rocky", os_version="9.3", os_name="Rocky Linux 9.3")) == [
        "gpu2: Rocky Linux 9.3 is not one provisioning supports (Debian 12, Debian 13, Ubuntu 22, Ubuntu 24): start "
        "the VM from one of those images"]
    assert "no Python at /opt/py (train_env_python)" in fixes.system(gpu(train_env_python="/opt/py"),
                                                                         facts(python=""))[0]


def test_gpus_are_counted_by_nvidia_smi_else_on_the_pci_bus_before_the_driver():
    assert fixes.gpus(gpu(gpus=2), facts(smi_gpus=1)) == [
        "gpu2: nvidia-smi lists 1 GPU, the inventory says gpus: 2: set gpus: 1, or get the VM you ordered"]
    no_driver = facts(smi="absent", smi_gpus=0, pci_gpus=1)
    assert fixes.gpus(gpu(), no_driver) == []  # provisioning installs the driver
    assert check.gpus_cell(gpu(), no_driver) == \
        "none (driver not installed yet: provisioning installs it); 1 on PCI"
    assert fixes.gpus(gpu(gpus=4), no_driver) == [
        "gpu2: its PCI bus shows 1 NVIDIA GPU, the inventory says gpus: 4: set gpus: 1"]
    assert fixes.gpus(gpu(), facts(smi="absent", pci_gpus=0))[0].startswith(
        "gpu2: no NVIDIA GPU on its PCI bus, the inventory says gpus: 1: a CPU VM? set gpus: 0")
    assert fixes.gpus(gpu(gpus=0), facts(smi="absent", pci_gpus=0)) == []  # a CPU host
    assert check.gpus_cell(gpu(gpus=0), facts(smi="absent", pci_gpus=0)) == "none (a CPU host)"


def test_a_natd_address_asks_for_the_private_cluster_address_and_a_missing_nic_for_the_routes():
    natd = facts(address_local=False)
    assert fixes.network(gpu(), natd, 2) == [
        "gpu2: its peers would reach it at 203.0.113.11, its SSH address, which is not on any of its NICs (a NAT'd "
        "public address): set cluster_address: 10.0.0.10 (the address it reaches its peers from)"]
    assert fixes.network(gpu(), natd, 1) == []  # alone, no peer reaches it
    assert fixes.network(gpu(cluster_address="10.9.9.9"), natd, 2)[0].startswith(
        "gpu2: cluster_address 10.9.9.9 is not on any of its NICs: set cluster_address: 10.0.0.10")
    assert fixes.network(gpu(cluster_nic="eth9"), FINE, 2) == [
        "gpu2: cluster_nic eth9 does not exist (its NICs: lo, ens5): set cluster_nic: ens5, or leave cluster_nic "
        "unset to use the NIC of the route to the peers"]
    assert check.address_cell(gpu(cluster_address="10.0.0.10"), FINE) == "10.0.0.10 (ens5, by route)"


def test_the_data_device_must_exist_and_the_disk_hold_what_training_needs():
    volume = gpu(data_device="/dev/nvme1n1")
    assert fixes.disk(volume, facts(device_gb=None)) == [
        "gpu2: data_device /dev/nvme1n1 is not a block device there (its disks: nvme0n1 100G): set data_device to the "
        "attached volume's device, or `none` to keep /data on the root disk"]
    assert fixes.disk(volume, facts(device_gb=500.0)) == []
    assert check.disk_cell(volume, facts(device_gb=500.0)) == "/dev/nvme1n1: 500 GB (provisioning formats it)"
    assert fixes.disk(gpu(), facts(free_gb=5.0)) == [
        "gpu2: 5 GB free on /, training needs 12 GB (data_volume_min_free_gb): attach a larger volume and set "
        "data_device, or grow the disk"]
    assert fixes.disk(gpu(data_volume_min_free_gb=1), facts(free_gb=5.0)) == []


def test_an_entry_without_gpus_or_data_device_is_named_as_provisioning_would():
    said = fixes.inventory(Host("gpu1", "203.0.113.10"))
    assert said[0] == "gpu1: the inventory gives no `gpus`: set how many GPUs the VM has (0 for a CPU host)"
    assert said[1].startswith("gpu1: the inventory gives no `data_device`: set the attached volume's device")


@pytest.mark.parametrize(("error", "said"), [
    (paramiko.SSHException("Server '203.0.113.11' not found in known_hosts"),
     "gpu2: its SSH host key is not in ~/.ssh/known_hosts (fab checks it): compare `ssh-keyscan 203.0.113.11` with "
     "the fingerprint in the provider's console, then `ssh-keyscan 203.0.113.11 >> ~/.ssh/known_hosts`"),
    (paramiko.AuthenticationException("Authentication failed."),
     "gpu2: ubuntu@203.0.113.11 refused the key ~/.ssh/id_ed25519: check the login user (ubuntu on Ubuntu images, "
     "debian on Debian, ec2-user on Amazon Linux) and that the key is the one the VM was created with "
     "(ansible_ssh_private_key_file, fab init --key)"),
    (paramiko.PasswordRequiredException("private key file is encrypted"),
     "gpu2: the key ~/.ssh/id_ed25519 has a passphrase: load it into the agent (`ssh-add ~/.ssh/id_ed25519`); fab "
     "and Ansible use the agent"),
    (paramiko.ssh_exception.NoValidConnectionsError({("203.0.113.11", 22): ConnectionRefusedError(111, "refused")}),
     "gpu2: nothing answers SSH at ubuntu@203.0.113.11 port 22 ([Errno None] Unable to connect to port 22 on "
     "203.0.113.11): check the VM is running, the address (ansible_host), and that its firewall / security group "
     "lets SSH in from this machine"),
    (TimeoutError("timed out"), "gpu2: nothing answers SSH at ubuntu@203.0.113.11 port 22 (timed out): check the VM"),
    (paramiko.SSHException("Error reading SSH protocol banner"),
     "gpu2: something answers at ubuntu@203.0.113.11 port 22 but not as SSH (Error reading SSH protocol banner): "
     "check the address and port (ansible_host, ansible_port), and that no firewall cuts the connection"),
    (socket.gaierror(-2, "Name or service not known"), "gpu2: 203.0.113.11 does not resolve"),
])
def test_each_way_ssh_fails_comes_with_its_fix(error, said):
    assert fixes.ssh(gpu(), error).startswith(said)


def answered(host: Host, facts_: probe.Facts) -> HostResult:
    lines = [f"uid={0 if facts_.root else 1000}", f"os_id={facts_.os_id}", f"os_version={facts_.os_version}",
             f"os_name={facts_.os_name}", f"python={facts_.python}", f"smi={facts_.smi}", f"smi_gpus={facts_.smi_gpus}",
             f"pci_gpus={facts_.pci_gpus}", f"nics={' '.join(facts_.nics)}", f"route={facts_.route}",
             "address_local=yes" if facts_.address_local else "", f"disk_path={facts_.disk_path}",
             f"disk_free_kb={int((facts_.free_gb or 0) * 1e9 / 1024)}", f"disks={','.join(facts_.disks)}"]
    if facts_.sudo_error:
        lines.append(f"sudo_error={facts_.sudo_error}")
    return HostResult(host.name, stdout="\n".join(lines) + "\n", exited=0)


def test_one_table_every_host_and_each_problem_under_it():
    hosts = [gpu("gpu1", cluster_address="10.0.0.10", hourly_usd=2.5), gpu("gpu2", cluster_address="10.0.0.11")]
    results = {"gpu1": answered(hosts[0], FINE),
               "gpu2": answered(hosts[1], facts(sudo_error="sudo: a password is required", smi="absent"))}
    report = check.assess(hosts, results)
    assert [c.ok for c in report.hosts] == [True, False] and not report.ok
    assert report.hosts[1].facts.sudo_error == "sudo: a password is required"
    assert report.problems == [fixes.sudo(hosts[1], report.hosts[1].facts)[0]]
    console = Console(record=True, width=250, soft_wrap=True)  # as train.cli.executor.console
    check.show(report, console)
    out = console.export_text()
    assert "none (driver not installed yet: provisioning installs it); 1 on PCI" in out
    assert "2.50" in out and "Ubuntu 22.04" in out and "asks a password" in out
    assert out.splitlines()[-1].startswith("  gpu2: sudo asks for a password: add `ubuntu ALL=(ALL) NOPASSWD:ALL`")


def test_an_unreachable_host_is_a_row_and_a_fix_the_others_still_checked():
    hosts = [gpu("gpu1", cluster_address="10.0.0.10"), gpu("gpu2", cluster_address="10.0.0.11")]
    report = check.assess(hosts, {"gpu1": answered(hosts[0], FINE),
                                      "gpu2": HostResult("gpu2", error=TimeoutError("timed out"))})
    assert report.hosts[0].ok and report.hosts[1].facts is None
    assert report.problems == ["gpu2: nothing answers SSH at ubuntu@203.0.113.11 port 22 (timed out): check the VM is "
                               "running, the address (ansible_host), and that its firewall / security group lets SSH "
                               "in from this machine"]  # one fix: what the host lacks is said once it answers
    assert check.row(report.hosts[1])[1] == "[red]no[/]"


def test_hosts_with_two_pythons_or_gpu_counts_are_named_together():
    hosts = [gpu("gpu1", cluster_address="10.0.0.10"), gpu("gpu2", cluster_address="10.0.0.11", gpus=2),
             gpu("gpu3", cluster_address="10.0.0.12")]
    said = fixes.cluster_problems(hosts, {"gpu1": FINE, "gpu2": facts(python="3.11.2"), "gpu3": FINE})
    assert said[0] == ("the hosts' Pythons differ (gpu1 3.12.3, gpu2 3.11.2, gpu3 3.12.3): one cluster trains in one "
                       "environment; set train_env_python to the same version on every host")
    assert said[1].startswith("gpu2: 2 GPUs (2 ranks), while gpu1, gpu3 have 1 GPU (1 rank)")


def test_each_host_looks_toward_its_first_peer():
    hosts = [gpu("gpu1", cluster_address="10.0.0.10"), gpu("gpu2", cluster_address="10.0.0.11")]
    assert [check.peer_of(hosts, h) for h in hosts] == ["10.0.0.11", "10.0.0.10"]
    assert check.peer_of(hosts[:1], hosts[0]) is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the probe is a Linux host's shell line")
def test_the_probe_runs_in_a_posix_shell_and_its_answers_parse(tmp_path):
    """This machine as the host: the line runs under sh, exits 0, and says what a host says."""
    host = gpu(cluster_address="127.0.0.1", data_device="/dev/no-such-device", data_volume_mount=str(tmp_path),
               train_env_python=sys.executable)
    proc = subprocess.run(["sh", "-c", probe.command(host, "127.0.0.1")], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    said = probe.parse(proc.stdout)
    assert said.python == ".".join(map(str, sys.version_info[:3]))
    assert said.address_local and said.route_nic == "lo" and "lo" in said.nics
    assert said.smi in ("absent", "ok", "failed") and said.device_gb is None
    assert said.disk_path == "/" and said.free_gb is not None and said.free_gb > 0  # tmp_path is no mount point
