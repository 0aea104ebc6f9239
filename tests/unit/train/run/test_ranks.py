"""Several ranks per host: how many a host runs (train.cluster.Host.ranks, the one place that says it),
where each rank runs, the refusal of hosts that differ, the effective batch `fab train` says, and
every figure that counts ranks (fairseq's world size, the cost model's n)."""

from __future__ import annotations

import shlex

import pytest

from train.cluster import ClusterError, Host, placement, rank_layout, ranks_label, world_size
from train.plan import model, predict
from train.recipe import record
from train.run import command, launch, preflight


def cpu(name: str, ranks: object = None, **extra) -> Host:
    v = {"network_expected_mbps": 1000, **extra}
    if ranks is not None:
        v["cpu_ranks"] = ranks
    return Host(name, f"10.0.0.{11 + ord(name[-1]) - ord('a')}", vars=v)


def gpu(name: str, gpus: int, **extra) -> Host:
    return Host(name, f"10.0.0.{11 + ord(name[-1]) - ord('a')}", gpus=gpus, vars=dict(extra))


def test_a_gpu_host_runs_one_rank_per_gpu_and_ignores_cpu_ranks():
    assert gpu("v100a", 2).ranks == 2 and gpu("v100a", 8, cpu_ranks=2).ranks == 8


def test_a_cpu_host_runs_cpu_ranks_default_one():
    assert cpu("v100a").ranks == 1 and cpu("v100a", 2).ranks == 2 and cpu("v100a", "3").ranks == 3


@pytest.mark.parametrize("value", [0, "two", -1, True, 1.5])
def test_a_bad_cpu_ranks_names_the_host_and_the_value(value):
    with pytest.raises(ClusterError, match=f"v100b: cpu_ranks must be a whole number .* gives {value!r}"):
        cpu("v100b", value).ranks  # noqa: B018


def test_ranks_are_numbered_host_by_host_rank_0s_host_first():
    assert rank_layout([2, 2]) == [range(0, 2), range(2, 4)]
    assert [ranks_label(r) for r in rank_layout([1, 1, 1])] == ["0", "1", "2"]
    assert [ranks_label(r) for r in rank_layout([8, 8])] == ["0-7", "8-15"]
    assert placement([cpu("v100a", 2), cpu("v100b", 2)]) == "v100a 0-1, v100b 2-3"
    assert world_size([cpu("v100a", 2), cpu("v100b", 2)]) == 4 and world_size([gpu("a", 8), gpu("b", 8)]) == 16


def _argv(hosts: list[Host], i: int) -> list[str]:
    run = record.Run(run_id="r1", hosts=[h.name for h in hosts], preset="tiny", overrides=[], dataset="synthetic")
    return shlex.split(launch.host_commands(run, hosts)[hosts[i].name])


def test_two_cpu_hosts_of_two_ranks_start_torchrun_with_two_workers_in_a_world_of_four():
    hosts = [cpu("v100a", 2), cpu("v100b", 2)]
    argv = _argv(hosts, 1)
    assert argv[argv.index("--nproc_per_node") + 1] == "2" and argv[argv.index("--node_rank") + 1] == "1"
    inner = argv[argv.index("-c") + 1]  # each worker passes the global rank torchrun gave it
    assert inner.endswith('--distributed-rank "$RANK" --device-id "$LOCAL_RANK"')
    assert "--distributed-world-size 4" in inner and "--cpu" in inner and "gloo" in inner
    assert "--distributed-rank 1" not in inner


def test_one_rank_a_host_keeps_its_command():
    argv = _argv([cpu("v100a"), cpu("v100b")], 1)
    assert argv[argv.index("--nproc_per_node") + 1] == "1" and argv[argv.index("--distributed-rank") + 1] == "1"
    assert "--no-python" not in argv and argv[argv.index("--distributed-world-size") + 1] == "2"


def test_launches_refuse_cpu_hosts_of_different_ranks():
    hosts = [{"address": "a", "gpus": 0, "ranks": 2}, {"address": "b", "gpus": 0, "ranks": 1}]
    with pytest.raises(ValueError, match="different numbers of ranks"):
        command.launches("r", hosts, master_port=29500, data_dir="/d", run_dir="/r", venv="/v")


# ---- the refusal: hosts must run as many ranks, on the same kind of device ----

def test_a_host_showing_one_of_its_two_gpus_is_refused_naming_it_its_gpus_and_what_to_do():
    """The field report: a VM showed 1 of its 2 GPUs, the user set gpus: 1 there and ran 1 + 2."""
    [problem] = preflight.layout_problems([gpu("v100a", 1), gpu("v100b", 2)])
    assert problem.startswith("v100a: 1 GPU (1 rank), while v100b has 2 GPUs (2 ranks): torchrun starts the same "
                              "number of ranks on every host"), problem
    assert "make v100a show all its GPUs to nvidia-smi" in problem and "--hosts v100b" in problem
    assert "gpus: 1 on every host" in problem


