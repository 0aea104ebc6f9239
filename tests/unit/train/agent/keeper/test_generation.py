"""Who trains now, as the hosts decide it among themselves (train.agent.keeper.generation)."""

from dataclasses import replace

from train.agent.keeper.generation import (
    ENDED,
    FINISHED,
    RUNNING,
    STOPPED,
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
                                                        "sha256": "s1-40", "size": 100,
                                                        "lineage": []}


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


def test_after_a_split_the_reunion_resumes_the_history_with_the_most_training_not_the_higher_generation():
    a, b = gen(2, ["v100a"]), gen(2, ["v100b"])
    assert current({"v100a": view("v100a", a), "v100b": view("v100b", b)}, ORDER) == a  # same number: a leads
    views = {"v100a": view("v100a", a, ckpt(2, 70)), "v100b": view("v100b", b, ckpt(2, 90))}
    assert best_checkpoint(views, ORDER)["host"] == "v100b"
    # the side that suffered most (more generations: flaps, crash restarts) trained less: it loses
    views = {"v100a": view("v100a", gen(2, ["v100a"]), ckpt(2, 50_000)),
             "v100b": view("v100b", gen(3, ["v100b"]), ckpt(3, 20_100))}
    assert best_checkpoint(views, ORDER)["update"] == 50_000
    # the lab's case: one side's ranks crashed during the split (generation 5, update 650), the other
    # trained on (generation 2, update 1,060): the reunion goes on from 1,060
    views = {"v100a": view("v100a", gen(2, ["v100a"]), ckpt(2, 1060), update=1060),
             "v100b": view("v100b", gen(5, ["v100b"]), ckpt(5, 650), update=650)}
    memory = LeaderMemory()
    decide("v100a", ORDER, views, set(ORDER), 100, memory)  # v100b's generation is current: a joins it...
    views["v100b"] = view("v100b", gen(5, ["v100b"]), ckpt(5, 660), update=660)  # ...at its next save
    reunion = decide("v100a", ORDER, views, set(ORDER), 110, memory)
    assert reunion.members == tuple(ORDER) and reunion.number == 6
    assert reunion.source["host"] == "v100a" and reunion.source["update"] == 1060


def lineage_ckpt(number, leader, update, lineage):
    return Checkpoint(number, update, f"{leader}{number}-{update}", 100, lineage=tuple(lineage))


def test_a_hosts_older_save_of_the_same_history_is_replaced_another_historys_is_not():
    from train.agent.keeper.generation import descends_from, lineage_after

    g1 = lineage_after(None, 1, "v100a")  # ((1, v100a, 0),)
    ancestor = lineage_ckpt(1, "v100a", 40, g1)
    g2 = lineage_after(ancestor.to_dict(), 2, "v100a")  # v100a alone from update 40
    newest = lineage_ckpt(2, "v100a", 90, g2).to_dict()
    assert descends_from(newest, ancestor)  # update 40 of generation 1: the start of generation 2
    # v100b's side of the split also began at 40 (generation 2 led by v100b): another history
    other_side = lineage_ckpt(2, "v100b", 60, lineage_after(ancestor.to_dict(), 2, "v100b"))
    assert not descends_from(newest, other_side)
    # generation 1 went on to update 50 on a host that v100a's generation 2 did not start from
    assert not descends_from(newest, lineage_ckpt(1, "v100a", 50, g1))


THREE = ["a", "b", "c"]


def three(hears: dict[str, set[str]], gens: dict[str, Generation], saved: int = 40) -> dict[str, View]:
    return {h: View(h, gens[h], ckpt(gens[h].number, saved) if h == "a" else None, RUNNING, active=gens[h].number,
                    active_members=gens[h].members, hears=tuple(sorted(hears[h]))) for h in THREE}


def test_with_three_hosts_a_cut_off_minority_never_trains_and_the_majority_goes_on():
    g = gen(1, THREE)
    hears = {"a": {"a", "b"}, "b": {"a", "b"}, "c": {"c"}}
    views = three(hears, {h: g for h in THREE})
    assert decide("c", THREE, {"c": views["c"], "a": views["a"], "b": views["b"]}, {"c"}, 100, LeaderMemory()) is None
    majority = decide("a", THREE, views, {"a", "b"}, 100, LeaderMemory())
    assert majority.members == ("a", "b") and "c lost" in majority.reason


