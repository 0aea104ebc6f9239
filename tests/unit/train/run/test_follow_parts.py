"""`fab train`'s follow loop: it only reads, and a laptop that loses its network changes nothing."""

from __future__ import annotations

from train.cluster import Host
from train.recipe.record import Run
from train.run import follow, launch
from train.run.launch import HostState

RUN = Run(run_id="run-x", hosts=["v100a", "v100b"], preset="tiny", overrides=[], dataset="synthetic")
HOSTS = [Host("v100a", "10.0.0.1"), Host("v100b", "10.0.0.2")]


def test_a_laptop_that_cannot_reach_any_host_says_so_backs_off_and_acts_on_nothing(monkeypatch):
    """Every host unreachable is this machine's network (asleep, offline): following says it once,
    asks again with back-off, never stops a rank, and says when the hosts answer again."""
    slept, stopped, polls = [], [], iter(range(100))
    monkeypatch.setattr(follow.time, "sleep", slept.append)
    monkeypatch.setattr(launch, "stop", lambda *a, **k: stopped.append(a))

    def states(run, hosts):
        n = next(polls)
        if n < 6:
            return [HostState(h.name, False, False, None, [], error="timed out") for h in hosts]
        ended = {"keeper": False, "ended": "finished", "timeline": [], "generation": None}
        return [HostState(h.name, False, True, None, [], keeper=ended) for h in hosts]

    monkeypatch.setattr(follow, "ProgressView", Viewless)
    monkeypatch.setattr(launch, "states", states)
    monkeypatch.setattr(follow, "Backup", NoCopies)
    console = Said()
    follow.follow(RUN, HOSTS, console)
    assert slept[:6] == [2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert stopped == []
    assert [line for line in console.lines if "cannot reach any host" in line].__len__() == 1
    assert any("the hosts answer again after" in line for line in console.lines)


class Viewless:
    """ProgressView's stand-in that follows along without a bar."""

    def __init__(self, *a):
        self.hosts_below = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def follow(self, hosts):
        pass

    def show(self, state):
        pass


class NoCopies:
    policy = "off"

    def __init__(self, *a, **k):
        pass

    def maybe_start(self, *a):
        pass

    def wait(self, say=None):
        pass

    def final(self, hosts):
        pass

    def leave(self):
        pass


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
