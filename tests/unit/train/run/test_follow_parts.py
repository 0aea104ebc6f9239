"""The parts `fab train`'s follow loop asks: the checkpoint backup and the dead-rank guard."""

from __future__ import annotations

import threading
import time

from train.cluster import Host
from train.run import checkpoints, follow, launch
from train.run.launch import HostState
from train.run.record import Run

RUN = Run(run_id="run-x", hosts=["v100a", "v100b"], preset="tiny", overrides=[], dataset="synthetic")
HOSTS = [Host("v100a", "10.0.0.1"), Host("v100b", "10.0.0.2")]


def test_one_checkpoint_copy_at_a_time_whoever_asks(monkeypatch):
    """A restart that needs the checkpoint waits for the copy under way instead of racing it for the
    same file (two copies at once tore it, or raised on its temporary name)."""
    release, under_way, most = threading.Event(), [], []

    def share(run, hosts):
        under_way.append(1)
        most.append(len(under_way))
        release.wait(5)
        under_way.pop()

    monkeypatch.setattr(checkpoints, "share_checkpoint", share)
    backup = checkpoints.Backup(RUN, every_s=0.0)
    backup.maybe_start(HOSTS, saved=10)  # the first checkpoint: copied at once
    backup.maybe_start(HOSTS, saved=20)  # due again, but one is under way: nothing started
    time.sleep(0.1)
    assert most == [1]
    waited = threading.Thread(target=backup.wait)
    waited.start()
    waited.join(0.2)
    assert waited.is_alive()  # wait() holds while the copy runs
    release.set()
    waited.join(5)
    assert not waited.is_alive() and not under_way


def test_a_failed_copy_is_said_and_the_run_goes_on(monkeypatch):
    said = []

    def share(run, hosts):
        raise TimeoutError("no answer within 60 s")

    monkeypatch.setattr(checkpoints, "share_checkpoint", share)
    checkpoints.Backup(RUN, say=said.append).now(HOSTS)
    assert said == ["checkpoint copy failed (training goes on): TimeoutError: no answer within 60 s"]


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
