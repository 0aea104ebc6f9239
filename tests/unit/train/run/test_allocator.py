"""GPU ranks run torch's caching allocator with expandable segments (train.run.command.environment):
the peaks the GPU memory model (train.plan.batch) is fitted to."""

from __future__ import annotations

import shlex

from train.recipe import presets
from train.run import command

BIG = presets.resolve("transformer_vaswani_wmt_en_de_big")


def launch(gpus: int) -> command.Launch:
    (first,) = command.launches("r1", [{"address": "10.0.0.1", "gpus": gpus, "nic": "ens5"}], master_port=29500,
                                data_dir="/d", run_dir="/r", venv="/v", precision="fp16" if gpus else "fp32")
    return first


def assignments(line: str) -> dict[str, str]:
    """The variables the shell line sets for torchrun (the words between `{` and `setsid`)."""
    words = shlex.split(line)
    setsid = words.index("setsid")
    start = max(i for i, w in enumerate(words[:setsid]) if w == "{")
    return dict(w.split("=", 1) for w in words[start + 1:setsid])


def test_gpu_ranks_start_with_expandable_segments(monkeypatch):
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    env = assignments(command.training_command(BIG, launch(8)))
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"


def test_cpu_ranks_get_no_cuda_allocator_setting(monkeypatch):
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    tiny = presets.resolve("tiny")
    assert "PYTORCH_CUDA_ALLOC_CONF" not in assignments(command.training_command(tiny, launch(0)))


def test_the_users_own_allocator_setting_wins(monkeypatch):
    """`PYTORCH_CUDA_ALLOC_CONF=... fab train`: the ranks get the user's value; set empty, torch's defaults."""
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:512,garbage_collection_threshold:0.8")
    env = assignments(command.training_command(BIG, launch(1)))
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:512,garbage_collection_threshold:0.8"
    assert command.environment(launch(1), BIG, user_env={"PYTORCH_CUDA_ALLOC_CONF": ""})[
        "PYTORCH_CUDA_ALLOC_CONF"] == ""
    assert command.environment(launch(1), BIG, user_env={})["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
