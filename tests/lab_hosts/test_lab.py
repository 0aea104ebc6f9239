"""The lab behaves like a small cluster of real machines, and leaves nothing behind."""

from __future__ import annotations

import json
import statistics
import subprocess
import threading
import time

import pytest
from labtools import TOP, lab_cli, set_links, ssh

from lab import hosts as lab_hosts
from lab.config import LabConfig
from train.cluster import DEAD_LINK_S, connect, load_hosts, run_all


def test_each_host_answers_ssh_with_its_own_name_and_host_key(lab):
    names = [ssh(lab, name, "hostname").stdout.strip() for name in lab.names]
    assert names == lab.names
    keys = lab.known_hosts.read_text().splitlines()
    assert len({line.split()[2] for line in keys}) == len(lab.names), "hosts share a host key"


def test_hosts_have_their_own_filesystems(lab):
    a, b = lab.names[:2]
    assert ssh(lab, a, "echo from-a > ~/marker && cat ~/marker").stdout.strip() == "from-a"
    assert ssh(lab, b, "test -e ~/marker").returncode == 1
    ssh(lab, a, "rm ~/marker")


def test_hosts_are_reached_as_a_cloud_images_user_with_passwordless_sudo_and_refuse_root(lab):
    """As on Debian's cloud images: tandem logs in as `debian` (uid 1000, its own home), whose sudo asks no
    password; sshd refuses root itself (PermitRootLogin no), not for want of a key: root's authorized_keys
    holds the lab's key, as cloud-init leaves it."""
    if lab.login_user == "root":
        pytest.skip("LAB_LOGIN_USER=root: the root-login shape")
    for name in lab.names:
        # the home and its key as the rootfs made them (the overlay's upper layer must not hide them)
        who = ssh(lab, name, "id -un; id -u; echo $HOME; stat -c %U ~; stat -c %U:%a ~/.ssh ~/.ssh/authorized_keys; "
                             "sudo -n id -un")
        assert who.stdout.split() == ["debian", "1000", "/home/debian", "debian", "debian:700", "debian:600",
                                      "root"], who
        assert ssh(lab, name, "id -un", sudo=True).stdout.strip() == "root"
        root = ssh(lab, name, "true", user="root")
        assert root.returncode == 255 and "Permission denied" in root.stderr, root
        assert "ROOT LOGIN REFUSED" in (lab.host_dir(name) / "console.log").read_text()


def test_hosts_have_no_route_off_this_machine(lab):
    for name in lab.names:
        route = ssh(lab, name, "ip route get 192.0.2.1")
        assert route.returncode != 0 and "unreachable" in route.stderr.lower()


def test_fabric_runs_on_every_host_in_parallel(lab):
    """Three rounds side by side, each host's start time and the whole round's; the medians decide, so one
    round a busy 2-core machine delayed does not."""
    hosts = load_hosts(lab.default_inventory)
    assert [h.name for h in hosts] == lab.names
    spreads, elapsed = [], []
    for _ in range(3):
        started = time.monotonic()
        results = run_all(hosts, "date +%s.%N; sleep 2; hostname")
        elapsed.append(time.monotonic() - started)
        assert all(hasattr(r, "stdout") for r in results.values()), results
        assert [results[h.name].stdout.split()[1] for h in hosts] == lab.names
        starts = [float(results[h.name].stdout.split()[0]) for h in hosts]
        spreads.append(max(starts) - min(starts))
    print("start spread per round " + ", ".join(f"{s:.2f}" for s in spreads) + " s; round "
          + ", ".join(f"{e:.1f}" for e in elapsed) + " s")
    assert statistics.median(spreads) < 1.5, f"hosts started their command one after another: {spreads}"
    assert statistics.median(elapsed) < 2 * len(hosts), f"{elapsed} s for {len(hosts)} x 2 s: not parallel"


def test_a_request_to_a_host_whose_network_vanished_fails_instead_of_waiting_forever(lab):
    """An open connection to v100b; its cables are pulled; the next command (no timeout of its
    own) fails once the kernel gives up on the unacknowledged request (DEAD_LINK_S): paramiko
    alone waits for exec's reply for ever, which held `fab train` following a run that lost v100b."""
    host = next(h for h in load_hosts(lab.default_inventory) if h.name == "v100b")
    outcome: list = []

    def request(conn):
        try:
            outcome.append(conn.run("true", hide=True, warn=True, in_stream=False))
        except Exception as err:
            outcome.append(err)

    with connect(host) as conn:
        assert conn.run("hostname", hide=True, in_stream=False).stdout.strip() == "v100b"
        set_links(lab, "v100b", "down")
        try:
            started = time.monotonic()
            caller = threading.Thread(target=request, args=(conn,), daemon=True)
            caller.start()
            caller.join(DEAD_LINK_S + 60)
            waited = time.monotonic() - started
        finally:
            set_links(lab, "v100b", "up")
    assert not caller.is_alive(), f"still waiting on v100b {waited:.0f} s after its network went"
    assert outcome and isinstance(outcome[0], Exception), outcome
    print(f"the request failed after {waited:.0f} s: {type(outcome[0]).__name__}: {outcome[0]}")


def test_lab_up_on_a_running_lab_changes_nothing(lab):
    pids = [lab_hosts.host_pid(lab, name) for name in lab.names]
    out = lab_cli("up", "--subnet", lab.subnet, "--cluster-net" if lab.cluster_net else "--no-cluster-net",
                  "--login-user", lab.login_user, prefix=lab.prefix).stdout
    assert "nothing changed" in out
    assert [lab_hosts.host_pid(lab, name) for name in lab.names] == pids