def test_a_one_sided_partition_makes_one_generation_not_two_leaders_taking_turns():
    """a-b cut, both still hear c: rounds of every host adopting what it hears and its leader deciding."""
    gens = {h: gen(1, THREE) for h in THREE}
    hears = {"a": {"a", "c"}, "b": {"b", "c"}, "c": {"a", "b", "c"}}
    made = []
    for t in range(40):
        views = three(hears, gens)
        for host in THREE:
            heard = {h: views[h] for h in hears[host]}
            newest = current(heard, THREE, host)
            if newest.key(THREE) > gens[host].key(THREE):
                gens[host] = newest
            new = decide(host, THREE, heard, hears[host], 100 + t, LeaderMemory())
            if new is not None:
                gens[host] = new
                made.append((host, new.members))
    assert made == [("a", ("a", "c"))]  # b hears from c that a is there: a leads, b waits outside
    assert gens["c"].members == ("a", "c")


def test_a_cut_off_host_that_gave_up_does_not_stop_the_healthy_run_it_reconnects_to():
    running = gen(3, ["v100a"])
    gave_up = Generation(number=7, members=(), reason="restarts exhausted", time=0.0, stopped="restarts exhausted",
                         among=("v100b",))
    views = {"v100a": view("v100a", running, ckpt(3, 500)), "v100b": view("v100b", gave_up, ckpt(2, 80), ranks="idle")}
    assert current(views, ORDER, "v100a") == running  # a does not adopt b's stop
    assert current(views, ORDER, "v100b") == gave_up
    back = decide("v100a", ORDER, views, set(ORDER), 100, LeaderMemory())
    assert back is None  # taken back at a's next checkpoint, not before
    views["v100a"] = view("v100a", running, ckpt(3, 520))
    memory = LeaderMemory()
    decide("v100a", ORDER, {**views, "v100a": view("v100a", running, ckpt(3, 500))}, set(ORDER), 100, memory)
    back = decide("v100a", ORDER, views, set(ORDER), 110, memory)
    assert back.members == tuple(ORDER) and back.number == 8 and not back.stopped and back.source["host"] == "v100a"


def test_no_host_starts_from_nothing_while_a_lost_host_holds_the_runs_checkpoint():
    g = gen(4, ORDER)
    memory = LeaderMemory()
    # v100b never got a copy (it joined after the last save); v100a, holding update 90,050, is lost
    views = {"v100a": view("v100a", g, ckpt(4, 90_050), update=90_100), "v100b": view("v100b", g)}
    assert decide("v100b", ORDER, views, {"v100b"}, 100, memory) is None
    assert "only v100a (update 90050) holds a checkpoint" in memory.waiting
    views["v100b"] = view("v100b", g, ckpt(4, 90_000))  # with a copy of its own it goes on
    assert decide("v100b", ORDER, views, {"v100b"}, 101, memory).source["update"] == 90_000


def test_a_receiver_that_cannot_get_the_source_is_left_out_never_the_checkpoint_its_holder_still_holds():
    """v100b back with a full disk (or a reset connection) fails to copy v100a's update 80: v100b is left
    out and v100a goes on from 80, not from v100b's 60 (the run's rollback, defect 1 of issue 52)."""
    g = Generation(number=5, members=tuple(ORDER), reason="test", time=0.0,
                   source={"host": "v100a", "generation": 4, "update": 80, "sha256": "good", "size": 100})
    views = {"v100a": view("v100a", g, Checkpoint(4, 80, "good", 100), ranks="idle"),
             "v100b": View("v100b", g, ckpt(4, 60), "idle", cannot_get="good",
                           cannot_get_why="OSError: [Errno 28] No space left on device")}
    new = decide("v100a", ORDER, views, set(ORDER), 100, LeaderMemory())
    assert new.number == 6 and new.members == ("v100a",) and new.source["update"] == 80
    assert "v100b left out" in new.reason and "No space left" in new.reason


