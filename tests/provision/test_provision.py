"""`ansible-playbook provision.yml` against the lab, for real (issue 3).

Order matters: the idempotence and state checks run first on the freshly provisioned lab,
then the failure cases, each of which restores what it changed.
"""

from __future__ import annotations

import dataclasses
import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from labtools import TOP, fab, ssh, user_without_sudo

from lab.network import link_nic
from train.run import preflight

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
    assert "DEPRECATION" not in run.output and "[WARNING]" not in run.output
    print(f"second run: {run.seconds:.0f} s (first {provisioned.first.seconds if provisioned.first else '?'} s)")


def test_a_rerun_reuses_the_measurements_until_asked_or_shaped(provisioned):
    """iperf3 and the all_reduce are the slow part of a rerun: the figures stand while nothing they
    depend on changed, the table says when they were taken, and network_measure=always measures."""
    if not all((provisioned.reports / f).exists() for f in ("network.json", "verify.json")):
        provisioned.playbook("--tags", "network,verify")  # figures in this session's report directory
    before = json.loads((provisioned.reports / "network.json").read_text())
    run = provisioned.playbook("--tags", "network,verify")
    assert run.rc == 0, run.output[-4000:]
    text = " ".join(run.output.split())
    assert f"network figures of {before['measured_at']} reused: nothing they depend on changed" in text
    assert "all_reduce figures of " in text and " reused" in text
    assert f"network measured {before['measured_at']}, all_reduce measured " in text
    print(f"network+verify: reusing {run.seconds:.1f} s")  # network_measure=always: the --check test below


def test_check_mode_on_the_provisioned_lab_passes_and_changes_nothing(provisioned):
    """--check reports what would change (nothing here) and still measures: iperf3 and the all_reduce
    only read, so they run for real (network_measure=always: no figures reused, though nothing
    they depend on changed since the rerun above reused them)."""
    run = provisioned.playbook("--check", "-e", "network_measure=always")
    assert run.rc == 0, run.output[-4000:]
    assert "reused" not in run.output
    assert {h: r["changed"] for h, r in run.recap().items()} == {h: 0 for h in HOSTS}, run.output[-4000:]
    text = " ".join(run.output.split())
    measured = re.search(r"v100a -> v100b ([0-9.]+) Mb/s, v100b -> v100a ([0-9.]+) Mb/s \(threshold", text)
    assert measured and min(map(float, measured.groups())) > 0, text[-3000:]
    assert "verified: 2 hosts ready to train" in text


@pytest.mark.parametrize("name", HOSTS)
def test_host_state(provisioned, name):
    host = provisioned.testinfra_host(name)
    for package in ("iperf3", "ethtool", "chrony", "nftables", "python3-venv", "e2fsprogs", "rsync"):
        assert host.package(package).is_installed, package
    data = host.mount_point("/data")
    assert data.exists and data.filesystem == "ext4" and "noatime" in data.options
    # the training user defaults to ansible_user: the lab's login user (debian), not root
    assert host.file("/data").user == provisioned.cfg.login_user
    assert "UUID=" in host.file("/etc/fstab").content_string
    env = host.file("/etc/tandem/env").content_string
    nic = link_nic(provisioned.cfg)  # ens5 on the two-network lab: the cluster network's NIC
    assert f"NCCL_SOCKET_IFNAME={nic}" in env and f"GLOO_SOCKET_IFNAME={nic}" in env
    assert "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD" not in env  # checkpoints load as data only (issue 54)
    hosts_file = host.file("/etc/hosts").content_string
    assert all(f"{provisioned.cfg.peer_ip(n)} {n}" in hosts_file for n in HOSTS)
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
    probed = json.loads(host.check_output(f"{venv} -m train.agent.measure.probe"))
    assert probed["fairseq"] == want["fairseq-fixed"] and "import_error" not in probed
    assert host.file("/opt/tandem/lib/train/agent/keeper/stop.py").exists
    assert not host.file("/opt/tandem/lib/train/run").exists and not host.file("/opt/tandem/lib/benchmarks").exists
    assert host.run("nft list table inet tandem").rc == 0


