"""`fab train --resume-from URL --hosts NEW`: the run's record, as its copy off the cluster carries it,
adopted on other VMs (train.run.moved); what was derived for the old world is derived again."""

from __future__ import annotations

import io
from dataclasses import asdict

import pytest
from rich.console import Console

from train.cluster import Host
from train.errors import OptionError
from train.recipe.record import Run
from train.run import moved, session

OLD = Run(run_id="run-1", hosts=["v100a", "v100b"], preset="transformer_vaswani_wmt_en_de_big",
          overrides=["max_update=300000"], dataset="wmt16",
          update_freq=8, max_tokens=4096, max_tokens_cap=5000, save_interval_updates=500, gpu_name="Tesla V100",
          link_mbps=940.0, comm="local_sgd:16", data_manifest="ab" * 32, order=["v100a", "v100b"],
          members=[{"hosts": ["v100a", "v100b"], "from_update": 0}])
NEW = [Host(name=n, address=f"10.1.0.{i}", vars={"gpus": 8}) for i, n in enumerate(["h100a", "h100b"], 11)]
COPY = {"run": "run-1", "update": 90_050, "time": 1.0, "where": "s3://b/runs/run-1/u90050"}


def test_a_moved_run_keeps_its_model_data_and_strategy_and_derives_its_batch_again_for_the_new_hosts():
    run = moved.adopted({**asdict(OLD), "a_field_of_a_newer_tandem": 1}, NEW, COPY, "s3://b/runs")
    assert (run.run_id, run.preset, run.dataset, run.overrides, run.comm) == \
        ("run-1", "transformer_vaswani_wmt_en_de_big", "wmt16", ["max_update=300000"], "local_sgd:16")
    assert run.hosts == run.order == ["h100a", "h100b"]
    assert (run.max_tokens, run.max_tokens_cap, run.save_interval_updates, run.gpu_name, run.link_mbps) == \
        (None, None, None, None, None)  # another GPU, another link: measured and derived again
    assert run.data_manifest == OLD.data_manifest  # the new hosts' dataset must be the one it trained on
    last = run.members[-1]
    assert last["from_update"] == 90_050 and last["lost"] == ["v100a", "v100b"] and last["joined"] == NEW_NAMES
    assert "s3://b/runs" in last["why"]


NEW_NAMES = ["h100a", "h100b"]


@pytest.mark.parametrize("other", [{"new": True}, {"replace": "a=b"}, {"rejoin": True}, {"dry_run": True}])
def test_resume_from_with_an_option_that_contradicts_it_is_refused_before_any_host_is_reached(other):
    request = session.TrainRequest(resume_from="s3://b/runs", **other)
    with pytest.raises(OptionError) as refused:
        session.moved_here(request, NEW, Console(file=io.StringIO()))
    assert refused.value.option == "--resume-from"


def test_fab_predict_run_prices_only_the_updates_left_after_the_newest_known_one(tmp_path, monkeypatch):
    from train.recipe import record

    monkeypatch.setattr(record, "REPORTS", tmp_path)
    run = moved.adopted(asdict(OLD), NEW, COPY, "s3://b/runs")
    run.save()
    options, said = moved.rest_of("run-1")
    assert options["max_update"] == 300_000 - 90_050 and options["preset"] == OLD.preset
    assert options["comm"] == "local_sgd:16" and "max_update" not in options["set_text"]
    assert "209,950 updates (from update 90,050 of 300,000)" in said


def test_a_run_without_a_batch_target_keeps_its_tokens_per_update_on_another_number_of_ranks():
    """tiny has no tokens-per-update target: 2 hosts x 1 rank x update_freq 4 moved to 4 hosts x 2 ranks
    goes on with update_freq 1 (8 ranks), not 4 (four times the batch the checkpoint trained with)."""
    small = Run(run_id="run-2", hosts=["v100a", "v100b"], preset="tiny", overrides=[], dataset="synthetic",
                update_freq=4)
    wide = [Host(name=f"h{i}", address=f"10.1.0.{i}", vars={"cpu_ranks": 2}) for i in range(11, 15)]
    run = moved.adopted(asdict(small), wide, {**COPY, "run": "run-2"}, "/mnt/share/runs")
    assert (run.ranks_per_host, run.update_freq) == (2, 1)
