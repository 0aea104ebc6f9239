"""Which hosts `fab stop` reaches (train.run.launch.stop): a host the run may have lost that cannot be
reached is said, not an error; a host training in the run that cannot be reached is one."""

import pytest

from train.cluster import ClusterError, GroupResult, Host, HostResult
from train.recipe.record import Run
from train.run import launch

HOSTS = [Host("v100a", "10.0.0.1"), Host("v100b", "10.0.0.2")]
RUN = Run(run_id="r1", hosts=["v100a"], preset="tiny", overrides=[], dataset="synthetic", order=["v100a", "v100b"])


def answers(monkeypatch, b_reachable: bool):
    def run_all(hosts, command, timeout=None):
        said = {"v100a": HostResult("v100a", stdout="stopped\n", exited=0),
                "v100b": HostResult("v100b", stdout="stopped\n", exited=0) if b_reachable
                else HostResult("v100b", error=TimeoutError("timed out"))}
        return GroupResult({h.name: said[h.name] for h in hosts})
    monkeypatch.setattr(launch, "run_all", run_all)


def test_a_host_the_keepers_took_back_is_stopped_too(monkeypatch):
    """The record names v100a only (it kept the run while v100b was away); v100b was taken back since."""
    answers(monkeypatch, b_reachable=True)
    known, spare = launch.to_stop(RUN, HOSTS)
    assert [h.name for h in known] == ["v100a", "v100b"] and spare == {"v100b"}
    assert launch.stop(RUN, known, spare=spare) == {"v100a": "stopped", "v100b": "stopped"}


def test_an_unreachable_host_is_an_error_only_while_it_trains_in_the_run(monkeypatch):
    answers(monkeypatch, b_reachable=False)
    known, spare = launch.to_stop(RUN, HOSTS)
    assert launch.stop(RUN, known, spare=spare)["v100b"] == "unreachable"
    both = Run(run_id="r2", hosts=["v100a", "v100b"], preset="tiny", overrides=[], dataset="synthetic",
               order=["v100a", "v100b"])
    known, spare = launch.to_stop(both, HOSTS)
    assert spare == frozenset()
    with pytest.raises(ClusterError, match="v100b: unreachable"):
        launch.stop(both, known, spare=spare)
