"""The documented split of a rented VM's addresses: `ansible_host` (public, NAT'd) for SSH only,
`cluster_address` (private, the firewall's peer set) for everything host to host."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from dataclasses import replace

import pytest

from benchmarks import net
from train.agent.measure import iperf
from train.cluster import Host, load_hosts
from train.hosts.peercopy import cluster_address
from train.plan import link
from train.recipe.record import Run
from train.run import launch

INVENTORY = """
all:
  children:
    cluster:
      hosts:
        gpu1: {ansible_host: 203.0.113.10, cluster_address: 10.0.0.11, gpus: 1}
        gpu2: {ansible_host: 203.0.113.20, cluster_address: 10.0.0.12, gpus: 1}
        gpu3: {ansible_host: 203.0.113.30, gpus: 1}
"""


def _hosts(tmp_path):
    path = tmp_path / "hosts.yml"
    path.write_text(INVENTORY)
    return load_hosts(path)


def _flag(line: str, flag: str) -> str:
    words = shlex.split(line)
    return words[words.index(flag) + 1]


def test_ssh_goes_to_ansible_host_and_peers_to_the_cluster_address(tmp_path):
    hosts = _hosts(tmp_path)
    assert [(h.address, h.cluster_address) for h in hosts] == [
        ("203.0.113.10", "10.0.0.11"), ("203.0.113.20", "10.0.0.12"), ("203.0.113.30", "203.0.113.30")]
    assert [cluster_address(h) for h in hosts] == ["10.0.0.11", "10.0.0.12", "203.0.113.30"]


def test_the_rendezvous_and_the_all_reduce_meet_on_rank_0s_cluster_address(tmp_path):
    hosts = _hosts(tmp_path)[:2]
    run = Run(run_id="r1", hosts=[h.name for h in hosts], preset="tiny", overrides=[], dataset="synthetic")
    for line in launch.host_commands(run, hosts).values():
        assert _flag(line.split("setsid nohup ", 1)[1], "--master_addr") == "10.0.0.11"
    for line in net.allreduce_commands(hosts, "1M", 1, 0, 5, 29501, 60).values():
        assert _flag(line.split("setsid nohup ", 1)[1], "--master-addr") == "10.0.0.11"


def test_iperf3_measures_the_cluster_network(tmp_path):
    hosts = _hosts(tmp_path)
    by_name = {h.name: h for h in hosts}
    commands = link.client_commands([("gpu1", "gpu2"), ("gpu2", "gpu1")], by_name, 5201, 3, 1)
    assert _flag(commands["gpu1"], "--client") == "10.0.0.12"
    assert _flag(commands["gpu2"], "--client") == "10.0.0.11"
    assert "--parallel" not in commands["gpu1"]  # no expected speed: one stream


def test_a_fast_link_is_measured_with_parallel_streams(tmp_path):
    hosts = [replace(h, vars={**h.vars, "network_expected_mbps": 25000}) for h in _hosts(tmp_path)]
    commands = link.client_commands([("gpu1", "gpu2")], {h.name: h for h in hosts}, 5201, 3, 1)
    assert _flag(commands["gpu1"], "--parallel") == "5"


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("iperf3") or not shutil.which("runuser"),
                    reason="needs root (to become another user) and iperf3")
def test_the_benchmarks_iperf3_server_starts_as_a_cloud_images_user(tmp_path):
    """Fabric runs as the inventory's user (ubuntu, not root): its server's pid file must be one that
    user can write (/run is root's), or every `fab train` network check is skipped."""
    host = Host("gpu1", "127.0.0.1", user="nobody")
    pidfile = link.iperf_pidfile(host)
    start = iperf.server_command(5296, pidfile, "127.0.0.1")
    try:
        started = subprocess.run(["runuser", "-u", "nobody", "--", "sh", "-c", start], capture_output=True,
                                 text=True, timeout=30, cwd="/")
        assert started.returncode == 0, started.stderr
    finally:
        subprocess.run(["runuser", "-u", "nobody", "--", "sh", "-c", iperf.stop_command(pidfile)], cwd="/")
