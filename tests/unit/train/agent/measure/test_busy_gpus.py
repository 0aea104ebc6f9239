"""The host side of `fab evaluate`'s GPU choice: which runs train here, on which GPUs."""

from __future__ import annotations

import os
import sys

import pytest

from train.agent.measure import busy_gpus


@pytest.mark.parametrize(("env", "gpu"), [({"LOCAL_RANK": "1"}, 1),
                                          ({"LOCAL_RANK": "1", "CUDA_VISIBLE_DEVICES": "4,5"}, 5), ({}, None),
                                          ({"LOCAL_RANK": "0", "CUDA_VISIBLE_DEVICES": "GPU-uuid"}, None)])
def test_a_ranks_gpu_is_its_local_rank_through_the_visible_devices(env, gpu):
    assert busy_gpus.gpu_of(env) == gpu


def test_the_host_side_finds_a_runs_ranks_and_their_gpus(tmp_path, spawn):
    """Real processes standing in for two ranks of run-a (LOCAL_RANK 0 and 1) and none of run-b."""
    runs = tmp_path / "runs"
    (runs / "run-a").mkdir(parents=True)
    (runs / "run-b").mkdir()
    save_dir = str(runs / "run-a" / "checkpoints")
    procs = []
    for local in ("0", "1"):
        os.environ["LOCAL_RANK"] = local
        try:
            procs.append(spawn([sys.executable, "-c", "import time; time.sleep(60)", "--save-dir", save_dir]))
        finally:
            del os.environ["LOCAL_RANK"]
    assert busy_gpus.busy(str(runs)) == {"run-a": [0, 1]}