def test_a_checkpoint_no_live_host_holds_whole_any_more_makes_the_leader_start_from_the_next_best():
    g = Generation(number=5, members=tuple(ORDER), reason="test", time=0.0,
                   source={"host": "v100a", "generation": 4, "update": 80, "sha256": "bad", "size": 100})
    # v100a found its own copy corrupt (set aside: it holds none now) and says it cannot get it
    views = {"v100a": View("v100a", g, None, "idle", cannot_get="bad", cannot_get_why="does not match"),
             "v100b": View("v100b", g, ckpt(4, 60), "idle", cannot_get="bad",
                           cannot_get_why="sha256 3f2a: the manifest says bad")}
    new = decide("v100a", ORDER, views, set(ORDER), 100, LeaderMemory())
    assert new.number == 6 and new.source["host"] == "v100b" and new.source["update"] == 60
    assert "could not be copied whole" in new.reason and "v100b: sha256 3f2a" in new.reason


def test_a_host_without_room_for_the_checkpoint_is_not_taken_back_until_it_has():
    g = gen(7, ["v100a"])
    memory = LeaderMemory()
    full = View("v100b", gen(6, ORDER), None, "idle", cannot_hold="v100b: /data has 10 free, the checkpoint needs 100")
    views = {"v100a": view("v100a", g, ckpt(7, 50)), "v100b": full}
    assert decide("v100a", ORDER, views, set(ORDER), 100, memory) is None
    assert "cannot take the run's checkpoint" in memory.waiting and "/data has 10 free" in memory.waiting
    views["v100b"] = replace(full, cannot_hold="")
    decide("v100a", ORDER, views, set(ORDER), 101, memory)
    views["v100a"] = view("v100a", g, ckpt(7, 60))  # the next save: taken back
    assert decide("v100a", ORDER, views, set(ORDER), 102, memory).members == tuple(ORDER)


def test_ranks_their_keeper_stopped_are_restarted_without_spending_the_restart_budget():
    """etcd cut four times: each time the fence stops a host's ranks (STOPPED) and the others' fail with
    them (ENDED). The restart is not a crash: the budget of 3 an hour is untouched (defect 2 of issue 52)."""
    g = Generation(number=9, members=tuple(ORDER), reason="test", time=0.0, restarts=(3000.0, 3100.0, 3200.0))
    views = {"v100a": view("v100a", g, ckpt(9, 10), ranks=ENDED), "v100b": view("v100b", g, ranks=STOPPED)}
    memory = LeaderMemory()
    assert decide("v100a", ORDER, views, set(ORDER), 3300, memory, tick=5.0) is None  # the grace first
    new = decide("v100a", ORDER, views, set(ORDER), 3330, memory, tick=31.0)
    assert not new.stopped and new.members == tuple(ORDER) and new.restarts == g.restarts
    assert "stopped by their keeper" in new.reason


def test_the_wall_clock_stepped_back_an_hour_does_not_postpone_a_crash_restart():
    g = gen(3, ORDER)
    views = {"v100a": view("v100a", g, ckpt(3, 10), ranks=ENDED), "v100b": view("v100b", g, ranks=ENDED)}
    memory = LeaderMemory()
    assert decide("v100a", ORDER, views, set(ORDER), 10_000, memory, tick=100.0) is None
    new = decide("v100a", ORDER, views, set(ORDER), 10_000 - 3600, memory, tick=126.0)
    assert new is not None and "restarting" in new.reason


def test_the_restart_budget_survives_a_new_leader_and_a_flapping_host_waits_instead_of_stopping_the_run():
    g = Generation(number=9, members=tuple(ORDER), reason="test", time=0.0, restarts=(3000.0, 3100.0, 3200.0))
    views = {"v100a": view("v100a", g, ckpt(9, 10)), "v100b": view("v100b", g, ranks=ENDED)}
    fresh = LeaderMemory()  # a keeper started again: nothing in memory
    decide("v100a", ORDER, views, set(ORDER), 3300, fresh)
    stopped = decide("v100a", ORDER, views, set(ORDER), 3330, fresh)
    assert stopped.stopped and "3 restarts" in stopped.reason and stopped.among == tuple(ORDER)
    # a link that flaps: six membership changes this hour; v100b is back but waits, the run goes on
    flaps = tuple(3000.0 + i for i in range(6))
    alone = Generation(number=12, members=("v100a",), reason="test", time=0.0, churn=flaps)
    memory = LeaderMemory()
    views = {"v100a": view("v100a", alone, ckpt(12, 10)), "v100b": view("v100b", gen(11, ORDER), ranks="idle")}
    decide("v100a", ORDER, views, set(ORDER), 3300, memory)
    views["v100a"] = view("v100a", alone, ckpt(12, 20))
    assert decide("v100a", ORDER, views, set(ORDER), 3310, memory) is None and "changed 6 times" in memory.waiting
    assert decide("v100a", ORDER, views, set(ORDER), 3000 + 3600 + 1, memory).members == tuple(ORDER)
    fewer = LeaderMemory()  # a run that set rejoins_per_hour=2: two changes are enough to wait
    alone = Generation(number=12, members=("v100a",), reason="test", time=0.0, churn=flaps[:2])
    views = {"v100a": view("v100a", alone, ckpt(12, 10)), "v100b": view("v100b", gen(11, ORDER), ranks="idle")}
    decide("v100a", ORDER, views, set(ORDER), 3300, fewer, max_rejoins=2)
    views["v100a"] = view("v100a", alone, ckpt(12, 20))
    assert decide("v100a", ORDER, views, set(ORDER), 3310, fewer, max_rejoins=2) is None
    assert "under 2" in fewer.waiting


