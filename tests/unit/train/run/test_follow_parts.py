"""The parts `fab train`'s follow loop asks: the checkpoint backup and the dead-rank guard."""

from __future__ import annotations

import time

from train.cluster import Host
from train.run import follow, launch
from train.run.launch import HostState
from train.run.record import Run

RUN = Run(run_id="run-x", hosts=["v100a", "v100b"], preset="tiny", overrides=[], dataset="synthetic")
HOSTS = [Host("v100a", "10.0.0.1"), Host("v100b", "10.0.0.2")]


def test_the_survivors_of_a_dead_rank_are_stopped_after_the_grace(monkeypatch):
    stopped, said = [], []
    monkeypatch.setattr(launch, "stop", lambda run, hosts: stopped.append([h.name for h in hosts]))
    guard = follow.DeadRankGuard(RUN, grace_s=0.2, say=said.append)
    states = [HostState("v100a", True, True, None, []), HostState("v100b", False, True, None, [])]
    assert not guard.stopped_the_rest(HOSTS, states)  # the others usually fail on their own first
    time.sleep(0.3)
    assert guard.stopped_the_rest(HOSTS, states)
    assert stopped == [["v100a", "v100b"]] and said == ["[red]rank on v100b stopped; stopping the others[/]"]
    guard.reset()
    assert not guard.stopped_the_rest(HOSTS, states)  # a new membership gets its own grace