def test_firewall_lets_only_peers_reach_training_ports(provisioned):
    """A listener on a rendezvous port of v100a: v100b connects at v100a's cluster address, the
    controller (no peer) cannot at the address it has for v100a, and SSH stays open to it."""
    a, b = provisioned.testinfra_host("v100a"), provisioned.testinfra_host("v100b")
    address = provisioned.cfg.host_ip("v100a")  # the only one the controller has a route to
    a.run("setsid timeout 30 python3 -m http.server 29507 --bind 0.0.0.0 >/dev/null 2>&1 < /dev/null &")
    probe = f"import socket; socket.create_connection(('{provisioned.cfg.peer_ip('v100a')}', 29507), timeout=5).close()"
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
        # the brackets keep the pattern off the command lines that run pkill (sudo's, its shell's)
        a.run("pkill -f 'http[.]server 29507'")


def test_host_promising_two_gpus_fails_in_driver_role(provisioned):
    run = provisioned.playbook("--limit", "v100a", "--tags", "nvidia_driver", "-e", "gpus=2")
    assert run.rc != 0
    text = " ".join(run.output.split())
    assert "v100a: expected 2 GPUs, nvidia-smi shows 0: nvidia-smi is not installed (no driver)" in text
    assert "ansible-playbook provision.yml --tags nvidia_driver" in text
    assert "nvidia_driver : The host shows exactly the GPUs it promises" in run.output


def test_unreachable_host_is_named_once_with_the_reason_at_once(provisioned):
    """A refused port: one error, without an ignored one before it, and without waiting out the
    20 s connect timeout."""
    run = provisioned.playbook("--limit", "v100a", "--tags", "preflight", "-e", "ansible_port=1",
                               "-e", "preflight_connect_timeout=20")
    assert run.rc != 0
    text = " ".join(run.output.split())
    assert f"v100a: unreachable as {provisioned.cfg.login_user}@{provisioned.cfg.host_ip('v100a')} (port 1): " in text
    assert "Connection refused" in text
    assert "UNREACHABLE" not in run.output and "...ignoring" not in run.output
    assert run.output.count("[ERROR]") == 1
    assert run.seconds < 15, run.seconds


def test_a_login_user_who_cannot_become_root_is_named_in_preflight(provisioned):
    """Provisioning changes the hosts as root through sudo: a login user whose sudo asks a password stops
    in preflight, named with what to do, before any role touches a host."""
    with user_without_sudo(provisioned.cfg) as user:
        run = provisioned.playbook("--limit", "v100a", "-e", f"ansible_user={user}")
    assert run.rc != 0
    text = " ".join(run.output.split())
    assert f"v100a: {user} cannot become root with sudo (" in text, text[-3000:]
    assert f"Give {user} passwordless sudo (a line `{user} ALL=(ALL) NOPASSWD:ALL` in a file under " in text
    assert "--ask-become-pass" in text
    assert "common : " not in run.output  # stopped before any role


def test_hosts_sharing_an_address_are_named(provisioned):
    run = provisioned.playbook("--tags", "preflight", "-e", f"ansible_host={provisioned.cfg.host_ip('v100a')}")
    assert run.rc != 0
    assert f"hosts share an address: v100a and v100b are both reached over SSH at " \
           f"{provisioned.cfg.host_ip('v100a')}:22" in " ".join(run.output.split())


STAND_IN = "/usr/local/bin/python-standin"


def test_a_host_whose_python_is_too_old_or_differs_is_named_before_anything_is_installed(provisioned):
    """The venv is made with the host's own Python. An Ubuntu 22.04 host's 3.10 (a stand-in
    interpreter on v100b that answers as 3.10 would) is named with the version it needs and what to
    set; a host whose Python differs from the others' (3.12 beside 3.11) is named too. Neither run
    creates or touches a venv."""
    cfg = provisioned.cfg
    picked = f'train_env_python={{{{ "{STAND_IN}" if inventory_hostname == "v100b" else "/usr/bin/python3" }}}}'
    try:
        for version, said in (
            ("3.10.12", "v100b: {stand_in} is Python 3.10.12; tandem's pins (numpy, scikit-learn, torch 3.11+ "
                        "wheels) need Python 3.11 or newer. On Ubuntu 22.04: apt install python3.11"),
            ("3.12.3", "the hosts' training Pythons differ (v100a has 3.11, v100b has 3.12): one cluster needs one "
                       "Python"),
        ):
            minor = ".".join(version.split(".")[:2])
            answer = json.dumps({"version": version, "minor": minor, "machine": "x86_64", "libc": "glibc-2.35"})
            script = f"#!/bin/sh\ncat <<'JSON'\n{answer}\nJSON\n"  # whatever -c asks, it answers this
            ssh(cfg, "v100b", f"cat > {STAND_IN} <<'SCRIPT'\n{script}SCRIPT\nchmod +x {STAND_IN}", sudo=True)
            run = provisioned.playbook("--tags", "train_env", "-e", picked)
            assert run.rc != 0
            text = " ".join(run.output.split())
            assert said.format(stand_in=STAND_IN) in text, text[-3000:]
            assert "Create the virtualenv" not in run.output and "Install the pinned packages" not in run.output
    finally:
        ssh(cfg, "v100b", f"rm -f {STAND_IN}", sudo=True)
    assert ssh(cfg, "v100b", "/opt/tandem/venv/bin/python -c 'import torch, fairseq'").returncode == 0


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


