"""A checkpoint from a peer or a bucket loads as data, never as code (train.agent.trainer.checkpoints_as_data,
issue 54): a real one of tandem's runs resumes through tandem's entry point; one whose pickle would run a
command is refused by name, and the command never runs, even where TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 is
still set (hosts provisioned before issue 54 have it in /etc/tandem/env).

Each load runs in its own interpreter, as a rank does (torch's dynamo refuses to import after Ansible,
loaded by other unit tests in this process, has patched sys.intern)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("fairseq")

from train.recipe import presets  # noqa: E402
from train.run import command  # noqa: E402

OLD_HOST_ENV = {"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}  # what /etc/tandem/env held before issue 54

EVIL = """
import os, sys, torch

class Evil:
    def __reduce__(self):
        return (os.system, (f"touch {sys.argv[2]}",))

torch.save({"model": {}, "args": None, "extra_state": Evil()}, sys.argv[1])
"""


def in_a_rank(body: str, *args: str) -> subprocess.CompletedProcess:
    """`body` run in a fresh interpreter with tandem's loading installed, as the entry points do."""
    prelude = "from train.agent.trainer import checkpoints_as_data\ncheckpoints_as_data.install()\n"
    return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(body), *args], capture_output=True,
                          text=True, timeout=120, env={**os.environ, **OLD_HOST_ENV})


def evil_checkpoint(tmp_path: Path) -> tuple[Path, Path]:
    path, marker = tmp_path / "checkpoint_last.pt", tmp_path / "PWNED"
    subprocess.run([sys.executable, "-c", EVIL, str(path), str(marker)], check=True, timeout=60)
    assert not marker.exists()
    return path, marker


def test_a_checkpoint_that_would_run_a_command_is_refused_by_name_and_nothing_runs(tmp_path):
    path, marker = evil_checkpoint(tmp_path)
    done = in_a_rank("""
        import sys
        from fairseq import checkpoint_utils
        checkpoint_utils.load_checkpoint_to_cpu(sys.argv[1])  # what fairseq's resume and generate call
    """, str(path))
    assert done.returncode != 0
    assert not marker.exists(), "the checkpoint's command ran"
    assert "UnsafeCheckpoint: tandem: refused to load checkpoint" in done.stderr, done.stderr[-3000:]
    assert "it names posix.system" in done.stderr and str(path) in done.stderr


def test_a_caller_asking_for_the_full_load_gets_the_weights_only_one(tmp_path):
    path, marker = evil_checkpoint(tmp_path)
    done = in_a_rank("""
        import sys, torch
        torch.load(sys.argv[1], weights_only=False)
    """, str(path))
    assert done.returncode != 0 and "posix.system" in done.stderr, done.stderr[-3000:]
    assert not marker.exists()


def test_what_older_fairseq_checkpoints_hold_still_loads(tmp_path):
    """A cfg kept as omegaconf's DictConfig (fairseq < 0.10: a model fine-tuned from one), numpy scalars."""
    done = in_a_rank("""
        import argparse, sys
        import numpy as np
        import torch
        from omegaconf import OmegaConf

        cfg = OmegaConf.create({"model": {"arch": "transformer", "layers": [1, 2], "x": None}})
        torch.save({"cfg": cfg, "args": argparse.Namespace(lr=[0.1]), "best": np.float64(3.25)}, sys.argv[1])
        state = torch.load(sys.argv[1], map_location="cpu")
        assert state["cfg"].model.layers[1] == 2 and state["args"].lr == [0.1] and state["best"] == 3.25
    """, str(tmp_path / "old.pt"))
    assert done.returncode == 0, done.stderr[-3000:]


def test_the_controllers_progress_reader_never_runs_a_planted_checkpoint(tmp_path):
    from train.agent.trainer import checkpoint_info

    path, marker = evil_checkpoint(tmp_path)
    said = checkpoint_info.read(path, tries=1)  # a traceback before: the stand-in for os.system has no .get
    assert said["update"] == 0 and "error" not in said, said  # no update fairseq recorded
    assert not marker.exists()


def rank(tmp_path: Path, data: Path, max_update: int) -> subprocess.CompletedProcess:
    """One CPU rank of a real run through tandem's entry point, its arguments as `fab train` builds them."""
    (launch,) = command.launches("r1", [{"address": "127.0.0.1", "gpus": 0}], master_port=29500,
                                 data_dir=str(data), run_dir=str(tmp_path / "run"), venv="/v")
    preset = presets.resolve("tiny", [f"max_update={max_update}", "log_interval=1", "max_tokens=256",
                                      "save_interval_updates=2"])
    torchrun = Path(sys.executable).with_name("torchrun")
    env = {**os.environ, **command.environment(launch, preset), **OLD_HOST_ENV, "OMP_NUM_THREADS": "1"}
    return subprocess.run([str(torchrun), "--standalone", "--nproc_per_node", "1",
                           "-m", "train.agent.trainer.fairseq_train", *command.fairseq_train_args(preset, launch)],
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)


def test_a_real_checkpoint_of_a_run_resumes_and_a_planted_one_stops_the_rank(tmp_path):
    """fairseq 0.12 saves, under tandem's entry point, 2 updates; a second start resumes from that save
    weights-only (its `args`, an argparse.Namespace, allow-listed) and trains on to 4. The same start
    with a pickle planted as checkpoint_last.pt (a peer's copy, a bucket's) dies naming it."""
    from tests.unit.train.agent.trainer.test_compiled_layers import tiny_corpus

    data = tmp_path / "data"
    data.mkdir()
    tiny_corpus(data)
    first = rank(tmp_path, data, max_update=2)
    assert first.returncode == 0, (first.stdout + first.stderr)[-4000:]
    saved = tmp_path / "run" / "checkpoints" / "checkpoint_last.pt"
    import torch

    assert torch.serialization.get_unsafe_globals_in_checkpoint(str(saved)) == ["argparse.Namespace"], \
        "a checkpoint of tandem's runs holds a class checkpoints_as_data does not know of yet"

    resumed = rank(tmp_path, data, max_update=4)
    log = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, log[-4000:]
    assert "Loaded checkpoint" in log and '"num_updates": "4"' in log, log[-4000:]

    saved.unlink()
    _, marker = evil_checkpoint(saved.parent)
    planted = rank(tmp_path, data, max_update=6)
    log = planted.stdout + planted.stderr
    assert planted.returncode != 0 and "it names posix.system" in log, log[-4000:]
    assert not marker.exists()
