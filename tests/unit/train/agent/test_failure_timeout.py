"""A rank whose peer is gone ends with the run's heartbeat, not NCCL's 10 minutes."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

from train.run import command, presets

WAIT_FOR_A_PEER = """
import torch.distributed as dist
from train.agent import fairseq_train
fairseq_train.process_group_timeout()
dist.init_process_group(backend="gloo", init_method="tcp://127.0.0.1:{port}", world_size=2, rank=0)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_rank_whose_peer_never_comes_gives_up_after_the_runs_timeout():
    """torch itself, through the entry point's patch: rank 0 of 2 waits for rank 1, which never
    starts; with TANDEM_PG_TIMEOUT_S=3 it fails in seconds (unpatched: torch's 30 min default)."""
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", WAIT_FOR_A_PEER.format(port=free_port())], capture_output=True,
                          text=True, timeout=90, env={"TANDEM_PG_TIMEOUT_S": "3", "PATH": "/usr/bin:/bin"})
    assert done.returncode != 0
    assert time.monotonic() - started < 60, "the timeout was not applied"


def launch(gpus: int) -> command.Launch:
    (first,) = command.launches("r1", [{"address": "10.0.0.1", "gpus": gpus, "nic": "ens5"}], master_port=29500,
                                data_dir="/d", run_dir="/r", venv="/v", precision="fp16" if gpus else "fp32")
    return first


def test_gpu_ranks_get_nccl_error_handling_and_the_heartbeat_as_their_timeout():
    big = presets.resolve("transformer_vaswani_wmt_en_de_big")
    env = command.environment(launch(2), big)
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    assert env["TANDEM_PG_TIMEOUT_S"] == str(big.options["heartbeat_timeout"])
    line = command.training_command(big, launch(2))
    assert f"TANDEM_PG_TIMEOUT_S={big.options['heartbeat_timeout']}" in line
    assert "TORCH_NCCL" not in " ".join(command.environment(launch(0), big))


def test_the_heartbeat_outlasts_a_big_models_checkpoint_save():
    """Rank 0 writes ~2.9 GB four times at a new best; the other ranks wait for it in the next
    all-reduce. A 45 s heartbeat would end a healthy big run at its first save on a slow disk."""
    base = presets.resolve("transformer_wmt_en_de").options["heartbeat_timeout"]
    big = presets.resolve("transformer_vaswani_wmt_en_de_big").options["heartbeat_timeout"]
    assert base == 45
    assert big > 100
    assert presets.resolve("transformer_vaswani_wmt_en_de_big", ["heartbeat_timeout=60"]).options[
        "heartbeat_timeout"] == 60  # the user's word wins