def test_zero_link_speed_stops_in_preflight_and_the_check_is_turned_off_by_name(provisioned):
    run = provisioned.playbook("--tags", "network", "-e", "network_expected_mbps=0")
    assert run.rc != 0
    text = " ".join(run.output.split())
    assert "network_expected_mbps is 0 on v100a, v100b: must be a whole number above 0" in text
    assert "network : " not in run.output  # stopped before any role touched a host

    provisioned.shape("100mbit")
    try:
        run = provisioned.playbook("--tags", "network", "-e", "network_check_link=false")
    finally:
        provisioned.shape("none")
    assert run.rc == 0, run.output[-4000:]
    text = " ".join(run.output.split())
    assert "the link check is off (network_check_link: false): measured v100a -> v100b " in text
    assert "not held to a threshold" in text


def test_drifted_packages_are_named_by_fab_train_and_restored_by_provisioning(provisioned):
    """Two pinned packages fab train's version check never looked at go missing on v100b, and its
    host-side agent is another version's (a controller updated without re-provisioning)."""
    assert provisioned.playbook("--tags", "train_env").rc == 0  # this tree's agent on the hosts
    pip = "/opt/tandem/venv/bin/pip"
    gone = ssh(provisioned.cfg, "v100b", f"{pip} uninstall -y -q sacrebleu tensorboardX "
                                         "&& echo '# another version' >> /opt/tandem/lib/train/agent/keeper/state.py",
               sudo=True)  # root's venv and agent, as provisioning made them
    assert gone.returncode == 0, gone.stderr
    proc = fab(provisioned, "train", "--new", check=False)
    assert proc.returncode != 0
    said = " ".join(proc.stdout.split())
    assert ("v100b: packages differ from the pins: sacrebleu missing (pinned 2.6.0), tensorboardx missing "
            "(pinned 2.6.5); re-run provision.yml (--tags train_env) to restore them") in said
    assert re.search(r"v100b: tandem's host-side agent \(train/agent\) there is version [0-9a-f]{12}, not this "
                     rf"controller's {preflight.controller_agent()[:12]}: re-run provision.yml \(--tags train_env\)",
                     said), said
    assert "v100a: packages differ" not in proc.stdout and "v100a: tandem's" not in proc.stdout

    run = provisioned.playbook("--tags", "train_env")
    assert run.rc == 0, run.output[-4000:]
    text = " ".join(run.output.split())
    assert "v100b: restored to the pins: " in text and "sacrebleu 2.6.0 (was missing)" in text
    assert "tensorboardX 2.6.5 (was missing)" in text.lower().replace("tensorboardx", "tensorboardX")
    assert "v100a: restored" not in text
    assert run.recap()["v100a"]["changed"] == 0
    probed = ssh(provisioned.cfg, "v100b", "/opt/tandem/venv/bin/python -m train.agent.measure.probe "
                                           "--cache /opt/tandem/versions.json")
    assert json.loads(probed.stdout)["agent"] == preflight.controller_agent()  # the controller's agent again


class Disk:
    """A loop device the controller prepares, visible to the lab hosts (they share /dev)."""

    def __init__(self, path: Path, mb: int = 64):
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as f:
            f.truncate(mb * 1024**2)  # sparse
        self.device = subprocess.run(["losetup", "--find", "--show", str(path)], check=True,
                                     capture_output=True, text=True).stdout.strip()

    def put_file(self, fstype: str, name: str, text: str, mountpoint: Path) -> None:
        force = "-f" if fstype == "xfs" else "-F"
        subprocess.run([f"mkfs.{fstype}", "-q", force, self.device], check=True, capture_output=True)
        mountpoint.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", self.device, str(mountpoint)], check=True)
        try:
            (mountpoint / name).write_text(text)
        finally:
            subprocess.run(["umount", str(mountpoint)], check=True)

    def holds(self, tag: str = "TYPE") -> str:
        return subprocess.run(["blkid", "--probe", "-o", "value", "-s", tag, self.device],
                              capture_output=True, text=True).stdout.strip()

    def detach(self) -> None:
        subprocess.run(["losetup", "-d", self.device], check=False)