def test_the_odd_host_out_is_the_one_named():
    [problem] = preflight.layout_problems([gpu("v100a", 2), gpu("v100b", 4), gpu("v100c", 2)])
    assert problem.startswith("v100b: 4 GPUs (4 ranks), while v100a, v100c have 2 GPUs (2 ranks)")
    assert "set gpus: 2 on v100b" in problem


def test_cpu_hosts_with_different_cpu_ranks_and_a_cpu_host_among_gpu_hosts_are_refused():
    [problem] = preflight.layout_problems([cpu("v100a", 2), cpu("v100b")])
    assert problem.startswith("v100b: a CPU host with 1 rank (cpu_ranks), while v100a has a CPU host with 2 ranks")
    assert "set the same cpu_ranks on every host (cpu_ranks: 2" in problem
    [mixed] = preflight.layout_problems([gpu("v100a", 2), gpu("v100b", 2), cpu("v100c", 2)])
    assert mixed.startswith("v100c: a CPU host with 2 ranks") and "--hosts v100a,v100b" in mixed


def test_equal_hosts_pass_and_a_rejoin_measures_against_the_current_rank_0():
    assert preflight.layout_problems([cpu("v100a", 2), cpu("v100b", 2)]) == []
    assert preflight.layout_problems([gpu("v100a", 8)]) == []
    # rank 0 runs 1 rank a host; a joiner with 2 is the one named, though a tie would name rank 0
    [problem] = preflight.layout_problems([cpu("v100a"), cpu("v100c", 2)], reference="v100a")
    assert problem.startswith("v100c: ")


def test_the_preflight_check_says_it_before_anything_starts():
    hosts = [gpu("v100a", 1), gpu("v100b", 2)]
    run = record.Run(run_id="r1", hosts=["v100a", "v100b"], preset="tiny", overrides=[], dataset="synthetic")
    answer = {"agent": "x", "cuda_devices": 1, "data": "abc", "free_gb": 100, "port_free": True}
    problems = preflight.check(run, hosts, {"v100a": answer, "v100b": {**answer, "cuda_devices": 2}},
                               pins_wanted={}, agent="x")
    assert problems and problems[0].startswith("v100a: 1 GPU (1 rank), while v100b has 2 GPUs"), problems


# ---- the effective batch ----

def test_the_batch_line_multiplies_tokens_update_freq_and_every_rank():
    assert command.batch_line(2, 2, 4096, 1) == ("batch 2 hosts x 2 ranks x 4,096 tokens x update-freq 1 = "
                                                 "16,384 tokens per update")
    assert command.batch_line(1, 2, 2048, 2) == ("batch 1 host x 2 ranks x 2,048 tokens x update-freq 2 = "
                                                 "8,192 tokens per update")  # what elastic keeps
    assert command.batch_line(2, 1, None, 1, batch_size=32).endswith("= 64 sentences per update")
    assert command.tokens_per_update(2048, 1, 4) == 8192


# ---- the cost model counts every rank ----

def test_the_network_check_counts_every_rank_of_every_host():
    params = 10_000_000
    v = predict.assess([cpu("v100a", 2), cpu("v100b", 2)], params, link_mbps=100.0, link_source="given",
                       compute_s=0.6, compute_source="given")
    assert v.ranks == 4 and v.prediction.ranks == 4 and v.prediction.hosts == 2
    # a ring over ranks numbered host by host: each NIC carries 2(n-1)/n x S, n = 4
    assert v.prediction.comm_s == pytest.approx(1.5 * params * 4 / model.mbit_to_bytes_per_s(100.0))
    one = predict.assess([cpu("v100a"), cpu("v100b")], params, link_mbps=100.0, link_source="given",
                         compute_s=0.6, compute_source="given")
    assert one.ranks == 2 and v.prediction.comm_s == pytest.approx(1.5 * one.prediction.comm_s)


def test_a_host_whose_gpus_nvml_cannot_read_is_refused_naming_it_and_the_error():
    """Its GPUs' memory unknown, the batch would be sized by the other hosts' GPUs alone."""
    hosts = [gpu("v100a", 2), gpu("v100b", 2)]
    run = record.Run(run_id="r1", hosts=["v100a", "v100b"], preset="tiny", overrides=[], dataset="synthetic",
                     precision="fp16")
    answer = {"agent": "x", "cuda_devices": 2, "data": "abc", "free_gb": 100, "port_free": True,
              "gpus": [{"name": "Tesla V100-SXM2-16GB", "memory_mib": 16160}] * 2}
    broken = {**answer, "gpu_error": "NVMLError_DriverNotLoaded('Driver Not Loaded')"}
    del broken["gpus"]
    problems = preflight.check(run, hosts, {"v100a": answer, "v100b": broken}, pins_wanted={}, agent="x")
    assert problems == ["v100b: NVML could not read its GPUs (NVMLError_DriverNotLoaded('Driver Not Loaded')): "
                        "check the driver (`nvidia-smi` there); re-run provision.yml --tags nvidia_driver"], problems
