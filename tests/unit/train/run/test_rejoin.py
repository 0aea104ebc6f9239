"""Growing back when a lost host answers again: which hosts to ask, when to grow, the update-freq
back, the membership entry and the line said; the follower's Watch and grow with the hosts faked."""

from __future__ import annotations

import pytest

from train.cluster import ClusterError, Host
from train.report import logparse, members
from train.run import checkpoints, launch, record, rejoin, session

START = {"hosts": ["v100a", "v100b", "v100c"], "from_update": 0, "why": "start", "update_freq": 1}
LOST_C = {"hosts": ["v100a", "v100b"], "from_update": 30, "why": "v100c lost at update 34 (unreachable)",
          "lost": ["v100c"], "lost_at": 34, "update_freq": 2}
LOST_A = {"hosts": ["v100b", "v100c"], "from_update": 30, "why": "v100a lost at update 34 (unreachable)",
          "lost": ["v100a"], "lost_at": 34, "update_freq": 2}


def progress(update: int, saved: int | None, finished: bool = False, max_update: int = 100) -> logparse.Progress:
    return logparse.Progress(update=update, max_update=max_update, loss=5.0, valid_loss=None,
                             seconds_per_update=0.5, wps=1000.0, wpb=400.0, devices=2, finished=finished, saved=saved)


def a_run(hosts, members_, update_freq=2) -> record.Run:
    return record.Run(run_id="run-rejoin", hosts=list(hosts), preset="tiny", overrides=[], dataset="synthetic",
                      update_freq=update_freq, members=[dict(m) for m in members_])


HOSTS = {n: Host(name=n, address=f"10.0.0.{i}") for i, n in enumerate(["v100a", "v100b", "v100c"], 11)}


# which hosts, in which order


def test_the_hosts_to_ask_are_those_the_run_lost():
    assert rejoin.lost_hosts([START, LOST_C], ["v100a", "v100b"]) == ["v100c"]
    assert rejoin.lost_hosts([START], ["v100a", "v100b", "v100c"]) == []
    assert rejoin.lost_hosts([], ["v100a"]) == []
    # an older entry without `lost`: the hosts of an earlier membership
    assert rejoin.lost_hosts([START, {"hosts": ["v100a"], "from_update": 30, "why": "..."}], ["v100a"]) == \
        ["v100b", "v100c"]


def test_the_grown_run_has_its_first_rank_0_back_at_rank_0():
    assert rejoin.grown_hosts([START, LOST_C], ["v100a", "v100b"], ["v100c"]) == ["v100a", "v100b", "v100c"]
    assert rejoin.grown_hosts([START, LOST_A], ["v100b", "v100c"], ["v100a"]) == ["v100a", "v100b", "v100c"]
    assert rejoin.grown_hosts([], ["v100b"], ["v100a"]) == ["v100b", "v100a"]  # no history: joiners last


# the update-freq back


def test_update_freq_goes_back_to_the_effective_batch_the_run_started_with():
    assert rejoin.grown_update_freq([START, LOST_C], 2, 2, 3) == 1  # 3x1 -> 2x2 -> 3x1
    assert rejoin.grown_update_freq([{**START, "update_freq": 2}, LOST_C], 3, 2, 3) == 2
    four = {"hosts": ["a", "b", "c", "d"], "from_update": 0, "why": "start", "update_freq": 1}
    assert rejoin.grown_update_freq([four], 4, 1, 3) == 2  # 4 back on 3: 1.33 rounded up, never a smaller batch
    assert rejoin.grown_update_freq([four], 4, 1, 4) == 1


def test_a_run_that_recorded_no_update_freq_has_its_scaling_undone():
    old = [{k: v for k, v in m.items() if k != "update_freq"} for m in (START, LOST_C)]
    assert rejoin.grown_update_freq(old, 2, 2, 3) == 1  # 2x2 = 4 on 3 hosts: 1 (rounded down)
    assert rejoin.grown_update_freq(old, 4, 1, 2) == 2


