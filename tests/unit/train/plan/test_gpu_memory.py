"""`fab predict` sizes the batch to the smallest GPU: a host whose nvidia-smi is missing or fails is
named with its cause, not left out (the other hosts' larger GPUs would size a batch it cannot hold)."""

from __future__ import annotations

import pytest

from train.cluster import ClusterError, GroupResult, Host, HostResult
from train.plan.predict import gpu_memory_of

HOSTS = [Host("g0", "203.0.113.10", gpus=8), Host("g1", "203.0.113.11", gpus=8)]


def answers(g1: HostResult) -> GroupResult:
    return GroupResult({"g0": HostResult("g0", stdout="81559\n" * 8, exited=0), "g1": g1})


def test_every_host_answering_gives_each_its_smallest_gpu():
    mixed = HostResult("g1", stdout="81559\n16160\n", exited=0)
    assert gpu_memory_of(answers(mixed), HOSTS) == pytest.approx({"g0": 81559 / 1024, "g1": 16160 / 1024})


@pytest.mark.parametrize(("g1", "cause"), [
    (HostResult("g1", stderr="bash: line 1: nvidia-smi: command not found\n", exited=127), "command not found"),
    (HostResult("g1", stdout="NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n",
                exited=9), "couldn't communicate"),
    (HostResult("g1", stdout="No devices were found\n", exited=0), "no memory in its answer"),
])
def test_a_host_without_an_answer_is_named_with_its_cause(g1, cause):
    with pytest.raises(ClusterError) as err:
        gpu_memory_of(answers(g1), HOSTS)
    assert "g1 (203.0.113.11): nvidia-smi:" in str(err.value) and cause in str(err.value)
    assert "g0" not in str(err.value)
