"""`fab status`'s table and JSON, and `fab train`'s closing table: a host after rank 0's logs no
update, so its row says what it is doing (in step with rank 0) and rank 0's update, not the PyTorch
warning fragment or `initialized host v100b as rank 1` its log ends with."""

from __future__ import annotations

import json

from rich.console import Console

from train.recipe import logformat
from train.recipe.record import Run
from train.run.launch import HostState
from train.run.status import rows, status_json, table

RANK1_LOG = ["2026-11-26 08:00:01 | INFO | fairseq.distributed.utils | initialized host v100b as rank 1",
             "/opt/tandem/venv/lib/python3.11/site-packages/torch/nn/functional.py:5476: UserWarning: Support for "
             "mismatched key_padding_mask and attn_mask is deprecated.",
             "key_padding_mask = _canonical_mask("]


def progress(update: int, finished: bool = False) -> logformat.Progress:
    return logformat.Progress(update=update, max_update=400, loss=5.0, valid_loss=None, seconds_per_update=0.4,
                             wps=1000.0, wpb=400.0, devices=2, finished=finished)


def hosts(rank0_running: bool = True, rank1_running: bool = True, finished: bool = False) -> list[HostState]:
    rank0 = HostState("v100a", rank0_running, True, progress(130, finished),
                      ["2026-11-26 08:01:02 | INFO | train_inner | epoch 001: 130 / 400 loss=5.0"], ranks="0")
    rank1 = HostState("v100b", rank1_running, True, logformat.progress(logformat.parse_log(RANK1_LOG)),
                      RANK1_LOG[-1:], ranks="1")
    return [rank0, rank1]


def test_a_host_after_rank_0_says_it_trains_in_step_with_rank_0_at_its_update():
    first, second = rows(hosts())
    assert (first.update, first.loss, first.last_line) == (130, 5.0, "epoch 001: 130 / 400 loss=5.0")
    assert (second.update, second.loss, second.s_per_update) == (130, None, None)
    assert second.last_line == "training, in step with rank 0"
    out = Console(width=200, record=True)
    out.print(table(hosts()))
    text = out.export_text()
    assert "key_padding_mask" not in text and "training, in step with rank 0" in text
    assert [line.split("│")[4].strip() for line in text.splitlines() if "v100" in line] == ["130", "130"]


def test_when_the_run_finished_the_host_after_rank_0_finished_with_it():
    second = rows(hosts(rank0_running=False, rank1_running=False, finished=True))[1]
    assert (second.state, second.update, second.last_line) == ("finished", 130, "finished with rank 0")


def test_a_host_that_died_keeps_its_own_last_line_and_no_update():
    states = hosts(rank1_running=False)
    states[1].tail = ["RuntimeError: CUDA out of memory"]
    second = rows(states)[1]
    assert (second.update, second.last_line) == (None, "RuntimeError: CUDA out of memory")


def test_status_json_says_every_host_as_the_table_does():
    run = Run(run_id="run-1", hosts=["v100a", "v100b"], preset="tiny", overrides=[], dataset="synthetic")
    states = hosts()
    states.append(HostState("v100c", False, False, None, [], error="[Errno 113] No route to host", ranks="2"))
    said = json.loads(status_json(run, states))
    assert (said["run"], said["state"], said["update"], said["max_update"]) == (
        "run-1", "running, update 130/400", 130, 400)
    assert said["hosts"][1] == {"host": "v100b", "ranks": "1", "state": "running", "running": True,
                                "reachable": True, "update": 130, "loss": None, "s_per_update": None,
                                "last_line": "training, in step with rank 0", "error": None}
    assert said["hosts"][2]["state"] == "unreachable" and said["hosts"][2]["error"].endswith("No route to host")
