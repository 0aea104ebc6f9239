"""`fab evaluate` never shares a GPU with a training run: it takes a free one, or refuses naming
which run holds which GPU (a CPU host: a running run is refused)."""

from __future__ import annotations

import pytest

from train.cluster import ClusterError
from train.run import gpu_choice


def test_a_free_gpu_is_taken_beside_a_run_on_the_others():
    assert gpu_choice.choose("v100a", 8, {"run-a": [0, 1, 2, 3]}) == 4
    assert gpu_choice.choose("v100a", 2, {}) == 0


def test_every_gpu_training_is_refused_naming_the_runs():
    with pytest.raises(ClusterError, match=r"^v100a: every GPU \(2\) is training: runs run-a \(GPU 0\), run-b "
                                           r"\(GPU 1\) are; wait for it"):
        gpu_choice.choose("v100a", 2, {"run-a": [0], "run-b": [1]})


def test_a_cpu_host_with_a_run_training_is_refused():
    with pytest.raises(ClusterError, match=r"^v100a: run run-a is training there \(CPU host\)"):
        gpu_choice.choose("v100a", 0, {"run-a": [0]})  # a CPU rank's LOCAL_RANK names no GPU
    assert gpu_choice.choose("v100a", 0, {}) is None
