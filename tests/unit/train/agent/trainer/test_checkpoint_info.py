"""The update a restart resumes from, read on the host from the checkpoint's small pickle: no torch,
no tensor read, and a file caught half-rewritten is never answered for."""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from fairseq import checkpoint_utils
from fairseq.logging import meters

from train.agent.trainer import checkpoint_info


def fairseq_checkpoint(path, updates: int, epoch: int, iterations: int, mb: int = 8) -> None:
    """A checkpoint as fairseq's trainer saves one: its own meters, an argparse Namespace, numpy
    scalars, and `mb` MB of tensors (torch_persistent_save: fairseq's own writer)."""
    average = meters.AverageMeter()
    average.update(3.5)
    state = {"args": argparse.Namespace(arch="transformer"), "cfg": {"optimization": {"max_update": 100}},
             "model": collections.OrderedDict(w=torch.zeros(mb * 1024 * 256)),
             "optimizer_history": [{"criterion_name": "x", "num_updates": updates - 40},
                                   {"criterion_name": "x", "num_updates": updates}],
             "extra_state": {"train_iterator": {"epoch": epoch, "iterations_in_epoch": iterations},
                             "best": np.float64(3.25), "metrics": {"train": [("loss", average, 0)]}}}
    checkpoint_utils.torch_persistent_save(state, str(path))


def test_the_update_epoch_and_place_are_read_without_torch(tmp_path):
    path = tmp_path / "checkpoint_last.pt"
    fairseq_checkpoint(path, updates=1234, epoch=3, iterations=57)
    # a fresh interpreter: the answer comes without importing torch (the controller's too)
    out = subprocess.run([sys.executable, "-c", "import json, sys; "
                          "from train.agent.trainer import checkpoint_info as c; "
                          f"print(json.dumps(c.read(c.Path({str(path)!r})))); print('torch' in sys.modules)"],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    said = json.loads(out[0])
    assert (said["update"], said["epoch"], said["iterations_in_epoch"]) == (1234, 3, 57), said
    assert said["bytes"] == path.stat().st_size > 8_000_000
    assert out[1] == "False"


def test_a_half_written_checkpoint_is_an_error_not_an_update(tmp_path):
    whole, torn = tmp_path / "whole.pt", tmp_path / "checkpoint_last.pt"
    fairseq_checkpoint(whole, updates=50, epoch=1, iterations=50)
    torn.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])  # fairseq's in-place copy, caught halfway
    said = checkpoint_info.read(torn, tries=2, pause_s=0)
    assert said["update"] is None and "BadZipFile" in said["error"], said
    assert checkpoint_info.read(tmp_path / "none.pt")["error"] == "missing"


def test_the_command_line_prints_one_json_line(tmp_path, capsys):
    path = tmp_path / "checkpoint_last.pt"
    fairseq_checkpoint(path, updates=7, epoch=1, iterations=7, mb=1)
    assert checkpoint_info.main([str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["update"] == 7


def test_a_field_that_is_no_number_is_an_error_not_a_traceback():
    """A file from a peer or a bucket: a class where fairseq writes a number reads as a stand-in."""
    stand_in = type("system", (), {})()  # what the reader makes of posix.system: a stand-in, never called
    with pytest.raises(ValueError, match="not a fairseq checkpoint"):
        checkpoint_info.progress({"optimizer_history": [{"num_updates": stand_in}]})
    assert checkpoint_info.progress({"extra_state": stand_in, "optimizer_history": stand_in})["update"] == 0