def unmount_scratch(provisioned, hosts: str, path: str = "/srv/keep") -> None:
    """Unmount `path` on the hosts and drop its fstab line."""
    mount(provisioned, hosts, f"path={path} state=absent")


def mount(provisioned, hosts: str, args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(Path(sys.executable).parent / "ansible"), "-i", str(provisioned.inventory),
                           hosts, "-m", "ansible.posix.mount", "-a", args], cwd=TOP, capture_output=True, text=True)


@pytest.fixture
def disk(provisioned, tmp_path):
    d = Disk(tmp_path / "disk.img")
    yield d
    unmount_scratch(provisioned, "v100a")
    d.detach()


@pytest.fixture
def two_disks(provisioned, tmp_path):
    """v100a's scratch disk and v100b's (XFS needs 300 MB at least; the files are sparse)."""
    disks = {"v100a": Disk(tmp_path / "a.img"), "v100b": Disk(tmp_path / "b.img", mb=320)}
    yield disks
    unmount_scratch(provisioned, "v100a,v100b")
    for d in disks.values():
        d.detach()


def data_volume_run(provisioned, device: str, *extra: str):
    return provisioned.playbook("--limit", "v100a", "--tags", "data_volume", "-e", f"data_device={device}",
                                "-e", "data_volume_mount=/srv/keep",
                                "-e", "data_volume_min_free_gb=0", *extra)


def test_data_on_an_ext4_device_survives_even_when_named_for_erasing(provisioned, disk, tmp_path):
    disk.put_file("ext4", "precious.txt", "keep me\n", tmp_path / "mnt")
    host = provisioned.testinfra_host("v100a")

    run = data_volume_run(provisioned, disk.device)
    assert run.rc == 0, run.output[-4000:]
    assert host.file("/srv/keep/precious.txt").content_string == "keep me\n"
    assert host.mount_point("/srv/keep").exists
    assert f"v100a: kept the existing ext4 on {disk.device}, " in " ".join(run.output.split())

    run = data_volume_run(provisioned, disk.device, "-e", f"data_volume_force_format=v100a:UUID={disk.holds('UUID')}")
    assert run.rc == 0, run.output[-4000:]
    assert f"v100a: {disk.device} already holds ext4: kept, not erased" in " ".join(run.output.split())
    assert host.file("/srv/keep/precious.txt").content_string == "keep me\n"


def test_force_format_true_is_refused_before_anything_is_erased(provisioned, disk, tmp_path):
    disk.put_file("ext2", "precious.txt", "keep me\n", tmp_path / "mnt")
    run = data_volume_run(provisioned, disk.device, "-e", "data_volume_force_format=true")
    assert run.rc != 0
    assert ("data_volume_force_format: true would erase every host's data device; name the host and device"
            in " ".join(run.output.split()))
    assert disk.holds() == "ext2"


@pytest.mark.parametrize("named", ["{device}", "v100a:{device}"])
def test_force_format_without_a_host_or_by_a_kernel_name_is_refused_before_anything_is_erased(provisioned, disk,
                                                                                               tmp_path, named):
    """`-e data_volume_force_format=/dev/nvme1n1` named that device on every host; a kernel name names another
    disk after a stop/start (issue 54)."""
    disk.put_file("ext2", "precious.txt", "keep me\n", tmp_path / "mnt")
    value = named.format(device=disk.device)
    run = data_volume_run(provisioned, disk.device, "-e", f"data_volume_force_format={value}")
    assert run.rc != 0
    assert f"data_volume_force_format: {value} " in " ".join(run.output.split())
    assert disk.holds() == "ext2"


