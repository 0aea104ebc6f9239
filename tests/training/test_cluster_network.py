"""The cloud VM's shape (the default lab; `LAB_CLUSTER_NET=0` skips this): SSH on eth0's management
address, the cluster on a private network whose NIC is ens5. Training, iperf3 and the all_reduce
cross ens5 (its counters show the bytes), the firewall drops rendezvous traffic from the management
network, and without cluster_nic in the inventory the NIC provisioning detected reaches NCCL/gloo
and the monitor."""

from __future__ import annotations

import json
import re
import subprocess
import time

import pytest
import yaml
from labtools import fab, ssh

from benchmarks import net
from train.cluster import load_hosts
from train.plan import link

RUNS = "/data/tandem/runs"


@pytest.fixture(scope="module")
def cloud(provisioned):
    if not provisioned.cfg.cluster_net:
        pytest.skip("needs the two-network lab (the default; LAB_CLUSTER_NET=0 was set)")
    return provisioned


def tx_bytes(cfg, name: str) -> dict[str, int]:
    out = ssh(cfg, name, "for n in eth0 ens5; do echo $n $(cat /sys/class/net/$n/statistics/tx_bytes); done").stdout
    return {nic: int(count) for nic, count in (line.split() for line in out.splitlines())}


def test_provisioning_found_and_measured_the_cluster_nic(cloud):
    figures = json.loads((cloud.reports / "network.json").read_text())
    assert {h["nic"] for h in figures["hosts"].values()} == {"ens5"}
    assert {h["address"] for h in figures["hosts"].values()} == {cloud.cfg.cluster_ip(n) for n in cloud.cfg.names}
    assert all(p["mbps"] > 0 and not p["error"] for p in figures["pairs"])
    env = ssh(cloud.cfg, "v100a", "cat /etc/tandem/env").stdout
    assert "NCCL_SOCKET_IFNAME=ens5" in env and f"TANDEM_CLUSTER_ADDRESS={cloud.cfg.cluster_ip('v100a')}" in env


def test_iperf3_crosses_the_cluster_nic_not_the_management_one(cloud):
    hosts = load_hosts(cloud.inventory)
    before = tx_bytes(cloud.cfg, "v100a")
    pairs, _ = link.iperf(hosts, "ring", seconds=2, omit=0)
    after = tx_bytes(cloud.cfg, "v100a")
    assert all(p.mbps and not p.error for p in pairs), pairs
    sent = {nic: after[nic] - before[nic] for nic in after}
    assert sent["ens5"] > 50 * 2**20 and sent["eth0"] < 5 * 2**20, sent  # eth0: SSH alone


def test_bench_nets_all_reduce_crosses_the_cluster_nic(cloud):
    hosts = load_hosts(cloud.inventory)
    before = tx_bytes(cloud.cfg, "v100a")
    report = net.run_allreduce(hosts, "16M", iters=3, warmup=1, budget_s=30, timeout=120)
    after = tx_bytes(cloud.cfg, "v100a")
    assert report.get("ok", True) and report.get("results"), report
    sent = {nic: after[nic] - before[nic] for nic in after}
    assert sent["ens5"] > 4 * 16 * 2**20 * 0.5 and sent["eth0"] < 5 * 2**20, sent


def test_a_capped_cluster_nic_slows_the_cluster_while_ssh_stays_fast(cloud):
    """lab-shape caps ens5: iperf3 between the hosts drops to the cap, 20 MB over SSH (eth0) does not
    take the 8 s the cap would make it."""
    hosts = load_hosts(cloud.inventory)
    cloud.shape("20mbit")
    try:
        pairs, _ = link.iperf(hosts, "ring", seconds=2, omit=0)
        started = time.monotonic()
        upload = subprocess.run(
            ["ssh", "-i", str(cloud.cfg.key), "-o", f"UserKnownHostsFile={cloud.cfg.known_hosts}", "-o",
             "BatchMode=yes", f"{cloud.cfg.login_user}@{cloud.cfg.host_ip('v100a')}", "wc -c"],
            input=b"\0" * 20_000_000, capture_output=True, timeout=60)
        ssh_s = time.monotonic() - started
    finally:
        cloud.shape("none")
    assert all(p.mbps and p.mbps < 25 for p in pairs), pairs
    assert upload.stdout.split() == [b"20000000"] and ssh_s < 4, (upload, ssh_s)


