"""What the controller tells the hosts' keepers, and how it reads their record (train.run.keepers)."""

import pytest

from train.cluster import Host
from train.recipe.record import Run
from train.run import keepers
from train.run.launch import HostState

HOSTS = [Host("v100a", "10.0.0.1", cluster_address="172.30.0.11"),
         Host("v100b", "10.0.0.2", cluster_address="172.30.0.12")]


def test_every_membership_gets_its_commands_with_the_batch_kept():
    run = Run(run_id="r1", hosts=["v100a", "v100b"], preset="tiny", overrides=[], dataset="synthetic")
    told = keepers.spec(run, HOSTS)
    assert set(told["commands"]) == {"v100a,v100b", "v100a", "v100b"}
    assert told["update_freq"] == {"v100a,v100b": 1, "v100a": 2, "v100b": 2}
    alone = told["commands"]["v100b"]["v100b"]
    assert "--nnodes 1 --node_rank 0 --master_addr 172.30.0.12" in alone and "--update-freq 2" in alone
    both = told["commands"]["v100a,v100b"]["v100b"]
    assert "--nnodes 2 --node_rank 1 --master_addr 172.30.0.11" in both and "--update-freq" not in both
    assert told["addresses"] == {"v100a": "172.30.0.11", "v100b": "172.30.0.12"}
    assert told["port"] == run.master_port + keepers.PORT_OFFSET


def test_on_fewer_hosts_the_checkpoint_interval_keeps_its_minutes():
    """Big's interval chosen for ~10 minutes on 2 hosts: alone, each update takes twice as long (update
    freq 2), so a save every half as many updates; the user's --set and tiny's fixed 50 stay."""
    big = Run(run_id="r2", hosts=["v100a", "v100b"], preset="transformer_vaswani_wmt_en_de_big", overrides=[],
              dataset="wmt16", update_freq=64, max_tokens=3584, save_interval_updates=200)  # 458,752 a update
    told = keepers.spec(big, HOSTS)
    assert (told["update_freq"]["v100a,v100b"], told["update_freq"]["v100a"]) == (64, 128)
    assert "--save-interval-updates 200" in told["commands"]["v100a,v100b"]["v100a"]
    assert "--save-interval-updates 100" in told["commands"]["v100a"]["v100a"]
    given = Run(run_id="r3", hosts=["v100a", "v100b"], preset="transformer_vaswani_wmt_en_de_big",
                overrides=["save_interval_updates=300"], dataset="wmt16")
    assert "--save-interval-updates 300" in keepers.spec(given, HOSTS)["commands"]["v100a"]["v100a"]
    tiny = Run(run_id="r4", hosts=["v100a", "v100b"], preset="tiny", overrides=[], dataset="synthetic",
               save_interval_updates=50)
    assert "--save-interval-updates 50" in keepers.spec(tiny, HOSTS)["commands"]["v100a"]["v100a"]


def keeper(timeline, alive=True, ended=""):
    return {"keeper": alive, "ended": ended, "timeline": timeline, "generation": None}


def test_the_record_merges_every_hosts_timeline_once_and_follows_the_newest_membership(tmp_path, monkeypatch):
    monkeypatch.setattr("train.recipe.record.REPORTS", tmp_path)
    run = Run(run_id="r1", hosts=["v100a", "v100b"], preset="tiny", overrides=[], dataset="synthetic")
    start = {"generation": 1, "hosts": ["v100a", "v100b"], "time": 1.0, "why": "start", "update_freq": 1}
    lost = {"generation": 2, "hosts": ["v100b"], "time": 2.0, "why": "v100a lost at update 57", "update_freq": 2,
            "from_update": 50, "source": "v100b"}
    states = [HostState("v100a", False, False, None, []),
              HostState("v100b", True, True, None, [], keeper=keeper([start, lost]))]
    assert keepers.sync(run, states) == [start, lost]
    assert run.hosts == ["v100b"] and run.update_freq == 2 and run.members == [start, lost]
    assert keepers.sync(run, states) == []  # nothing new
    assert keepers.rank_order(run, states)[0].name == "v100b"
    assert keepers.keeper_ended(states) is None  # v100b's keeper keeps the run
    assert "generation 2: v100b from update 50 (v100b's checkpoint), update-freq 2; v100a lost at update 57" \
        in keepers.change_line(lost)


def test_the_run_is_over_once_no_reachable_keeper_runs():
    ended = [HostState(n, False, True, None, [], keeper=keeper([], alive=False, ended=why))
             for n, why in (("v100a", "finished"), ("v100b", "stopped (fab stop on v100a)"))]
    assert keepers.keeper_ended(ended) == "finished"


def test_after_a_split_the_record_keeps_the_history_the_run_went_on_with():
    def e(generation, hosts, source=None, source_generation=None, from_update=0):
        return {"generation": generation, "hosts": hosts, "source": source, "source_generation": source_generation,
                "from_update": from_update, "time": float(generation)}

    start = e(1, ["v100a", "v100b"])
    a_alone, b_alone = e(2, ["v100a"], "v100a", 1, 50), e(2, ["v100b"], "v100b", 1, 50)
    merged_from_b = e(3, ["v100a", "v100b"], "v100b", 2, 120)
    assert keepers.lineage([start, a_alone, b_alone, merged_from_b]) == [start, b_alone, merged_from_b]
    merged_from_a = e(3, ["v100a", "v100b"], "v100a", 2, 110)
    assert keepers.lineage([start, a_alone, b_alone, merged_from_a]) == [start, a_alone, merged_from_a]
    restarted = e(4, ["v100a", "v100b"], "v100a", 3, 150)
    assert keepers.lineage([start, a_alone, b_alone, merged_from_a, restarted])[-2:] == [merged_from_a, restarted]


