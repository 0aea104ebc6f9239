"""`ansible-playbook provision.yml` against the lab, for real (issue 3).

Order matters: the idempotence and state checks run first on the freshly provisioned lab,
then the failure cases, each of which restores what it changed.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from labtools import TOP

pytestmark = pytest.mark.lab

HOSTS = ("v100a", "v100b")


def pins() -> dict[str, str]:
    out = {}
    for line in (TOP / "requirements-train.txt").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==")
            out[name.strip()] = version.strip()
    return out


def test_full_run_succeeds_and_reports(provisioned):
    run = provisioned.first
    assert all(r["failed"] == 0 and r["unreachable"] == 0 for r in run.recap().values())
    assert "verified: 2 hosts ready to train" in run.output
    network = json.loads((provisioned.reports / "network.json").read_text())
    assert {(p["src"], p["dst"]) for p in network["pairs"]} == {("v100a", "v100b"), ("v100b", "v100a")}
    assert all(p["mbps"] >= network["threshold_mbps"] for p in network["pairs"])
    verify = json.loads((provisioned.reports / "verify.json").read_text())
    assert verify["problems"] == []
    assert verify["allreduce"]["ok"] and verify["allreduce"]["backend"] == "gloo"
    print(f"first run: {run.seconds:.0f} s")


def test_second_run_changes_nothing(provisioned):
    run = provisioned.playbook()
    assert run.rc == 0, run.output[-4000:]
    recap = run.recap()
    assert set(recap) == set(HOSTS)
    assert {h: r["changed"] for h, r in recap.items()} == {h: 0 for h in HOSTS}, run.output[-4000:]
    print(f"second run: {run.seconds:.0f} s")


@pytest.mark.parametrize("name", HOSTS)
def test_host_state(provisioned, name):
    host = provisioned.testinfra_host(name)
    for package in ("iperf3", "ethtool", "chrony", "nftables", "python3-venv", "e2fsprogs", "rsync"):
        assert host.package(package).is_installed, package
    data = host.mount_point("/data")
    assert data.exists and data.filesystem == "ext4" and "noatime" in data.options
    assert host.file("/data").user == "root"  # the training user defaults to ansible_user (root on the lab)
    assert "UUID=" in host.file("/etc/fstab").content_string
    env = host.file("/etc/tandem/env").content_string
    assert "NCCL_SOCKET_IFNAME=eth0" in env and "GLOO_SOCKET_IFNAME=eth0" in env
    assert "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1" in env
    hosts_file = host.file("/etc/hosts").content_string
    assert all(f"{provisioned.cfg.host_ip(n)} {n}" in hosts_file for n in HOSTS)
    assert all(host.file("/etc/ssh/ssh_known_hosts").contains(n) for n in HOSTS)
    venv = "/opt/tandem/venv/bin/python"
    versions = json.loads(host.check_output(
        f"{venv} -c 'import json, torch, fairseq, numpy; "
        "print(json.dumps([torch.__version__, fairseq.__version__, numpy.__version__]))'"))
    want = pins()
    assert versions[0].split("+")[0] == want["torch"]
    assert versions[1] == want["fairseq-fixed"]
    assert versions[2] == want["numpy"]
    # tandem's host-side agent, and only it, is installed once, on the venv's path
    probed = json.loads(host.check_output(f"{venv} -m train.agent.probe"))
    assert probed["fairseq"] == want["fairseq-fixed"] and "import_error" not in probed
    assert host.file("/opt/tandem/lib/train/agent/stop.py").exists
    assert not host.file("/opt/tandem/lib/train/run").exists and not host.file("/opt/tandem/lib/benchmarks").exists
    assert host.run("nft list table inet tandem").rc == 0


def test_firewall_lets_only_peers_reach_training_ports(provisioned):
    """A listener on a rendezvous port of v100a: v100b connects, the controller (no peer) cannot."""
    a, b = provisioned.testinfra_host("v100a"), provisioned.testinfra_host("v100b")
    address = provisioned.cfg.host_ip("v100a")
    a.run("setsid timeout 30 python3 -m http.server 29507 --bind 0.0.0.0 >/dev/null 2>&1 < /dev/null &")
    probe = f"import socket; socket.create_connection(('{address}', 29507), timeout=5).close()"
    try:
        for _ in range(20):  # the server needs a moment to listen
            if b.run(f'python3 -c "{probe}"').rc == 0:
                break
        else:
            pytest.fail("the peer could not reach v100a:29507")
        with pytest.raises(OSError):
            socket.create_connection((address, 29507), timeout=3).close()
        socket.create_connection((address, 22), timeout=3).close()  # everything else stays open
    finally:
        a.run("pkill -f 'http.server 29507'")


def test_host_promising_two_gpus_fails_in_driver_role(provisioned):
    run = provisioned.playbook("--limit", "v100a", "--tags", "nvidia_driver", "-e", "gpus=2")
    assert run.rc != 0
    assert "v100a: expected 2 GPUs, nvidia-smi shows 0" in run.output
    assert "nvidia_driver : The host shows exactly the GPUs it promises" in run.output


def test_unreachable_host_is_named_with_the_reason(provisioned):
    run = provisioned.playbook("--limit", "v100a", "--tags", "preflight", "-e", "ansible_port=1",
                               "-e", "preflight_connect_timeout=3")
    assert run.rc != 0
    text = " ".join(run.output.split())
    assert f"v100a: unreachable as root@{provisioned.cfg.host_ip('v100a')} (port 1): " in text
    assert "Connection refused" in text


def test_link_capped_at_100mbit_fails_naming_the_pair(provisioned):
    provisioned.shape("100mbit")
    try:
        run = provisioned.playbook("--tags", "network", "-e", "network_expected_mbps=1000")
    finally:
        provisioned.shape("none")
    assert run.rc != 0
    text = " ".join(run.output.split())
    for src, dst in (("v100a", "v100b"), ("v100b", "v100a")):
        assert f"{src} -> {dst}: measured " in text
    assert "below the threshold of 900 Mb/s (90% of the expected 1000 Mb/s)" in text
    figures = json.loads((provisioned.reports / "network.json").read_text())
    assert all(50 < p["mbps"] < 110 for p in figures["pairs"]), figures["pairs"]


class Disk:
    """A loop device the controller prepares, visible to the lab hosts (they share /dev)."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as f:
            f.truncate(64 * 1024**2)
        self.device = subprocess.run(["losetup", "--find", "--show", str(path)], check=True,
                                     capture_output=True, text=True).stdout.strip()

    def put_file(self, fstype: str, name: str, text: str, mountpoint: Path) -> None:
        subprocess.run([f"mkfs.{fstype}", "-q", "-F", self.device], check=True, capture_output=True)
        mountpoint.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", self.device, str(mountpoint)], check=True)
        try:
            (mountpoint / name).write_text(text)
        finally:
            subprocess.run(["umount", str(mountpoint)], check=True)

    def detach(self) -> None:
        subprocess.run(["losetup", "-d", self.device], check=False)