def test_a_device_mounted_elsewhere_is_neither_mounted_nor_erased(provisioned, disk, tmp_path):
    """A data_device typo naming the root partition mounted / again at /data and chowned it (issue 54)."""
    disk.put_file("ext4", "precious.txt", "keep me\n", tmp_path / "mnt")
    mounted = mount(provisioned, "v100a", f"path=/srv/other src={disk.device} fstype=ext4 state=ephemeral")
    assert mounted.returncode == 0, mounted.stdout + mounted.stderr
    try:
        run = data_volume_run(provisioned, disk.device, "-e",
                              f"data_volume_force_format=v100a:UUID={disk.holds('UUID')}")
        text = " ".join(run.output.split())
        assert run.rc != 0
        assert f"v100a: {disk.device} (ext4, UUID {disk.holds('UUID')}, 67.1 MB, " in text
        assert f"is in use: {disk.device} at /srv/other; refusing to mount or erase it for /srv/keep" in text
        assert not provisioned.testinfra_host("v100a").mount_point("/srv/keep").exists
    finally:
        mount(provisioned, "v100a", "path=/srv/other state=unmounted")
    assert disk.holds() == "ext4"


def test_force_format_erases_only_the_refused_host_device(provisioned, two_disks, tmp_path):
    """Healthy ext4 with a file on v100a, XFS on v100b: the refusal names v100b's device and the
    command that erases it alone; that command keeps v100a's file and formats v100b."""
    two_disks["v100a"].put_file("ext4", "precious.txt", "keep me\n", tmp_path / "mnt")
    two_disks["v100b"].put_file("xfs", "old.txt", "scratch\n", tmp_path / "mnt")
    inventory = yaml.safe_load(provisioned.inventory.read_text())
    for name, d in two_disks.items():
        inventory["all"]["children"]["cluster"]["hosts"][name]["data_device"] = d.device
    inventory["all"]["vars"].update(data_volume_mount="/srv/keep", data_volume_min_free_gb=0)
    scratch = dataclasses.replace(provisioned, inventory=tmp_path / "inventory.yml")
    scratch.inventory.write_text(yaml.safe_dump(inventory))

    refused = scratch.playbook("--tags", "data_volume")
    text = " ".join(refused.output.split())
    assert refused.rc != 0
    b, b_uuid = two_disks["v100b"].device, two_disks["v100b"].holds("UUID")
    assert f"v100b: {b} already holds a filesystem (xfs, UUID {b_uuid}, 335.5 MB, " in text, text[-3000:]
    assert "refusing to format it as ext4" in text
    advice = f"ansible-playbook -i {scratch.inventory} provision.yml -e data_volume_force_format=v100b:UUID={b_uuid}"
    assert advice in text
    assert "v100a: /dev" not in text.split("Refuse to format")[-1].split("PLAY RECAP")[0]
    print(refused.output.split("Refuse to format")[-1].split("PLAY RECAP")[0])
    assert two_disks["v100b"].holds() == "xfs"

    forced = scratch.playbook("--tags", "data_volume", "-e", f"data_volume_force_format=v100b:UUID={b_uuid}")
    text = " ".join(forced.output.split())
    assert forced.rc == 0, forced.output[-4000:]
    assert f"v100b: ERASING {b} (xfs, UUID {b_uuid}, 335.5 MB, " in text
    assert " used), as data_volume_force_format asks" in text
    assert "v100a: ERASING" not in text
    assert provisioned.testinfra_host("v100a").file("/srv/keep/precious.txt").content_string == "keep me\n"
    assert two_disks["v100b"].holds() == "ext4"
    b_host = provisioned.testinfra_host("v100b")
    assert b_host.mount_point("/srv/keep").exists and not b_host.file("/srv/keep/old.txt").exists


def test_device_with_another_filesystem_is_never_formatted(provisioned, disk, tmp_path):
    disk.put_file("ext2", "precious.txt", "keep me\n", tmp_path / "mnt")
    run = data_volume_run(provisioned, disk.device)
    assert run.rc != 0
    text = " ".join(run.output.split())
    assert f"v100a: {disk.device} already holds a filesystem (ext2, UUID {disk.holds('UUID')}, 67.1 MB, " in text
    assert "refusing to format it as ext4" in text and "partition" not in text.split("refusing")[1][:300]
    mnt = tmp_path / "mnt"
    subprocess.run(["mount", "-o", "ro", disk.device, str(mnt)], check=True)
    try:
        assert (mnt / "precious.txt").read_text() == "keep me\n"
    finally:
        subprocess.run(["umount", str(mnt)], check=True)
