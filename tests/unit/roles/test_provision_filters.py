"""The pure parts of provisioning: the roles' filters and the all_reduce arithmetic."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from train.agent.measure import iperf
from train.agent.measure.allreduce import Result, bus_factor, parse_size, table

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
    assert ("busbw 0.110 GB/s (880 Mb/s) = 0.94 x the measured link (940 Mb/s, iperf3's slowest pair); "
            "expected link 1000 Mb/s") in summary["table"]
    assert "min out(Mb/s)" in summary["table"] and "each host's slowest measured pair" in summary["table"]


def test_verify_compares_the_all_reduce_with_the_measured_link_and_says_the_expected_apart():
    fast = {**NETWORK, "pairs": [{"src": "a", "dst": "b", "mbps": 11720.0}, {"src": "b", "dst": "a", "mbps": 10035.0}]}
    summary = load("verify", "verify_summary").verify_summary(["a", "b"], {"a": host(), "b": host()}, fast,
                                                              {**ALLREDUCE, "results": [{"size": 64 * 2**20,
                                                                                         "time_ms": 168.0,
                                                                                         "busbw": 0.398}]}, 0.5)
    assert "= 0.32 x the measured link (10035 Mb/s, iperf3's slowest pair); expected link 1000 Mb/s" in \
        summary["table"]
    assert summary["problems"] == []  # checked against the slower of the two: gloo is CPU-bound here
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


def test_verify_shows_each_hosts_gpus_among_themselves_beside_the_cross_host_figure():
    """2 hosts x 2 GPUs: each host's INTRA line (train.agent.measure.allreduce) is read from its own output;
    a host whose GPUs cannot all-reduce among themselves is named."""
    intra = {"ok": True, "backend": "nccl", "world_size": 2,
             "results": [{"size": 64 * 2**20, "time_ms": 1.0, "busbw": 120.5}]}
    printed = {"a": {"__verify_allreduce": {"stdout_lines": ["INTRA " + json.dumps(intra), "# all_reduce ..."]}},
               "b": {"__verify_allreduce": {"stdout_lines": ['INTRA {"ok": false, "error": "exit 1: NCCL WARN"}']}}}
    filters = load("verify", "verify_summary")
    found = filters.intra_allreduce(["a", "b"], printed)
    assert found["a"]["results"][0]["busbw"] == 120.5 and found["b"]["ok"] is False
    gpu = host(gpus=2, found=["H100", "H100"])
    summary = filters.verify_summary(["a", "b"], {"a": gpu, "b": gpu}, NETWORK,
                                     {**ALLREDUCE, "backend": "nccl", "world_size": 4, "intra": found}, 0.5)
    assert "a: all_reduce nccl x2 within the host 64 MiB: busbw 120.500 GB/s" in summary["table"]
    assert "all_reduce nccl x4 across 2 hosts 64 MiB" in summary["table"]  # inter-host, every rank
    assert "busbw 0.110 GB/s (880 Mb/s)" in summary["table"]
    assert "b: all_reduce among its own ranks failed: exit 1: NCCL WARN" in summary["problems"]


def test_verify_runs_every_rank_of_every_host_one_per_gpu_cpu_ranks_on_cpu_hosts():
    """train.agent.measure.allreduce's --ranks-per-host, as train.cluster.Host.ranks counts them."""
    filters = load("verify", "verify_summary")
    hostvars = {"a": {"gpus": 0, "cpu_ranks": 2}, "b": {"gpus": "0", "cpu_ranks": "2"}, "c": {"gpus": 4},
                "d": {"gpus": 4, "cpu_ranks": 2}, "e": {}}
    assert filters.ranks_per_host(["a", "b", "c", "d", "e"], hostvars) == [2, 2, 4, 4, 1]
    inputs = filters.allreduce_inputs(["a", "e"], {"a": hostvars["a"], "e": {"gpus": 0}}, "x", {}, "64M")
    assert "cpu_ranks=2" in inputs["a"] and "cpu_ranks" not in inputs["e"]  # a change of ranks measures again


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
        "iperf3 --client 10.77.0.12 --port 5201 --time 5 --omit 1 --connect-timeout 5000 --json")
    assert net.iperf_server(5201, "/run/tandem-iperf3.pid", "10.77.0.11") == (
        iperf.server_command(5201, "/run/tandem-iperf3.pid", "10.77.0.11"))