def test_each_save_is_held_by_a_majority_of_the_generations_hosts():
    from train.agent.keeper.generation import copies_from

    assert [copies_from(("a", "b"), h) for h in "ab"] == [None, "a"]
    assert [copies_from(("a", "b", "c"), h) for h in "abc"] == [None, "a", None]  # 2 of 3
    assert [copies_from(("a", "b", "c", "d"), h) for h in "abcd"] == [None, "a", "b", None]  # 3 of 4


def test_ranks_that_crash_with_every_host_live_restart_then_the_run_stops_after_three():
    g = gen(5, ORDER)
    memory = LeaderMemory()
    views = {"v100a": view("v100a", g, ckpt(5, 10)), "v100b": view("v100b", g, ranks=ENDED)}
    assert decide("v100a", ORDER, views, set(ORDER), 0, memory) is None  # a lost peer is decided first
    made = []
    for t in (30, 100, 200, 300):  # each restart's generation carries the budget to the next decision
        views = {"v100a": view("v100a", g, ckpt(g.number, 10)), "v100b": view("v100b", g, ranks=ENDED)}
        decide("v100a", ORDER, views, set(ORDER), t - 26, memory)
        made.append(decide("v100a", ORDER, views, set(ORDER), t, memory))
        g = made[-1]
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
    from train.agent.keeper.ranks import how_ranks_ended

    lines = ['  File "/opt/tandem/venv/lib/python3.11/site-packages/torch/distributed/run.py", line 1028, in main',
             "torch.distributed.elastic.multiprocessing.api.SignalException: Process 3033 got signal: 15"]
    assert how_ranks_ended(lines).startswith("torch.distributed.elastic.multiprocessing.api.SignalException")
    assert how_ranks_ended(["  exitcode  : -9 (pid: 1234)"]) == "exitcode  : -9 (pid: 1234)"
    assert how_ranks_ended(["INFO | train_inner | {}"]) == "its ranks exited"


def test_two_sides_of_a_split_share_a_number_but_not_a_generation():
    from train.agent.keeper.generation import runs_in

    a_side, b_side, merged = gen(3, ["v100a"]), gen(3, ["v100b"]), gen(3, ORDER)
    assert runs_in(view("v100b", b_side), b_side) and not runs_in(view("v100b", b_side), merged)
    assert current({"v100a": view("v100a", merged), "v100b": view("v100b", b_side)}, ORDER) == merged
    assert a_side.key(ORDER) > b_side.key(ORDER)  # the same number: the side led by the first host


def test_a_leader_that_hears_everyone_leaves_out_a_host_its_peers_cannot_reach():
    """c holds etcd's lease and hears a and b, but a and b cannot reach each other: the ranks of all
    three would crash at every start; a and c train, b waits, and is not taken back while cut."""
    g = gen(1, THREE)
    hears = {"a": {"a", "c"}, "b": {"b", "c"}, "c": {"a", "b", "c"}}
    views = three(hears, {h: g for h in THREE})
    new = decide("c", THREE, views, {"a", "b", "c"}, 100, LeaderMemory(), agreed=g)
    assert new.members == ("a", "c") and "b lost at update" in new.reason and "one-sided partition" in new.reason
    views = three(hears, {h: new for h in THREE})
    assert decide("c", THREE, views, {"a", "b", "c"}, 110, LeaderMemory(), agreed=new) is None  # stays