def iperf_mbps(cfg: LabConfig, server: str, client: str, seconds: int = 3) -> float:
    """Mbit/s received, iperf3 between the two hosts' network stacks."""
    srv = subprocess.Popen(["ip", "netns", "exec", cfg.netns(server), "iperf3", "-s", "-1"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        out = subprocess.run(
            ["ip", "netns", "exec", cfg.netns(client), "iperf3", "-c", cfg.peer_ip(server),
             "-t", str(seconds), "-J"], capture_output=True, text=True, timeout=60, check=True).stdout
        return json.loads(out)["end"]["sum_received"]["bits_per_second"] / 1e6
    finally:
        srv.kill()
        srv.wait()


@pytest.fixture
def capped(lab):
    def cap(rate: str) -> None:
        lab_cli("shape", rate, prefix=lab.prefix)

    try:
        yield cap
    finally:
        lab_cli("shape", "none", prefix=lab.prefix)


def test_a_100mbit_cap_reads_100mbit_on_iperf3_and_lifting_it_restores_the_link(lab, capped):
    a, b = lab.names[:2]
    capped("100mbit")
    assert "100Mbit" in lab_cli("status", prefix=lab.prefix).stdout
    slow = iperf_mbps(lab, b, a)
    assert 85 <= slow <= 105, f"{slow:.1f} Mbit/s under a 100mbit cap"
    capped("none")
    fast = iperf_mbps(lab, b, a)
    assert fast > 10 * slow, f"uncapped link only {fast:.0f} Mbit/s"


def test_lab_shape_rejects_a_rate_tc_would_not_understand(lab):
    proc = lab_cli("shape", "fast", prefix=lab.prefix, check=False)
    assert proc.returncode == 2 and "not a tc rate" in proc.stdout


def test_a_busy_subnet_is_refused_with_what_to_do(lab):
    proc = lab_cli("up", "--subnet", lab.subnet, prefix="tdmbusy", check=False)
    assert proc.returncode == 2
    assert f"subnet {lab.subnet} is already used" in proc.stdout and lab.bridge in proc.stdout
    assert "make lab-up SUBNET=" in proc.stdout


def test_make_lab_up_as_a_normal_user_says_it_needs_root():
    proc = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                           "make", "-s", "lab-up"], cwd=TOP, capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"})
    assert proc.returncode == 2 and "needs root" in proc.stderr and "sudo make lab-up" in proc.stderr


def leftovers(cfg: LabConfig) -> list[str]:
    """Anything of this lab still on the machine."""
    found = []
    found += [n for n in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
              .stdout.split() if n.startswith(cfg.prefix + "-")]
    links = json.loads(subprocess.run(["ip", "-j", "link"], capture_output=True, text=True).stdout)
    found += [link["ifname"] for link in links if link["ifname"].startswith(cfg.prefix + "-")]
    mounts = subprocess.run(["findmnt", "-rn", "-o", "TARGET"], capture_output=True, text=True).stdout
    found += [m for m in mounts.split() if m.startswith(str(cfg.state))]
    loops = subprocess.run(["losetup", "-l", "-n", "-O", "BACK-FILE"], capture_output=True, text=True)
    found += [f for f in loops.stdout.split() if f.startswith(str(cfg.state))]
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    found += [p for p in ps.splitlines() if str(cfg.state) in p]
    if cfg.state.exists():
        found.append(str(cfg.state))
    return found


@pytest.fixture
def spare_lab():
    """A second, short-lived lab beside the session's, on its own subnet."""
    cfg = LabConfig(hosts=3, prefix="tdmspare", subnet="10.79.0.0/24")
    try:
        yield cfg
    finally:
        lab_cli("down", prefix=cfg.prefix, check=False)


def test_three_hosts_and_lab_down_leaves_nothing_behind(spare_lab):
    cfg = spare_lab
    lab_cli("up", "--hosts", "3", "--subnet", cfg.subnet, "--slow-nic", "v100b", prefix=cfg.prefix)
    # The field reports' trap: a port that reports 100 Mb/s.
    assert "Speed: 100Mb/s" in subprocess.run(["ip", "netns", "exec", cfg.netns("v100b"), "ethtool", "eth1"],
                                              capture_output=True, text=True).stdout
    assert [ssh(cfg, name, "hostname").stdout.strip() for name in cfg.names] == ["v100a", "v100b", "v100c"]
    assert ssh(cfg, "v100a", f"ping -c1 -W2 {cfg.host_ip('v100c')} >/dev/null || "
                             f"bash -c 'echo > /dev/tcp/{cfg.host_ip('v100c')}/22'").returncode == 0
    lab_cli("shape", "10mbit", prefix=cfg.prefix)
    assert leftovers(cfg), "the lab should exist before lab-down"
    lab_cli("down", prefix=cfg.prefix)
    assert leftovers(cfg) == []


def test_lab_down_cleans_up_after_a_crash(spare_lab):
    cfg = spare_lab
    lab_cli("up", "--hosts", "3", "--subnet", cfg.subnet, prefix=cfg.prefix)
    # A host's launcher dies, as if the machine's OOM killer took it.
    subprocess.run(["kill", "-9", str(lab_hosts.host_pid(cfg, "v100b"))], check=True)
    assert lab_cli("status", prefix=cfg.prefix, check=False).returncode == 1
    lab_cli("down", prefix=cfg.prefix)
    assert leftovers(cfg) == []


def test_lab_up_recovers_from_a_half_finished_lab(spare_lab):
    cfg = spare_lab
    subprocess.run(["ip", "netns", "add", cfg.netns("v100a")], check=True)  # what a crash leaves
    lab_cli("up", "--hosts", "3", "--subnet", cfg.subnet, prefix=cfg.prefix)
    assert ssh(cfg, "v100a", "hostname").stdout.strip() == "v100a"
