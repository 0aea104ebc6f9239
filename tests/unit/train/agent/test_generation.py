"""Who trains now, as the hosts decide it among themselves (train.agent.generation)."""

from train.agent.generation import (
    ENDED,
    FINISHED,
    RUNNING,
    Checkpoint,
    Generation,
    LeaderMemory,
    View,
    best_checkpoint,
    current,
    decide,
)

ORDER = ["v100a", "v100b"]


def gen(number, members, **kw):
    return Generation(number=number, members=tuple(members), reason="test", time=0.0, **kw)


def ckpt(generation, update, sha="s"):
    return Checkpoint(generation, update, f"{sha}{generation}-{update}", 100)


def view(host, g, checkpoint=None, ranks=RUNNING, active=None, update=None):
    active = active if active is not None else (g.number if g else None)
    return View(host, g, checkpoint, ranks, active=active, active_members=g.members if g else (), update=update)


def test_a_member_silent_on_the_cluster_network_is_left_out_by_the_survivor():
    g1 = gen(1, ORDER)
    views = {"v100a": view("v100a", g1, ckpt(1, 40), update=52), "v100b": view("v100b", g1, ckpt(1, 40))}
    new = decide("v100a", ORDER, views, {"v100a"}, now=100, memory=LeaderMemory())
    assert new.members == ("v100a",) and new.number == 2
    assert new.source["update"] == 40 and "v100b lost at update 52" in new.reason


def test_rank_0s_host_lost_v100b_leads_and_resumes_from_its_own_copy():
    g1 = gen(1, ORDER)
    views = {"v100b": view("v100b", g1, ckpt(1, 40))}
    assert decide("v100a", ORDER, views, {"v100b"}, 100, LeaderMemory()) is None  # not live: not leader
    new = decide("v100b", ORDER, views, {"v100b"}, 100, LeaderMemory())
    assert new.members == ("v100b",) and new.source == {"host": "v100b", "generation": 1, "update": 40,
                                                        "sha256": "s1-40", "size": 100}


def test_only_the_first_live_host_decides():
    g1 = gen(1, ORDER)
    views = {h: view(h, g1) for h in ORDER}
    assert decide("v100b", ORDER, views, set(ORDER), 100, LeaderMemory()) is None


def test_a_returning_host_is_taken_back_at_rank_0s_next_checkpoint_not_before():
    g2 = gen(2, ["v100a"])
    memory = LeaderMemory()
    views = {"v100a": view("v100a", g2, ckpt(2, 60)), "v100b": view("v100b", gen(1, ORDER), ckpt(1, 40), ranks="idle")}
    assert decide("v100a", ORDER, views, set(ORDER), 100, memory) is None  # its checkpoint at sight: 60
    views["v100a"] = view("v100a", g2, ckpt(2, 80))
    new = decide("v100a", ORDER, views, set(ORDER), 110, memory)
    assert new.members == ("v100a", "v100b") and new.number == 3
    assert new.source["host"] == "v100a" and new.source["update"] == 80 and "v100b rejoined at update 80" in new.reason


def test_after_a_split_the_reunion_resumes_the_history_with_the_higher_generation_then_update():
    a, b = gen(2, ["v100a"]), gen(2, ["v100b"])
    assert current({"v100a": view("v100a", a), "v100b": view("v100b", b)}, ORDER) == a  # same number: a leads
    views = {"v100a": view("v100a", a, ckpt(2, 70)), "v100b": view("v100b", b, ckpt(2, 90))}
    assert best_checkpoint(views, ORDER)["host"] == "v100b"  # the newer update of the same generation
    views["v100a"] = view("v100a", a, ckpt(2, 95))
    assert best_checkpoint(views, ORDER)["host"] == "v100a"
    views["v100b"] = view("v100b", gen(3, ["v100b"]), ckpt(3, 10))
    assert best_checkpoint(views, ORDER)["host"] == "v100b"  # a later generation wins over more updates


