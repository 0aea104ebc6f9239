"""Which run `fab train` acts on: the latest is resumed only as it is (its preset, its dataset); a
request for another model or corpus is a new run, said before anything reaches a host (bad input:
exit 2, naming the option)."""

from __future__ import annotations

import pytest

from train.cluster import ClusterError, Host
from train.exits import OptionError
from train.recipe import record
from train.run import session

HOSTS = [Host(name="v100a", address="10.0.0.11"), Host(name="v100b", address="10.0.0.12")]


@pytest.fixture
def latest_tiny(monkeypatch):
    """The controller's latest run: the README's demo, tiny on the synthetic corpus."""
    run = record.Run(run_id="run-demo", hosts=["v100a", "v100b"], preset="tiny", overrides=[], dataset="synthetic")
    monkeypatch.setattr(record.Run, "load", classmethod(lambda cls, run_id: run))
    return run


def test_asking_for_big_on_wmt16_does_not_resume_the_tiny_demo(latest_tiny):
    request = session.TrainRequest(preset="transformer_vaswani_wmt_en_de_big", dataset="wmt16")
    with pytest.raises(OptionError) as err:
        session.pick_run(HOSTS, request, "fp16")
    said = str(err.value)
    assert said.startswith("--preset: the latest run, run-demo, is tiny on synthetic")
    assert "--preset transformer_vaswani_wmt_en_de_big (it trains tiny) and --dataset wmt16" in said
    assert "--new starts a run with them" in said


def test_the_same_preset_or_none_resumes(latest_tiny):
    for request in (session.TrainRequest(), session.TrainRequest(preset="tiny", dataset="synthetic"),
                    session.TrainRequest(overrides=("max_update=400",))):
        run, resuming = session.pick_run(HOSTS, request, "fp32")
        assert resuming and run.run_id == "run-demo"


def test_a_new_run_takes_what_was_asked_else_the_demos_defaults(latest_tiny):
    run, resuming = session.pick_run(HOSTS, session.TrainRequest(new=True, preset="transformer_wmt_en_de",
                                                                 dataset="wmt16"), "fp16")
    assert not resuming and (run.preset, run.dataset) == ("transformer_wmt_en_de", "wmt16")
    run, _ = session.pick_run(HOSTS, session.TrainRequest(new=True), "fp32")
    assert (run.preset, run.dataset) == ("tiny", "synthetic")


def test_a_named_run_is_named_in_the_refusal(latest_tiny):
    with pytest.raises(OptionError, match="^--dataset: run run-demo is tiny on synthetic; .*--dataset sample"):
        session.pick_run(HOSTS, session.TrainRequest(run_id="run-demo", dataset="sample"), "fp32")


def test_a_finished_run_is_not_resumed_for_one_more_update(latest_tiny):
    """fairseq would load update 40's checkpoint, train update 41 of 40 and stop."""
    latest_tiny.overrides = ["max_update=40"]
    with pytest.raises(ClusterError, match="run-demo has finished: its newest checkpoint is at update 40 of "
                                           "max_update 40; --set max_update=N trains it on"):
        session.finished_already(latest_tiny, 40)
    session.finished_already(latest_tiny, 39)  # one left: resumes
    session.finished_already(latest_tiny, None)  # no checkpoint anywhere: starts from the beginning
    latest_tiny.overrides = ["max_update=40", "max_update=80"]  # `fab train --set max_update=80`
    session.finished_already(latest_tiny, 40)