def test_a_host_back_from_a_reboot_heard_before_it_is_heard_never_pushes_the_training_host_out():
    """The lab's case: v100a (first in the order) reboots; v100b trains alone; v100a's keeper hears
    v100b a round before v100b hears it. v100b is not 'cut off': v100a waits, then rejoins."""
    alone = gen(4, ["v100b"])
    views = {"v100a": View("v100a", gen(3, ORDER), ckpt(3, 150), "idle", hears=("v100a", "v100b")),
             "v100b": View("v100b", alone, ckpt(4, 170), RUNNING, active=4, active_members=("v100b",),
                           hears=("v100b",))}
    memory = LeaderMemory()
    assert decide("v100a", ORDER, views, set(ORDER), 100, memory) is None
    views["v100b"] = replace(views["v100b"], hears=("v100a", "v100b"))
    assert decide("v100a", ORDER, views, set(ORDER), 102, memory) is None  # at v100b's next checkpoint
    views["v100b"] = replace(views["v100b"], checkpoint=ckpt(4, 180))
    back = decide("v100a", ORDER, views, set(ORDER), 110, memory)
    assert back.members == tuple(ORDER) and "v100a rejoined at update 180" in back.reason
    assert back.source["host"] == "v100b"


def leaving(v: View, deadline: float = 1060.0, after: int | None = 40) -> View:
    """`v` with its cloud's notice (train.agent.keeper.preemption), as its keeper's heartbeat says it."""
    return replace(v, leaving=deadline, leaving_why="AWS spot notice (terminate at 00:17:40Z)", leaving_after=after)


def test_a_host_its_cloud_reclaims_is_left_out_once_rank_0s_save_reaches_the_others_and_never_taken_back():
    g1, memory = gen(1, ORDER), LeaderMemory()
    views = {"v100a": view("v100a", g1, ckpt(1, 40), update=52), "v100b": leaving(view("v100b", g1, ckpt(1, 40)))}
    assert decide("v100a", ORDER, views, set(ORDER), 1000, memory) is None  # rank 0 saves now
    assert "v100b leaving (AWS spot notice (terminate at 00:17:40Z)): waiting for rank 0's save" in memory.waiting
    views["v100a"] = view("v100a", g1, ckpt(1, 53), update=53)  # its save at the notice
    new = decide("v100a", ORDER, views, set(ORDER), 1002, memory)
    assert new.members == ("v100a",) and new.number == 2 and new.source["update"] == 53
    assert new.reason == "v100b leaving at update 53 (AWS spot notice (terminate at 00:17:40Z))"
    views = {"v100a": view("v100a", new, ckpt(2, 90), update=90), "v100b": leaving(view("v100b", g1, ranks="idle"))}
    assert decide("v100a", ORDER, views, set(ORDER), 1010, memory) is None  # still live, still leaving: not back


def test_a_leaving_rank_0_host_is_left_out_once_the_next_host_holds_its_save():
    g1 = gen(1, ORDER)
    views = {"v100a": leaving(view("v100a", g1, ckpt(1, 53), update=53)), "v100b": view("v100b", g1, ckpt(1, 40))}
    assert decide("v100a", ORDER, views, set(ORDER), 1000, LeaderMemory()) is None  # v100b fetches it meanwhile
    views["v100b"] = view("v100b", g1, ckpt(1, 53))
    new = decide("v100a", ORDER, views, set(ORDER), 1001, LeaderMemory())  # the leaving host leads still
    assert new.members == ("v100b",) and new.source == {**views["v100b"].checkpoint.to_dict(), "host": "v100b"}


def test_without_a_save_the_leaving_host_is_left_out_before_its_deadline_from_the_newest_held():
    """Rank 0 could not save alone (local SGD averages every rank at a save): the run still goes on
    without the host before it vanishes mid-all-reduce, from the newest save the others hold."""
    g1 = gen(1, ORDER)
    views = {"v100a": view("v100a", g1, ckpt(1, 40), update=70), "v100b": leaving(view("v100b", g1, ckpt(1, 40)))}
    assert decide("v100a", ORDER, views, set(ORDER), 1049, LeaderMemory()) is None
    new = decide("v100a", ORDER, views, set(ORDER), 1050, LeaderMemory())  # 10 s before its deadline
    assert new.members == ("v100a",) and new.source["update"] == 40