def test_ranks_that_crash_with_every_host_live_restart_then_the_run_stops_after_three():
    g = gen(5, ORDER)
    memory = LeaderMemory()
    views = {"v100a": view("v100a", g, ckpt(5, 10)), "v100b": view("v100b", g, ranks=ENDED)}
    assert decide("v100a", ORDER, views, set(ORDER), 0, memory) is None  # a lost peer is decided first
    made = []
    for t in (30, 100, 200, 300):
        views = {"v100a": view("v100a", gen(5, ORDER), ckpt(5, 10)), "v100b": view("v100b", gen(5, ORDER), ranks=ENDED)}
        decide("v100a", ORDER, views, set(ORDER), t - 26, memory)
        made.append(decide("v100a", ORDER, views, set(ORDER), t, memory))
    assert [bool(m and m.members) for m in made] == [True, True, True, False]
    assert made[-1].stopped and "3 restarts" in made[-1].reason


def test_a_finished_run_or_a_stop_is_never_restarted():
    g = gen(1, ORDER)
    views = {"v100a": view("v100a", g, ranks=FINISHED), "v100b": view("v100b", g, ranks=ENDED)}
    assert decide("v100a", ORDER, views, {"v100a"}, 100, LeaderMemory()) is None


def test_a_start_waits_for_every_member_then_takes_the_newest_checkpoint_among_them():
    start = gen(4, ORDER, pending=True, start="t1")
    views = {"v100a": view("v100a", start, ckpt(3, 50), ranks="idle")}
    assert decide("v100a", ORDER, views, {"v100a"}, 0, LeaderMemory()) is None
    views["v100b"] = view("v100b", start, ckpt(3, 60), ranks="idle")
    resolved = decide("v100a", ORDER, views, set(ORDER), 1, LeaderMemory())
    assert not resolved.pending and resolved.number == 4 and resolved.source["host"] == "v100b"
    assert resolved.key(ORDER) > start.key(ORDER)


def test_a_lost_rank_0_host_is_named_at_its_last_heard_update_and_not_elastic_stops_the_run():
    g1 = gen(1, ORDER)
    views = {"v100a": view("v100a", g1, ckpt(1, 40), update=57), "v100b": view("v100b", g1, ckpt(1, 40))}
    new = decide("v100b", ORDER, views, {"v100b"}, 100, LeaderMemory())
    assert "v100a lost at update 57" in new.reason and new.at_update == 57
    stopped = decide("v100b", ORDER, views, {"v100b"}, 100, LeaderMemory(), elastic=False)
    assert stopped.members == () and stopped.stopped and "--no-elastic" in stopped.reason


def test_how_ranks_ended_is_the_logs_last_word_on_it_not_a_traceback_frame():
    from train.agent.keeper import how_ranks_ended

    lines = ['  File "/opt/tandem/venv/lib/python3.11/site-packages/torch/distributed/run.py", line 1028, in main',
             "torch.distributed.elastic.multiprocessing.api.SignalException: Process 3033 got signal: 15"]
    assert how_ranks_ended(lines).startswith("torch.distributed.elastic.multiprocessing.api.SignalException")
    assert how_ranks_ended(["  exitcode  : -9 (pid: 1234)"]) == "exitcode  : -9 (pid: 1234)"
    assert how_ranks_ended(["INFO | train_inner | {}"]) == "its ranks exited"


def test_two_sides_of_a_split_share_a_number_but_not_a_generation():
    from train.agent.generation import runs_in

    a_side, b_side, merged = gen(3, ["v100a"]), gen(3, ["v100b"]), gen(3, ORDER)
    assert runs_in(view("v100b", b_side), b_side) and not runs_in(view("v100b", b_side), merged)
    assert current({"v100a": view("v100a", merged), "v100b": view("v100b", b_side)}, ORDER) == merged
    assert a_side.key(ORDER) > b_side.key(ORDER)  # the same number: the side led by the first host