def test_a_round_trip_through_a_loss_keeps_the_update_freq():
    from train.run.elastic import scaled_update_freq

    lost = scaled_update_freq(1, 3, 2)
    assert lost == 2 and rejoin.grown_update_freq([START, LOST_C], lost, 2, 3) == 1


# when to grow


def test_it_grows_at_the_first_checkpoint_saved_after_the_host_was_back():
    assert not rejoin.due(progress(43, saved=40), since=40)  # the one already seen
    assert rejoin.due(progress(51, saved=50), since=40)
    assert rejoin.due(progress(12, saved=10), since=None)  # none seen when it came back: the first


def test_it_does_not_grow_a_run_that_is_done_or_has_not_saved():
    assert not rejoin.due(None, since=None)
    assert not rejoin.due(progress(5, saved=None), since=None)
    assert not rejoin.due(progress(100, saved=100), since=90)  # its last checkpoint: nothing left to train
    assert not rejoin.due(progress(95, saved=90, finished=True), since=80)


def test_the_log_says_which_checkpoint_was_saved_last():
    lines = [
        "2026-11-23 09:00:01 | INFO | fairseq.checkpoint_utils | Saved checkpoint /data/tandem/runs/r/checkpoints/"
        "checkpoint_1_50.pt (epoch 1 @ 50 updates, score 7.169) (writing took 0.03 seconds)",
        "2026-11-23 09:00:05 | INFO | fairseq.checkpoint_utils | Saved checkpoint /data/tandem/runs/r/checkpoints/"
        "checkpoint_best.pt (epoch 1 @ 86 updates, score 5.537) (writing took 0.02 seconds)",
    ]
    assert logparse.progress(logparse.parse_log(lines)).saved == 86
    assert logparse.progress(logparse.parse_log([])).saved is None


# the membership entry and the line


def test_the_entry_reads_as_a_rejoin_in_the_report():
    run = a_run(["v100a", "v100b"], [START, LOST_C])
    said = rejoin.record(run, ["v100c"], 60)
    assert said == "v100c is back: growing to v100a, v100b, v100c from update 60, update-freq 1"
    assert run.hosts == ["v100a", "v100b", "v100c"] and run.update_freq == 1
    back = run.members[-1]
    assert back["why"] == "v100c rejoined at update 60" and back["joined"] == ["v100c"]
    assert back["from_update"] == 60 and back["update_freq"] == 1
    found = members.changes(run.members)
    assert [(c.kind, c.label) for c in found] == [("lost", "v100c lost at 34"), ("joined", "v100c rejoined at 60")]
    assert [(s.hosts, s.first, s.last) for s in members.spans(run.members, 100)] == [
        (["v100a", "v100b", "v100c"], 0, 34), (["v100a", "v100b"], 30, 60), (["v100a", "v100b", "v100c"], 60, 100)]


def test_a_run_with_no_membership_yet_gets_its_start_recorded_first():
    run = a_run(["v100a"], [], update_freq=1)
    assert rejoin.record(run, ["v100b"], 10) == "v100b is back: growing to v100a, v100b from update 10, update-freq 1"
    assert [m["hosts"] for m in run.members] == [["v100a"], ["v100a", "v100b"]]


def test_two_hosts_back_at_once_are_said_together():
    assert rejoin.line(["v100b", "v100c"], ["v100a", "v100b", "v100c"], 1200, 1) == \
        "v100b, v100c are back: growing to v100a, v100b, v100c from update 1,200, update-freq 1"


# grow, with the hosts faked