def test_the_network_role_measures_a_fast_link_with_parallel_streams():
    """One TCP flow on a 25 Gb/s cloud NIC is capped below the link: the role sends several, as Fabric does."""
    net = load("network", "network_figures")
    streams = net.FilterModule().filters()["iperf_streams"]
    assert [streams("auto", mbps) for mbps in (1000, "1000", 25000, 100000)] == [1, 1, 5, 16]
    assert streams(8, 1000) == 8 and streams("2", 100000) == 2
    with pytest.raises(ValueError, match="network_iperf_streams is auto or a number"):
        streams("many", 1000)
    assert " --parallel 5 " in net.iperf_client("10.0.0.12", 5201, 3, streams("auto", 25000))
    inputs = net.measure_inputs([], {}, "q", 3, 5201, 5)
    assert inputs["iperf3"] == "seconds=3 port=5201 streams=5"  # figures taken with 1 stream are not reused


def test_train_env_names_the_host_whose_versions_differ():
    venv = {"python": "3.11.2", "torch": "2.13.0+cpu", "cuda": None, "fairseq": "0.12.3.1", "numpy": "2.4.6",
            "cuda_available": False, "cuda_devices": 0}
    hostvars = {"a": {"train_env_versions": venv}, "b": {"train_env_versions": {**venv, "numpy": "2.4.5",
                                                                                 "cuda_devices": 1}}}
    differ = load("train_env", "train_env_versions").versions_differ
    assert differ(["a", "b"], hostvars, "train_env_versions") == ["b: numpy 2.4.5 but a has 2.4.6"]
    assert differ(["a"], hostvars, "train_env_versions") == []


def test_pip_output_says_which_drifted_packages_were_restored():
    versions = load("train_env", "train_env_versions")
    stdout = """Requirement already satisfied: torch==2.13.0 in /opt/tandem/venv/lib/python3.11/site-packages
Collecting sacrebleu==2.6.0
  Attempting uninstall: numpy
    Found existing installation: numpy 2.3.1
    Uninstalling numpy-2.3.1:
      Successfully uninstalled numpy-2.3.1
  Attempting uninstall: sacrebleu
    Found existing installation: sacrebleu 2.5.0
Successfully installed numpy-2.4.6 sacrebleu-2.6.0
"""
    assert versions.pip_restored(stdout) == ["numpy 2.3.1 -> 2.4.6", "sacrebleu 2.5.0 -> 2.6.0"]
    assert versions.pip_restored("Successfully installed tqdm-4.70.1\n") == ["tqdm 4.70.1 (was missing)"]
    assert versions.pip_restored("Successfully installed numpy-2.4.6 torch-2.13.0+cpu\n", True) == []  # new venv
    assert versions.pip_restored("Requirement already satisfied: numpy==2.4.6\n") == []


INPUTS = {"v100a": "address=10.0.0.11 nic=eth0 mtu=1500 speed=10000 shaping=qdisc noqueue 0: root",
          "v100b": "address=10.0.0.12 nic=eth0 mtu=1500 speed=10000 shaping=qdisc noqueue 0: root",
          "iperf3": "seconds=3 port=5201"}
CACHED = {"inputs": INPUTS, "measured_at": "2026-11-23T02:00:00Z", "threshold_mbps": 900,
          "pairs": [{"src": "v100a", "dst": "v100b", "mbps": 9000, "error": ""}]}


def test_network_figures_are_reused_only_while_nothing_they_depend_on_changed():
    net = load("network", "network_figures")
    assert net.measure_reason(CACHED, INPUTS, "auto", 24, "2026-11-23T03:00:00") == ""
    assert net.measure_reason(CACHED, INPUTS, "always", 24, "2026-11-23T03:00:00") == \
        "asked to (network_measure=always)"
    shaped = {**INPUTS, "v100b": INPUTS["v100b"].replace("noqueue 0: root", "tbf 8001: root rate 100Mbit")}
    assert net.measure_reason(CACHED, shaped, "auto", 24, "2026-11-23T03:00:00") == \
        "what they depend on changed: v100b"
    assert net.measure_reason({**CACHED, "threshold_mbps": 9500}, INPUTS, "auto", 24, "2026-11-23T03:00:00") == \
        "the figures before did not pass"
    assert "26 h old" in net.measure_reason(CACHED, INPUTS, "auto", 24, "2026-11-24T04:00:00")
    assert net.measure_reason({}, INPUTS, "auto", 24, "2026-11-23T03:00:00") == "no figures measured before"