def test_the_firewall_drops_rendezvous_from_the_management_network(cloud):
    """v100a listens on the rendezvous port; v100b reaches it on its cluster address only."""
    cfg = cloud.cfg
    listen = ("timeout 20 python3 -c 'import socket,time; s=socket.socket(); "
              "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((\"\", 29500)); s.listen(); "
              "time.sleep(20)' >/dev/null 2>&1 &")
    ssh(cfg, "v100a", listen)
    try:
        def connects(address: str) -> bool:
            probe = f"timeout 3 bash -c 'echo > /dev/tcp/{address}/29500' && echo yes || echo no"
            return ssh(cfg, "v100b", probe).stdout.strip() == "yes"

        assert connects(cfg.cluster_ip("v100a"))
        assert not connects(cfg.host_ip("v100a"))  # the management address: dropped, as a public IP's would be
    finally:
        ssh(cfg, "v100a", "pkill -f 'bind\\(\\(\"\", 29500\\)\\)' || true")


def test_training_without_cluster_nic_runs_over_the_nic_provisioning_detected(cloud, tmp_path):
    """The inventory names no cluster_nic (an ens5 VM relying on detection): ranks and monitor take
    ens5 from /etc/tandem/env, and the gradients cross it."""
    data = yaml.safe_load(cloud.inventory.read_text())
    for host in data["all"]["children"]["cluster"]["hosts"].values():
        host.pop("cluster_nic", None)
    inventory = tmp_path / "no-cluster-nic.yml"
    inventory.write_text(yaml.safe_dump(data))
    detected = type(cloud)(cfg=cloud.cfg, inventory=inventory, reports=cloud.reports)

    fab(detected, "prepare-data")
    before = tx_bytes(cloud.cfg, "v100a")
    out = fab(detected, "train", "--new", "--accept-slow-network", "--set", "max_update=20").stdout
    after = tx_bytes(cloud.cfg, "v100a")
    run_id = re.search(r"run-\d{8}-\d{6}", out).group(0)
    assert "20/20" in out, out[-2000:]
    sent = {nic: after[nic] - before[nic] for nic in after}
    assert sent["ens5"] > 5 * 2**20, sent  # 20 all_reduces of the tiny model's gradients
    samples = ssh(cloud.cfg, "v100b", f"cat {RUNS}/{run_id}/samples.jsonl").stdout.splitlines()
    assert samples and {json.loads(s)["nic"] for s in samples} == {"ens5"}
    assert max(json.loads(s)["rx_Bps"] or 0 for s in samples) > 0


def test_train_stops_in_preflight_when_a_host_cannot_reach_the_cluster_network(cloud):
    """SSH fine, v100b's cluster NIC down: named with the address, nothing started (before, the
    iperf3 check was skipped and every rank hung at the rendezvous)."""
    cfg = cloud.cfg
    subprocess.run(["ip", "netns", "exec", cfg.netns("v100b"), "ip", "link", "set", "ens5", "down"], check=True)
    try:
        proc = fab(cloud, "train", "--new", "--accept-slow-network", "--set", "max_update=20", check=False,
                   timeout=120)
    finally:
        subprocess.run(["ip", "netns", "exec", cfg.netns("v100b"), "ip", "link", "set", "ens5", "up"], check=True)
    said = proc.stdout + proc.stderr
    assert proc.returncode != 0, said[-2000:]
    assert f"v100b cannot reach v100a at {cfg.cluster_ip('v100a')}" in said, said[-2000:]
    assert "started on" not in said
    assert not ssh(cfg, "v100a", "pgrep -af '[f]airseq_train' || true").stdout.strip()