def test_following_says_each_change_once_even_the_side_of_a_split_that_was_set_aside(tmp_path, monkeypatch):
    monkeypatch.setattr("train.recipe.record.REPORTS", tmp_path)
    run = Run(run_id="r1", hosts=["v100a", "v100b"], preset="tiny", overrides=[], dataset="synthetic")
    start = {"generation": 1, "hosts": ["v100a", "v100b"], "time": 1.0, "why": "start", "from_update": 0}
    a_alone = {"generation": 2, "hosts": ["v100a"], "time": 2.0, "why": "v100b lost", "source": "v100a",
               "source_generation": 1, "from_update": 50}
    b_alone = {**a_alone, "hosts": ["v100b"], "why": "v100a lost", "source": "v100b"}
    merged = {"generation": 3, "hosts": ["v100a", "v100b"], "time": 3.0, "why": "v100b rejoined",
              "source": "v100a", "source_generation": 2, "from_update": 90}
    states = [HostState("v100a", True, True, None, [], keeper=keeper([start, a_alone, merged])),
              HostState("v100b", True, True, None, [], keeper=keeper([start, b_alone]))]
    said: set = set()
    assert len(keepers.sync(run, states, said)) == 4
    assert keepers.sync(run, states, said) == [] and keepers.sync(run, states, said) == []
    assert run.members == [start, a_alone, merged] and run.hosts == ["v100a", "v100b"]


def test_status_lists_each_history_set_aside_with_how_to_train_from_it():
    aside = {"generation": 5, "update": 650, "why": "another history", "size": 2_530_000_000,
             "path": "/data/tandem/runs/r1/checkpoints/set-aside/checkpoint_last.g5-u650.pt"}
    states = [HostState("v100a", True, True, None, [], keeper={"set_aside": []}),
              HostState("v100b", True, True, None, [], keeper={"set_aside": [aside]})]
    lines = keepers.set_aside_lines(states)
    assert lines[0] == ("v100b: update 650 (generation 5, another history), 2.53 GB at "
                        "/data/tandem/runs/r1/checkpoints/set-aside/checkpoint_last.g5-u650.pt")
    assert "fab train --new --set restore_file=PATH" in lines[1]
    assert keepers.set_aside_lines(states[:1]) == []


def test_a_new_start_keeps_the_token_the_runs_keepers_hold(monkeypatch):
    """`fab train` on a run whose keepers run: a host it cannot reach now keeps the spec it had; with
    the same token it still talks to the others when it returns (a new token would split the run)."""
    import json

    from train.cluster import GroupResult, HostResult

    run = Run(run_id="r1", hosts=["v100a", "v100b"], preset="tiny", overrides=[], dataset="synthetic")
    answers = GroupResult([("v100a", HostResult("v100a", error=OSError("unreachable"))),
                           ("v100b", HostResult("v100b", stdout=json.dumps({"token": "held"}), exited=0))])
    monkeypatch.setattr(keepers, "run_all", lambda hosts, command, **kw: answers)
    assert keepers.run_token(run, HOSTS) == "held"
    nothing = GroupResult([(h.name, HostResult(h.name, stdout="", exited=0)) for h in HOSTS])
    monkeypatch.setattr(keepers, "run_all", lambda hosts, command, **kw: nothing)
    assert keepers.run_token(run, HOSTS) is None  # a new run: a new token


def test_the_keepers_budgets_are_the_runs_own_when_set():
    """`--set restarts_per_hour=5,rejoins_per_hour=2` reaches every keeper (the defaults are 3 and 6) and
    never fairseq's command line."""
    run = Run(run_id="r5", hosts=["v100a", "v100b"], preset="tiny", overrides=[], dataset="synthetic")
    assert (keepers.spec(run, HOSTS)["max_restarts"], keepers.spec(run, HOSTS)["max_rejoins"]) == (3, 6)
    run.overrides = ["restarts_per_hour=5", "rejoins_per_hour=2"]
    told = keepers.spec(run, HOSTS)
    assert (told["max_restarts"], told["max_rejoins"]) == (5, 2)
    assert "restarts-per-hour" not in told["commands"]["v100a,v100b"]["v100a"]
    assert "rejoins-per-hour" not in told["commands"]["v100a,v100b"]["v100a"]


def test_a_budget_of_0_means_never_and_a_negative_one_is_refused_at_set():
    from train.recipe.presets import OverrideError

    run = Run(run_id="r6", hosts=["v100a", "v100b"], preset="tiny", overrides=["restarts_per_hour=0"],
              dataset="synthetic")
    assert keepers.spec(run, HOSTS)["max_restarts"] == 0
    run.overrides = ["rejoins_per_hour=-1"]
    with pytest.raises(OverrideError, match="rejoins_per_hour=-1`: expected 0 or more"):
        keepers.spec(run, HOSTS)