@pytest.fixture
def cluster(monkeypatch):
    """launch's host-touching parts replaced by a record of what was asked."""
    calls = []
    monkeypatch.setattr(record.Run, "save", lambda self: calls.append(("save", list(self.hosts))))
    monkeypatch.setattr(launch, "stop", lambda run, hosts, **kw: calls.append(("stop", [h.name for h in hosts])))
    monkeypatch.setattr(checkpoints, "share_checkpoint", lambda run, hosts: calls.append(
        ("share", [h.name for h in hosts])) or checkpoints.Shared(60, hosts[0].name))
    monkeypatch.setattr(launch, "start", lambda run, hosts: calls.append(("start", [h.name for h in hosts])))
    return calls


def test_grow_stops_shares_from_the_current_rank_0_and_restarts_on_every_host(cluster):
    run, said = a_run(["v100a", "v100b"], [START, LOST_C]), []
    hosts = rejoin.grow(run, [HOSTS["v100a"], HOSTS["v100b"]], [HOSTS["v100c"]], say=said.append)
    assert [h.name for h in hosts] == ["v100a", "v100b", "v100c"]
    assert cluster == [("stop", ["v100a", "v100b"]), ("share", ["v100a", "v100b", "v100c"]),
                       ("save", ["v100a", "v100b", "v100c"]), ("start", ["v100a", "v100b", "v100c"])]
    assert said == ["v100c is back: growing to v100a, v100b, v100c from update 60, update-freq 1"]


def test_rank_0_back_gets_the_checkpoint_of_the_rank_0_that_trained_meanwhile(cluster):
    run = a_run(["v100b", "v100c"], [START, LOST_A])
    hosts = rejoin.grow(run, [HOSTS["v100b"], HOSTS["v100c"]], [HOSTS["v100a"]], say=lambda _: None)
    assert [h.name for h in hosts] == ["v100a", "v100b", "v100c"]
    assert ("share", ["v100b", "v100c", "v100a"]) in cluster  # v100b's copy, not v100a's stale one


def test_a_joiner_gone_again_at_the_start_leaves_the_run_on_its_hosts(cluster, monkeypatch):
    started = []

    def start(run, hosts):
        started.append([h.name for h in hosts])
        if len(hosts) == 3:
            raise ClusterError("could not start every rank (the others were stopped):\n  v100c: timed out")

    monkeypatch.setattr(launch, "start", start)
    run, said = a_run(["v100a", "v100b"], [START, LOST_C]), []
    hosts = rejoin.grow(run, [HOSTS["v100a"], HOSTS["v100b"]], [HOSTS["v100c"]], say=said.append)
    assert [h.name for h in hosts] == ["v100a", "v100b"] and started[-1] == ["v100a", "v100b"]
    assert run.hosts == ["v100a", "v100b"] and run.update_freq == 2 and len(run.members) == 2
    assert said[0].startswith("could not grow back to v100c (") and said[0].endswith("going on on v100a, v100b")


# the follower's Watch


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def a_watch(monkeypatch, back, problems=()):
    clock = Clock()
    monkeypatch.setattr(rejoin.time, "monotonic", clock)
    asked = []
    monkeypatch.setattr(rejoin, "answering", lambda hosts, timeout: asked.append([h.name for h in hosts]) or
                        [h for h in hosts if h.name in back])
    monkeypatch.setattr(rejoin, "preflight", lambda run, current, joining: list(problems))
    grown = []
    monkeypatch.setattr(rejoin, "grow", lambda run, current, joining, say: grown.append(
        [h.name for h in joining]) or [*current, *joining])
    run, said = a_run(["v100a", "v100b"], [START, LOST_C]), []
    watch = rejoin.Watch(run, list(HOSTS.values()), say=said.append)
    return watch, clock, asked, grown, said


def settle(watch):
    if watch._asking is not None:
        watch._asking.join()


