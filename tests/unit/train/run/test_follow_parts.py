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


def test_a_vanished_host_is_given_up_within_a_minute_however_long_one_collective_may_take(monkeypatch):
    """The collective timeout grows with the bytes and the link (base on 16 ranks at 10 Mbit/s: over
    ten minutes); the controller's watch of each host does not wait for it: a host that stops
    answering is given up after the guard's grace, and only the hosts that answer are stopped."""
    from train.run import presets
    assert presets.resolve("transformer_wmt_en_de", ranks=16, link_mbps=10).options["heartbeat_timeout"] > 600
    clock = [1000.0]
    monkeypatch.setattr(follow.time, "monotonic", lambda: clock[0])
    stopped = []
    monkeypatch.setattr(launch, "stop", lambda run, hosts: stopped.append([h.name for h in hosts]))
    guard = follow.DeadRankGuard(RUN, say=lambda text: None)  # follow()'s default grace
    states = [HostState("v100a", True, True, None, []), HostState("v100b", False, False, None, [], error="timed out")]
    vanished, fired = clock[0], None
    while fired is None and clock[0] - vanished < 600:
        clock[0] += 2 + 15  # a poll: its sleep, then the state query that waits out the silent host
        if guard.stopped_the_rest(HOSTS, states):
            fired = clock[0] - vanished
    assert fired is not None and fired <= 60, fired
    assert stopped == [["v100a"]]


class Quiet:
    """ProgressView's stand-in: no bar, no host connections."""

    def __init__(self, *a):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


class Said:
    def __init__(self):
        self.lines: list[str] = []

    def print(self, text, **kwargs):
        self.lines.append(str(text))


def test_ctrl_c_twice_detaches_leaving_the_copy_under_way_unfinished(monkeypatch):
    """Ctrl-C detaches; the copy under way is waited for, said; a second Ctrl-C leaves it (a GB copy
    to a laptop takes minutes) and the run goes on: no traceback, no copy at the end."""
    class Copying:
        policy = "every:60"
        finals: list = []

        def __init__(self, run, policy, say):
            self.say = say

        def wait(self, say=None):
            if say is not None:
                say("waiting for the checkpoint copy under way (update 40 from v100a to the controller)")
                raise KeyboardInterrupt  # the second Ctrl-C

        def final(self, hosts):
            self.finals.append(hosts)

        def leave(self):
            self.finals.append("left")

    calls = []

    def states(run, hosts):
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt  # the first Ctrl-C, while following
        return []

    monkeypatch.setattr(follow, "ProgressView", Quiet)
    monkeypatch.setattr(follow, "Backup", Copying)
    monkeypatch.setattr(launch, "states", states)
    console = Said()
    assert follow.follow(RUN, HOSTS, console) == []
    assert console.lines[0].startswith("detached; run-x goes on")
    assert "update 40 from v100a to the controller" in console.lines[1]
    assert console.lines[2].startswith("the checkpoint copy was left unfinished")
    assert Copying.finals == ["left"]  # no copy at the end; the partial one removed