@pytest.mark.parametrize("value, mode", [(True, "auto"), ("auto", "auto"), ("always", "always"), (False, "never"),
                                         ("never", "never"), ("false", "never")])
def test_network_measure_modes(value, mode):
    assert load("network", "network_figures").FilterModule().filters()["measure_mode"](value) == mode


def test_a_gpu_shortfall_says_which_case_it_is_and_what_to_do():
    advice = load("nvidia_driver", "nvidia_driver_advice").gpu_shortfall
    missing = advice("v100a", 2, 0, 2, "[Errno 2] No such file or directory: b'nvidia-smi'", 2)
    assert missing.startswith("v100a: expected 2 GPUs, nvidia-smi shows 0: nvidia-smi is not installed (no driver)")
    assert "ansible-playbook provision.yml --tags nvidia_driver" in missing
    failing = advice("v100a", 1, 0, 9, "NVIDIA-SMI has failed because it couldn't communicate with the driver", 1,
                     "enabled")
    assert "nvidia-smi fails (NVIDIA-SMI has failed" in failing and "reboot after a driver install" in failing
    assert "Secure Boot is enabled" in failing
    unattached = advice("v100a", 2, 1, 0, "", 1)
    assert "the VM has fewer GPUs attached than promised; check the instance type" in unattached
    fallen = advice("v100a", 2, 1, 0, "", 2)
    assert "a GPU is not usable" in fallen and "xid" in fallen


def test_the_network_role_gives_nccl_the_sockets_iperf3_needed_streams_for():
    """A 100 Gb/s link is measured with 16 iperf3 streams: NCCL gets 2 threads x 8 sockets; 1 Gb/s, one
    stream: nothing, NCCL's defaults; network_nccl_sockets overrides, and a value NCCL refuses is named."""
    lines = load("network", "network_figures").FilterModule().filters()["nccl_socket_lines"]
    assert lines("auto", 16)[1:] == ["NCCL_SOCKET_NTHREADS=2", "NCCL_NSOCKS_PERTHREAD=8"]
    assert lines("auto", "1") == []
    assert lines("4x4", 1)[1:] == ["NCCL_SOCKET_NTHREADS=4", "NCCL_NSOCKS_PERTHREAD=4"]
    with pytest.raises(ValueError, match="threads x sockets per thread at most 64"):
        lines("16x8", 16)


def test_the_network_role_writes_nccls_sockets_to_the_environment_file_once(tmp_path):
    """The role's env tasks as provisioning runs them (here on localhost, into a file of the test's own):
    a 100 Gb/s host's /etc/tandem/env, a rerun changing nothing, and a bad override refused by name."""
    play = tmp_path / "play.yml"
    play.write_text(f"""
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - ansible.builtin.include_role: {{name: network, tasks_from: env}}
      vars: {{network_env_file: "{tmp_path}/env", network_cluster_nic: eth1, preflight_address: 10.0.0.1}}
""")

    def provision(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", str(play),
                               "-e", f"ansible_python_interpreter={sys.executable}", *extra],
                              cwd=ROLES.parent, capture_output=True, text=True, timeout=300)

    first, again = provision("-e", "network_expected_mbps=100000"), provision("-e", "network_expected_mbps=100000")
    assert first.returncode == 0 and "changed=0" not in first.stdout, first.stdout[-2000:]
    assert again.returncode == 0 and "changed=0" in again.stdout, again.stdout[-2000:]
    assert (tmp_path / "env").read_text().splitlines()[1:-1] == [
        "NCCL_SOCKET_IFNAME=eth1", "GLOO_SOCKET_IFNAME=eth1", "TANDEM_CLUSTER_NIC=eth1",
        "TANDEM_CLUSTER_ADDRESS=10.0.0.1",
        "# NCCL's TCP sockets per connection: 2x8 (16), from the 16 parallel iperf3 streams that measured the link",
        "NCCL_SOCKET_NTHREADS=2", "NCCL_NSOCKS_PERTHREAD=8"]
    refused = provision("-e", "network_nccl_sockets=5x16")
    assert refused.returncode != 0 and "NCCL sockets 5x16: threads 1 to 16" in refused.stdout + refused.stderr