def test_the_watch_asks_the_lost_host_every_interval_and_not_in_between(monkeypatch):
    watch, clock, asked, grown, said = a_watch(monkeypatch, back=[])
    current = [HOSTS["v100a"], HOSTS["v100b"]]
    assert watch.step(current, progress(20, 20)) is None and asked == []  # not yet one interval
    clock.now += watch.every_s
    watch.step(current, progress(25, 20))
    settle(watch)
    assert asked == [["v100c"]]
    watch.step(current, progress(26, 20))  # the answer: still gone
    clock.now += watch.every_s / 2
    watch.step(current, progress(30, 30))
    assert asked == [["v100c"]] and not watch.ready and grown == [] and said == []


def test_the_watch_grows_back_at_the_checkpoint_after_the_host_passed_its_preflight(monkeypatch):
    watch, clock, asked, grown, said = a_watch(monkeypatch, back=["v100c"])
    current = [HOSTS["v100a"], HOSTS["v100b"]]
    clock.now += watch.every_s
    watch.step(current, progress(42, 40))
    settle(watch)
    assert watch.step(current, progress(43, 40)) is None  # the answer: back, ready
    assert [h.name for h in watch.ready] == ["v100c"] and watch.since == 40
    assert said == ["v100c answers again and passed the preflight; growing back at the next checkpoint "
                    "(after update 40)"]
    assert watch.step(current, progress(48, 40)) is None and grown == []  # no new checkpoint yet
    hosts = watch.step(current, progress(51, 50))
    assert grown == [["v100c"]] and [h.name for h in hosts] == ["v100a", "v100b", "v100c"]
    assert not watch.ready


def test_a_host_back_that_fails_its_preflight_is_named_once_and_not_grown_to(monkeypatch):
    problem = "v100c: packages differ from the pins: torch 2.4.0 (pinned 2.5.1); re-run provision.yml"
    watch, clock, asked, grown, said = a_watch(monkeypatch, back=["v100c"], problems=[problem])
    current = [HOSTS["v100a"], HOSTS["v100b"]]
    for _ in range(2):
        clock.now += watch.every_s
        watch.step(current, progress(42, 40))
        settle(watch)
        watch.step(current, progress(43, 40))
    assert said == [f"back but not rejoining: {problem}"] and not watch.ready and len(asked) == 2
    watch.step(current, progress(51, 50))
    assert grown == []


def test_a_run_that_lost_nothing_asks_no_one(monkeypatch):
    watch, clock, asked, grown, said = a_watch(monkeypatch, back=["v100c"])
    watch.run.hosts = ["v100a", "v100b", "v100c"]
    clock.now += 2 * watch.every_s
    watch.step(list(HOSTS.values()), progress(42, 40))
    settle(watch)
    assert asked == [] and watch._asking is None


def test_a_host_of_the_run_gone_as_it_grows_leaves_it_to_the_elastic_restart(cluster, monkeypatch):
    def stop(run, hosts, **kw):
        raise ClusterError("stop incomplete:\n  v100b: unreachable (timed out); its rank may still run")

    monkeypatch.setattr(launch, "stop", stop)
    run, said = a_run(["v100a", "v100b"], [START, LOST_C]), []
    hosts = rejoin.grow(run, [HOSTS["v100a"], HOSTS["v100b"]], [HOSTS["v100c"]], say=said.append)
    assert [h.name for h in hosts] == ["v100a", "v100b"] and cluster == [] and len(run.members) == 2
    assert said[0].startswith("could not stop the run to grow back to v100c: stop incomplete")


# fab train: --hosts naming hosts the run lost, --rejoin


@pytest.fixture
def lost_c(monkeypatch):
    run = a_run(["v100a", "v100b"], [START, LOST_C])
    monkeypatch.setattr(record.Run, "load", classmethod(lambda cls, run_id: run))
    return run


