"""What `fab report` asks every host before it collects their files (train.run.status.for_report): one
question to the hosts, the run running while a rank of its own hosts runs, none answering refused."""

from __future__ import annotations

import pytest

from train.cluster import ClusterError, Host
from train.recipe.record import Run
from train.run import launch, status
from train.run.launch import HostState

HOSTS = [Host("v100a", "10.0.0.1", vars={"hourly_usd": 3.0}), Host("v100b", "10.0.0.2", vars={"hourly_usd": 3.0})]


def run_record() -> Run:
    return Run(run_id="r1", hosts=["v100a", "v100b"], preset="tiny", overrides=[], dataset="synthetic")


def test_the_hosts_are_asked_once_and_a_running_rank_means_not_idle(monkeypatch):
    asked = []

    def states(run, hosts):
        asked.append([h.name for h in hosts])
        return [HostState("v100a", True, True, None, []), HostState("v100b", False, True, None, [])]

    monkeypatch.setattr(launch, "states", states)
    copies, cost = status.for_report(run_record(), HOSTS)
    assert asked == [["v100a", "v100b"]]
    assert copies is None  # the run copies nothing off the cluster
    assert cost["hosts"] == ["v100a", "v100b"] and cost["idle_s"] is None and cost["usd_per_hour"] == 6.0


def test_no_host_answering_is_refused_naming_each(monkeypatch):
    monkeypatch.setattr(launch, "states", lambda run, hosts: [
        HostState(h.name, False, False, None, [], error="No route to host") for h in hosts])
    with pytest.raises(ClusterError, match="v100a.*No route to host"):
        status.for_report(run_record(), HOSTS)
