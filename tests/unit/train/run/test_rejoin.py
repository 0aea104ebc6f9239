"""Growing back when a lost host answers again: which hosts to ask, when to grow, the update-freq
back, the membership entry and the line said; the follower's Watch and grow with the hosts faked."""

from __future__ import annotations

import pytest

from train.cluster import ClusterError, Host
from train.errors import OptionError
from train.recipe import logformat, record
from train.report import members
from train.run import launch, rejoin, session

START = {"hosts": ["v100a", "v100b", "v100c"], "from_update": 0, "why": "start", "update_freq": 1}
LOST_C = {"hosts": ["v100a", "v100b"], "from_update": 30, "why": "v100c lost at update 34 (unreachable)",
          "lost": ["v100c"], "lost_at": 34, "update_freq": 2}
LOST_A = {"hosts": ["v100b", "v100c"], "from_update": 30, "why": "v100a lost at update 34 (unreachable)",
          "lost": ["v100a"], "lost_at": 34, "update_freq": 2}


def progress(update: int, saved: int | None, finished: bool = False, max_update: int = 100) -> logformat.Progress:
    return logformat.Progress(update=update, max_update=max_update, loss=5.0, valid_loss=None,
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


def test_the_log_says_which_checkpoint_was_saved_last():
    lines = [
        "2026-11-23 09:00:01 | INFO | fairseq.checkpoint_utils | Saved checkpoint /data/tandem/runs/r/checkpoints/"
        "checkpoint_1_50.pt (epoch 1 @ 50 updates, score 7.169) (writing took 0.03 seconds)",
        "2026-11-23 09:00:05 | INFO | fairseq.checkpoint_utils | Saved checkpoint /data/tandem/runs/r/checkpoints/"
        "checkpoint_best.pt (epoch 1 @ 86 updates, score 5.537) (writing took 0.02 seconds)",
    ]
    assert logformat.progress(logformat.parse_log(lines)).saved == 86
    assert logformat.progress(logformat.parse_log([])).saved is None


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
    with pytest.raises(OptionError, match="^--hosts: run .* ran on v100a, v100b, not v100a, v100b, v100d"):
        session.pick_run([*three[:2], stranger], session.TrainRequest(), "fp32")
    with pytest.raises(OptionError, match="not v100a: pass the same --hosts"):  # fewer: not a rejoin
        session.pick_run(three[:1], session.TrainRequest(), "fp32")


def test_rejoin_picks_every_host_the_run_lost_that_the_inventory_has(lost_c, monkeypatch):
    known = [HOSTS["v100c"], HOSTS["v100b"], HOSTS["v100a"]]
    assert [h.name for h in session.rejoin_hosts(known, None)] == ["v100a", "v100b", "v100c"]
    monkeypatch.setattr(session, "require_answering", lambda hosts: None)  # both answer, both keep the run
    monkeypatch.setattr(launch, "states", lambda run, hosts: [
        launch.HostState(h.name, True, True, None, [], keeper={"keeper": True}) for h in hosts])
    with pytest.raises(ClusterError, match="lost no host the inventory has"):
        session.rejoin_hosts(known[1:], None)


# 2 hosts x 2 ranks: losing v100b and growing back to it keep the tokens per update (scaled by ranks)

TWO_BY_TWO = {n: Host(name=n, address=f"10.0.0.{i}", vars={"cpu_ranks": 2})
              for i, n in enumerate(["v100a", "v100b"], 11)}


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
