"""Which run `fab train` acts on: the latest is resumed only as it is (its preset, its dataset); a
request for another model or corpus is a new run, said before anything reaches a host (bad input:
exit 2, naming the option)."""

from __future__ import annotations

import re

import pytest

from train.cluster import ClusterError, Host
from train.errors import OptionError
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


def test_a_new_vm_takes_a_lost_hosts_place_in_the_run_by_replace(latest_tiny):
    known = [*HOSTS, Host(name="spot7", address="10.0.0.17")]
    request = session.TrainRequest(replace="v100b=spot7")
    hosts = session.replaced_hosts(known, request)
    assert [h.name for h in hosts] == ["v100a", "spot7"]  # its place in the rank order
    with pytest.raises(OptionError, match="same --hosts"):  # without --replace the other hosts are refused
        session.pick_run(hosts, session.TrainRequest(), "fp32")
    run, resuming = session.pick_run(hosts, request, "fp32")
    assert resuming and run.run_id == "run-demo"  # the same run, resumed, not a new one
    said = session.replaced(run, "v100b=spot7", hosts, 150)
    assert run.hosts == ["v100a", "spot7"] and run.members[-1]["why"] == "spot7 replaced v100b at update 150"
    assert "spot7 takes v100b's place in run-demo from update 150" in said


def test_a_replacement_names_what_is_wrong_with_it(latest_tiny):
    known = [*HOSTS, Host(name="spot7", address="10.0.0.17")]
    for replace, said in (("v100c=spot7", "v100c is not one of run-demo's hosts (v100a, v100b)"),
                          ("v100b=v100a", "v100a already trains in run-demo"),
                          ("v100b=spot9", "spot9 is not in the inventory: add it (fab init), provision it")):
        with pytest.raises(OptionError, match=re.escape(said)):
            session.replaced_hosts(known, session.TrainRequest(replace=replace))
    with pytest.raises(OptionError, match="without --new"):
        session.replaced_hosts(known, session.TrainRequest(replace="v100b=spot7", new=True))