@pytest.fixture
def disk(provisioned, tmp_path):
    d = Disk(tmp_path / "disk.img")
    yield d
    # unmount it on v100a and drop its fstab line, then free the loop device
    subprocess.run([str(Path(sys.executable).parent / "ansible"), "-i", str(provisioned.inventory),
                    "v100a", "-m", "ansible.posix.mount", "-a", "path=/srv/keep state=absent"],
                   cwd=TOP, capture_output=True, text=True)
    d.detach()


def data_volume_run(provisioned, device: str, *extra: str):
    return provisioned.playbook("--limit", "v100a", "--tags", "data_volume", "-e", f"data_device={device}",
                                "-e", "data_volume_mount=/srv/keep",
                                "-e", "data_volume_min_free_gb=0", *extra)


def test_data_on_an_ext4_device_survives_and_force_format_erases_it(provisioned, disk, tmp_path):
    disk.put_file("ext4", "precious.txt", "keep me\n", tmp_path / "mnt")
    host = provisioned.testinfra_host("v100a")

    run = data_volume_run(provisioned, disk.device)
    assert run.rc == 0, run.output[-4000:]
    assert host.file("/srv/keep/precious.txt").content_string == "keep me\n"
    assert host.mount_point("/srv/keep").exists

    run = data_volume_run(provisioned, disk.device, "-e", "data_volume_force_format=true")
    assert run.rc == 0, run.output[-4000:]
    assert host.mount_point("/srv/keep").exists
    assert not host.file("/srv/keep/precious.txt").exists


def test_device_with_another_filesystem_is_never_formatted(provisioned, disk, tmp_path):
    disk.put_file("ext2", "precious.txt", "keep me\n", tmp_path / "mnt")
    run = data_volume_run(provisioned, disk.device)
    assert run.rc != 0
    assert f"v100a: {disk.device} already holds a filesystem (ext2): refusing to format it" in " ".join(
        run.output.split())
    mnt = tmp_path / "mnt"
    subprocess.run(["mount", "-o", "ro", disk.device, str(mnt)], check=True)
    try:
        assert (mnt / "precious.txt").read_text() == "keep me\n"
    finally:
        subprocess.run(["umount", str(mnt)], check=True)
