"""The pure parts of provisioning: the roles' filters and the all_reduce arithmetic."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from train.agent.allreduce import Result, bus_factor, parse_size, table

ROLES = Path(__file__).resolve().parents[3] / "roles"


def load(role: str, name: str):
    spec = importlib.util.spec_from_file_location(name, ROLES / role / "filter_plugins" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def iperf_result(src, dst, bps, retransmits=0, rc=0, error=None):
    data = {"end": {"sum_received": {"bits_per_second": bps}, "sum_sent": {"retransmits": retransmits}}}
    if error:
        data = {"error": error}
    return {"item": [src, dst], "rc": rc, "stdout": json.dumps(data), "stderr": ""}


def test_ordered_pairs_are_every_pair_both_ways():
    net = load("network", "network_figures")
    assert net.ordered_pairs(["a", "b", "c"]) == [["a", "b"], ["a", "c"], ["b", "a"], ["b", "c"],
                                                   ["c", "a"], ["c", "b"]]
    assert net.ordered_pairs(["a"]) == []


def test_iperf_pairs_in_mbps_with_errors():
    net = load("network", "network_figures")
    pairs = net.iperf_pairs([iperf_result("a", "b", 95_600_000, 12),
                             iperf_result("b", "a", 0, rc=1, error="unable to connect to server")])
    assert pairs[0] == {"src": "a", "dst": "b", "mbps": 95.6, "retransmits": 12, "error": ""}
    assert pairs[1]["mbps"] == 0 and pairs[1]["error"] == "unable to connect to server"


def host(gpus=0, found=(), venv=None, data=True, free=4.0):
    return {"verify_host": {
        "gpus_promised": gpus, "gpus": list(found), "driver": "", "free_gb": free, "min_free_gb": 1,
        "venv": venv if venv is not None else {"python": "3.11.2", "torch": "2.13.0+cpu", "cuda": None,
                                               "cuda_available": False, "fairseq": "0.12.3.1"},
        "data": {"source": "/dev/loop0", "fstype": "ext4", "options": "rw,noatime"} if data else {},
        "data_expected": True}}


NETWORK = {"expected_mbps": 1000, "threshold_mbps": 900,
           "hosts": {"a": {"nic": "eth0", "speed_mbps": 10000}, "b": {"nic": "eth0", "speed_mbps": 10000}},
           "pairs": [{"src": "a", "dst": "b", "mbps": 950.0}, {"src": "b", "dst": "a", "mbps": 940.0}]}
ALLREDUCE = {"ok": True, "backend": "gloo", "world_size": 2,
             "results": [{"size": 64 * 2**20, "time_ms": 600.0, "busbw": 0.11}]}


def test_verify_summary_of_a_healthy_cluster():
    summary = load("verify", "verify_summary").verify_summary(
        ["a", "b"], {"a": host(), "b": host()}, NETWORK, ALLREDUCE, 0.5)
    assert summary["problems"] == []
    assert summary["link_mbps"] == 940.0
    assert "busbw 0.110 GB/s (880 Mb/s) = 0.94 x the link (940 Mb/s)" in summary["table"]
    assert summary["table"].splitlines()[0].split()[:3] == ["host", "GPUs", "driver"]


def test_verify_summary_names_every_problem():
    slow = {**NETWORK, "pairs": [{"src": "a", "dst": "b", "mbps": 95.0}, {"src": "b", "dst": "a", "mbps": 96.0}]}
    other = host(gpus=2, found=["Tesla V100"], data=False, free=0.5,
                 venv={"python": "3.11.2", "torch": "2.12.0", "cuda": None, "cuda_available": False,
                       "fairseq": "0.12.3.1"})
    problems = load("verify", "verify_summary").verify_summary(
        ["a", "b"], {"a": host(), "b": other}, slow, {**ALLREDUCE, "ok": False, "error": "timeout"}, 0.5)["problems"]
    text = "\n".join(problems)
    assert "b: expected 2 GPUs, nvidia-smi shows 1" in text
    assert "b: torch 2.12.0 does not see CUDA" in text
    assert "b: nothing is mounted at /data" in text
    assert "a -> b: measured 95.0 Mb/s, below the threshold of 900 Mb/s" in text
    assert "versions differ across hosts" in text
    assert "all_reduce failed: timeout" in text


@pytest.mark.parametrize(("text", "size"), [("64M", 64 * 2**20), ("1G", 2**30), ("512K", 512 * 1024),
                                            ("1000", 1000), ("1.5M", int(1.5 * 2**20))])
def test_parse_size(text, size):
    assert parse_size(text) == size


def test_bus_factor_is_nccl_tests():
    assert bus_factor(1) == 0 and bus_factor(2) == 1 and bus_factor(4) == 1.5


def test_table_has_nccl_tests_columns():
    out = table([Result(size=1024, count=256, type="float", time_ms=1.0, algbw=0.001, busbw=0.001, correct=True)])
    assert out.splitlines()[0].split() == ["size(B)", "count", "type", "time(ms)", "algbw(GB/s)", "busbw(GB/s)"]


def test_the_network_role_runs_the_benchmarks_iperf3_lines():
    net = load("network", "network_figures")
    assert net.iperf_client("10.77.0.12", "5201", "5") == (
        "iperf3 --client 10.77.0.12 --port 5201 --time 5 --omit 1 --json")
    assert net.iperf_server(5201, "/run/tandem-iperf3.pid", "10.77.0.11") == (
        "iperf3 --server --daemon --port 5201 --bind 10.77.0.11 --pidfile /run/tandem-iperf3.pid")


def test_train_env_names_the_host_whose_versions_differ():
    venv = {"python": "3.11.2", "torch": "2.13.0+cpu", "cuda": None, "fairseq": "0.12.3.1", "numpy": "2.4.6",
            "cuda_available": False, "cuda_devices": 0}
    hostvars = {"a": {"train_env_versions": venv}, "b": {"train_env_versions": {**venv, "numpy": "2.4.5",
                                                                                 "cuda_devices": 1}}}
    differ = load("train_env", "train_env_versions").versions_differ
    assert differ(["a", "b"], hostvars, "train_env_versions") == ["b: numpy 2.4.5 but a has 2.4.6"]
    assert differ(["a"], hostvars, "train_env_versions") == []