def test_fab_train_grows_to_hosts_the_run_lost_and_refuses_others(lost_c):
    three = [HOSTS["v100a"], HOSTS["v100b"], HOSTS["v100c"]]
    run, resuming = session.pick_run(three, session.TrainRequest(), "fp32")
    assert resuming and run.hosts == ["v100a", "v100b"]  # the membership grows once the checkpoint is shared
    stranger = Host(name="v100d", address="10.0.0.14")
    with pytest.raises(ClusterError, match="ran on v100a, v100b, not v100a, v100b, v100d"):
        session.pick_run([*three[:2], stranger], session.TrainRequest(), "fp32")
    with pytest.raises(ClusterError, match="not v100a: pass the same --hosts"):  # fewer: not a rejoin
        session.pick_run(three[:1], session.TrainRequest(), "fp32")


def test_rejoin_picks_every_host_the_run_lost_that_the_inventory_has(lost_c):
    known = [HOSTS["v100c"], HOSTS["v100b"], HOSTS["v100a"]]
    assert [h.name for h in session.rejoin_hosts(known, None)] == ["v100a", "v100b", "v100c"]
    with pytest.raises(ClusterError, match="lost no host the inventory has"):
        session.rejoin_hosts(known[1:], None)


# 2 hosts x 2 ranks: losing v100b and growing back to it keep the tokens per update (scaled by ranks)

TWO_BY_TWO = {n: Host(name=n, address=f"10.0.0.{i}", vars={"cpu_ranks": 2})
              for i, n in enumerate(["v100a", "v100b"], 11)}


def test_losing_v100b_of_two_by_two_ranks_goes_on_on_v100as_two_ranks_at_update_freq_2_and_grows_back(cluster):
    from test_why_stopped import TORCHRUN_EXIT, state

    from train.run import elastic

    run, said = a_run(["v100a", "v100b"], [], update_freq=1), []
    hosts = [TWO_BY_TWO["v100a"], TWO_BY_TWO["v100b"]]
    states = [state("v100a", lines=TORCHRUN_EXIT), state("v100b", reachable=False)]
    left = elastic.continue_without(run, hosts, states, say=said.append, at=64)
    assert [h.name for h in left] == ["v100a"] and run.update_freq == 2  # 4 ranks -> 2: x2
    assert said == ["v100b lost at update 64 (unreachable); continuing on v100a from update 60, update-freq 2 "
                    "(2 ranks); checkpoint from v100a, host to host"]
    assert [(m["hosts"], m["ranks"], m["update_freq"]) for m in run.members] == [
        (["v100a", "v100b"], 4, 1), (["v100a"], 2, 2)]
    grown = rejoin.grow(run, left, [TWO_BY_TWO["v100b"]], say=said.append)
    assert [h.name for h in grown] == ["v100a", "v100b"] and run.update_freq == 1
    assert said[-1] == "v100b is back: growing to v100a, v100b from update 60, update-freq 1 (4 ranks)"
    assert run.members[-1]["ranks"] == 4


def test_update_freq_scales_by_ranks_not_hosts():
    from train.run.elastic import scaled_update_freq

    assert scaled_update_freq(1, 4, 2) == 2  # 2 x 2 ranks -> 1 x 2
    assert scaled_update_freq(1, 6, 4) == 2  # 3 x 2 ranks -> 2 x 2: 1.5 rounded up
    assert scaled_update_freq(2, 16, 8) == 4  # 2 x 8 GPUs -> 1 x 8
    start = {"hosts": ["v100a", "v100b"], "from_update": 0, "why": "start", "update_freq": 1, "ranks": 4}
    assert rejoin.grown_update_freq([start], 2, 2, 4) == 1
    assert rejoin.grown_update_freq([start], 2, 2, 2) == 2
    # a first entry from before ranks were recorded: its hosts x the ranks a host runs now
    assert rejoin.grown_update_freq([{k: v for k, v in start.items() if k != "ranks"}], 2, 2, 4, ranks_per_host=2) == 1
    run = a_run(["v100a"], [start, {**start, "hosts": ["v100a"], "ranks": 2, "update_freq": 2}])
    assert rejoin.membership_after(run, ["v100b"], ranks_per_host=2) == (["v100a", "v100b"], 1)
