"""What a run writes on each host's /data, estimated from the model and the files fairseq keeps:
preflight refuses a host without the room, naming it, the need and the free space."""

from __future__ import annotations

import pytest

from train.cluster import Host
from train.recipe import presets
from train.recipe.record import Run
from train.run import disk, preflight

BASE, BIG = presets.PRESETS["transformer_wmt_en_de"], presets.PRESETS["transformer_vaswani_wmt_en_de_big"]


def test_a_checkpoint_is_the_size_users_measure():
    assert disk.checkpoint_bytes(BASE, 32000) == pytest.approx(744e6, rel=0.03)  # base's checkpoint_last.pt
    assert disk.checkpoint_bytes(BIG, 32000) == pytest.approx(2.5e9, rel=0.03)


def test_rank_0_keeps_last_best_five_best_one_interval_one_being_written_and_one_history_set_aside():
    assert disk.checkpoint_files(BASE) == 10
    need = disk.run_need(BIG, 32000)
    assert 25e9 < need.total < 28e9  # ~20 GB of checkpoints for big: the disk filled mid-run at 1 GB free
    assert disk.checkpoint_files({**BASE, "keep_best_checkpoints": 0}) == 5
    # every interval checkpoint kept (keep_interval_updates -1 or 0): max_update / save_interval_updates of them
    every = BASE["max_update"] // BASE["save_interval_updates"]  # 100,000 / 2,000
    assert disk.checkpoint_files({**BASE, "keep_interval_updates": 0}) == 2 + 5 + every + 1 + 1


def test_a_host_without_the_room_is_refused_naming_need_and_free():
    need = disk.run_need(BIG, 32000)
    said = disk.problem("v100b", need, free_gb=15.0)
    assert said.startswith(f"v100b: the run writes up to {need.total / 1e9:.1f} GB on /data (10 checkpoint files "
                           "of 2.53 GB + 0.5 GB of logs and samples; any host may become rank 0 after a loss), "
                           "15.0 GB free"), said
    assert disk.problem("v100b", need, free_gb=30.0) is None
    assert disk.problem("v100b", need, free_gb=15.0, already_gb=13.0) is None  # a resume replaces its own files


def test_preflight_refuses_the_host_that_is_short_only():
    run = Run(run_id="run-x", hosts=["v100a", "v100b"], preset="transformer_vaswani_wmt_en_de_big", overrides=[],
              dataset="synthetic")
    hosts = [Host("v100a", "10.0.0.1"), Host("v100b", "10.0.0.2")]
    answer = {"agent": "x", "data": "d", "port_free": True, "running": None, "run_gb": 0.0}
    answers = {"v100a": {**answer, "free_gb": 500.0}, "v100b": {**answer, "free_gb": 12.0}}
    problems = preflight.check(run, hosts, answers, pins_wanted={}, agent="x")
    assert len(problems) == 1 and problems[0].startswith("v100b: the run writes up to 25.8 GB on /data"), problems


def test_preflight_refuses_a_running_run_unless_its_keepers_take_the_new_start():
    run = Run(run_id="run-x", hosts=["v100a", "spot7"], preset="tiny", overrides=[], dataset="synthetic")
    hosts = [Host("v100a", "10.0.0.1"), Host("spot7", "10.0.0.7")]
    answer = {"agent": "x", "data": "d", "port_free": True, "running": None, "run_gb": 0.0, "free_gb": 500.0}
    answers = {"v100a": {**answer, "running": 4242, "port_free": False}, "spot7": answer}
    problems = preflight.check(run, hosts, answers, pins_wanted={}, agent="x")
    assert problems == ["v100a: run run-x is already training there (pid 4242): `fab stop` first, or `fab status`"]
    assert preflight.check(run, hosts, answers, pins_wanted={}, agent="x", adopting=True) == []  # --replace


def test_a_run_that_saves_nothing_needs_no_room_for_checkpoints():
    """bench-step's runs (no_save): only their logs count, not the 10 files a training run keeps."""
    assert disk.checkpoint_files({**BASE, "no_save": True}) == 0
    assert disk.run_need({**BIG, "no_save": True}, 32000).total < 1e9 + disk.SAMPLES_BYTES


def test_a_run_copying_off_the_cluster_counts_the_saves_an_upload_holds():
    """An upload under way holds its saves (hard links to checkpoint_last and checkpoint_best) while
    fairseq writes the next: two files more (issue 53, 8: one was counted). big: 25.8 GB without a
    target; a host with 27 GB free has room for that, not for the upload's."""
    assert disk.checkpoint_files(BASE, offsite=True) == disk.checkpoint_files(BASE) + 2 == 12
    run = Run(run_id="run-x", hosts=["v100a"], preset="transformer_vaswani_wmt_en_de_big", overrides=[],
              dataset="synthetic")
    hosts = [Host("v100a", "10.0.0.1")]
    answers = {"v100a": {"agent": "x", "data": "d", "port_free": True, "running": None, "run_gb": 0.0, "free_gb": 27.0}}
    assert preflight.check(run, hosts, answers, pins_wanted={}, agent="x") == []
    run.checkpoints_to = "s3://ckpts/runs"
    [problem] = preflight.check(run, hosts, answers, pins_wanted={}, agent="x")
    assert problem.startswith("v100a: the run writes up to 30.8 GB on /data (12 checkpoint files of 2.53 GB"), problem
