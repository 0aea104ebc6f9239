"""The keepers' agreement on the real lab (train.agent.keeper.generation, keeper, replica): a split during
which one side crashes (its generations outnumber the other's) is rejoined on the side with the
most training, the other history set aside whole and shown by `fab status`; a keeper or its
supervisor killed with SIGKILL leaves the ranks training; a corrupt copy is never resumed from, and
no host starts the run from nothing while the host holding it is away. Each prints its measured
times (docs/training.md, "What happens when...")."""

from __future__ import annotations

import json
import re
import subprocess
import time

import pytest
from labtools import fab, set_links, ssh
from test_keepers import ranks, timeline, update, wait_for
from test_train import KILL_THE_RANK

RUNS = "/data/tandem/runs"


def cut(cfg, host: str, state: str = "down") -> None:
    """Pull (or plug back) `host`'s cluster cable only: the keepers lose each other, the laptop still
    reaches it over the management network."""
    subprocess.run(["ip", "link", "set", cfg.cluster_veth(host), state], check=True)


def keeper_log(cfg, host: str, run_id: str) -> str:
    return ssh(cfg, host, f"cat {RUNS}/{run_id}/keeper/keeper.log 2>/dev/null || true").stdout


def manifest(cfg, host: str, run_id: str) -> dict:
    out = ssh(cfg, host, f"cat {RUNS}/{run_id}/checkpoints/.keep/manifest.json 2>/dev/null || true").stdout
    return json.loads(out) if out.strip() else {}


def start(data_ready, prefix: str, settings: str = "") -> str:
    run_id = time.strftime(f"run-{prefix}-%Y%m%d-%H%M%S")
    fab(data_ready, "train", "--new", "--detach", "--run", run_id, "--set",
        "max_update=100000,save_interval_updates=25" + (f",{settings}" if settings else ""))
    # a checkpoint (every 25 updates here: tiny's 50 is half a minute more on the lab) made and held by both hosts
    wait_for(lambda: update(data_ready.cfg, run_id) >= 35 and manifest(data_ready.cfg, "v100b", run_id), 150)
    return run_id


def stop(data_ready, run_id: str) -> None:
    set_links(data_ready.cfg, "v100b", "up")
    fab(data_ready, "stop", "--run", run_id, check=False)
    left = [h for h in data_ready.cfg.names if ranks(data_ready.cfg, h, run_id)]
    assert not left, f"ranks left on {left}"


def test_a_split_whose_one_side_crashes_is_rejoined_on_the_side_with_more_training(data_ready):
    cfg = data_ready.cfg
    run_id = start(data_ready, "split")
    try:
        cut(cfg, "v100b")  # both sides go on alone
        wait_for(lambda: any(e["hosts"] == ["v100b"] for e in timeline(cfg, "v100b", run_id))
                 and ranks(cfg, "v100b", run_id), 120)
        # v100b's side suffers: its ranks crash, its keeper restarts them (one more generation there). Killed
        # once they train alone (past their checkpoint of 25): a kill as they launch found no rank yet (CI, 29 Nov)
        alone = next(e for e in timeline(cfg, "v100b", run_id) if e["hosts"] == ["v100b"])
        wait_for(lambda: update(cfg, run_id, "v100b") >= (alone["at_update"] or 0) + 5, 120)  # its log goes on
        ssh(cfg, "v100b", KILL_THE_RANK)
        wait_for(lambda: len([e for e in timeline(cfg, "v100b", run_id) if e["hosts"] == ["v100b"]]) >= 2
                 and ranks(cfg, "v100b", run_id), 120)
        a_side, b_side = timeline(cfg, "v100a", run_id)[-1], timeline(cfg, "v100b", run_id)[-1]
        assert b_side["generation"] > a_side["generation"], (a_side, b_side)  # the old rule's winner
        ahead = manifest(cfg, "v100a", run_id)
        behind = manifest(cfg, "v100b", run_id)
        assert ahead["update"] > behind["update"], (ahead, behind)
        cut(cfg, "v100b", "up")
        plugged = time.monotonic()

        def reunited():
            """one world again, after the split"""
            return [e for e in timeline(cfg, "v100b", run_id) if e["hosts"] == ["v100a", "v100b"]
                    and e["generation"] > b_side["generation"]]

        wait_for(reunited, 180)
        back = time.monotonic() - plugged
        joined = reunited()[-1]
        assert joined["source"] == "v100a" and joined["from_update"] >= ahead["update"], joined
        wait_for(lambda: "set aside whole" in keeper_log(cfg, "v100b", run_id), 60)
        aside = ssh(cfg, "v100b", f"ls {RUNS}/{run_id}/checkpoints/set-aside/").stdout.split()
        kept = [re.fullmatch(r"checkpoint_last\.g(\d+)-u(\d+)\.pt", name) for name in aside]
        kept = [(int(m[1]), int(m[2])) for m in kept if m]
        # v100b's own history, whole: its side's last save (at or after the one seen before the reunion)
        assert any(g >= behind["generation"] and behind["update"] <= u < joined["from_update"] for g, u in kept), aside
        generation, update_ = max(kept)
        status = fab(data_ready, "status", "--run", run_id, check=False).stdout
        assert re.search(rf"v100b: update {update_:,} \(generation {generation}", status), status
    finally:
        stop(data_ready, run_id)
    print(f"split with v100b's ranks crashed once: reunion {back:.0f} s after the cable was back, from "
          f"v100a's update {joined['from_update']} (generation {a_side['generation']}) over v100b's "
          f"{update_} (generation {generation}), set aside on v100b")


def test_a_keeper_or_its_supervisor_killed_with_sigkill_leaves_the_ranks_training(data_ready):
    cfg = data_ready.cfg
    run_id = start(data_ready, "sigkill")
    try:
        before = ranks(cfg, "v100a", run_id)
        supervisor = ssh(cfg, "v100a", f"cat {RUNS}/{run_id}/keeper/keeper.pid").stdout.strip()
        killed = time.monotonic()
        ssh(cfg, "v100a", f"kill -9 {supervisor}")

        def new_supervisor():
            """a new supervisor, started by the keeper it left"""
            pid = ssh(cfg, "v100a", f"cat {RUNS}/{run_id}/keeper/keeper.pid").stdout.strip()
            return pid != supervisor and ssh(cfg, "v100a", f"kill -0 {pid}").returncode == 0 and pid

        pid = wait_for(new_supervisor, 60) and new_supervisor()
        replaced = time.monotonic() - killed
        keeper = ssh(cfg, "v100a", f"pgrep -f '[k]eeper.loop run --run {RUNS}/{run_id}'").stdout.split()
        assert keeper, "no keeper under the new supervisor"
        ssh(cfg, "v100a", f"kill -9 {keeper[0]}")  # the keeper proper: its supervisor starts it again
        wait_for(lambda: ssh(cfg, "v100a", f"pgrep -f '[k]eeper.loop run --run {RUNS}/{run_id}'").stdout.split()
                 not in ([], keeper), 60)
        at = update(cfg, run_id)
        wait_for(lambda: update(cfg, run_id) > at + 20, 60)
        assert ranks(cfg, "v100a", run_id) == before, "a rank was restarted"
        assert [e["generation"] for e in timeline(cfg, "v100a", run_id)] == [1]
        assert f"a new one ({pid}) takes over" in keeper_log(cfg, "v100a", run_id)
    finally:
        stop(data_ready, run_id)
    print(f"supervisor killed with SIGKILL: a new one in {replaced:.1f} s; the keeper killed: started again; "
          "the ranks never restarted")


@pytest.mark.extra(covered_by="the fault simulator's flipped bytes and torn manifests (tests/sim: never_rolls_back, "
                              "never_from_nothing over 2,000 schedules) and the keeper unit tests' sha256 checks")
def test_a_corrupt_copy_is_never_resumed_and_no_host_starts_from_nothing_while_rank_0s_is_away(data_ready):
    cfg = data_ready.cfg
    run_id = start(data_ready, "corrupt")
    try:
        held = manifest(cfg, "v100b", run_id)
        # one byte flipped in v100b's copy, its size unchanged (bit rot, a bad disk)
        ssh(cfg, "v100b", f"printf X | dd of={RUNS}/{run_id}/checkpoints/.keep/checkpoint_last.pt bs=1 "
                          f"seek=4096 conv=notrunc status=none")
        cut(cfg, "v100b")
        supervise = ssh(cfg, "v100b", f"pgrep -af 'keeper.loop [s]upervise --run {RUNS}/{run_id}'").stdout.split()
        python = supervise[1]  # the hosts' training environment
        ssh(cfg, "v100b", f"pkill -9 -f 'train.agent.[k]eeper.loop .*{RUNS}/{run_id}'; "
                          f"pkill -9 -f '{RUNS}/{run_id}/checkpoint[s]'")  # v100b's every process of the run
        ssh(cfg, "v100b", f"{python} -m train.agent.keeper.loop launch --run {RUNS}/{run_id}")  # alone, cut off
        wait_for(lambda: "does not match its manifest's sha256" in keeper_log(cfg, "v100b", run_id), 120)
        time.sleep(30)  # lost after 20 s of silence: v100b would start now if it were allowed to
        from_nothing = [e for e in timeline(cfg, "v100b", run_id) if e["hosts"] == ["v100b"]]
        assert not from_nothing and not ranks(cfg, "v100b", run_id), from_nothing
        assert "holds a checkpoint: waiting for it" in keeper_log(cfg, "v100b", run_id)
        aside = ssh(cfg, "v100b", f"ls {RUNS}/{run_id}/checkpoints/set-aside/").stdout
        assert f"g{held['generation']}-u{held['update']}.corrupt.pt" in aside, aside
        cut(cfg, "v100b", "up")
        wait_for(lambda: any(e["hosts"] == ["v100a", "v100b"] and e["generation"] > 1
                             for e in timeline(cfg, "v100a", run_id)) and ranks(cfg, "v100b", run_id), 180)
        assert manifest(cfg, "v100b", run_id)["sha256"] != "" and update(cfg, run_id) > held["update"]
    finally:
        stop(data_ready, run_id)


@pytest.mark.extra(covered_by="the fault simulator (tests/sim): two hosts, one isolated while its ranks crash "
                              "(the real Keeper.act, a stop that binds only the hosts that stopped)")
def test_an_isolated_host_that_exhausted_its_restarts_reconnects_without_stopping_the_run(data_ready):
    """v100b, cut off, trains alone (two hosts: both sides may); its ranks crash again and again until its
    restart budget is spent and it stops alone (restarts_per_hour=1 here: two crashes spend it). Plugged
    back and rejoined (`fab train --rejoin`, the remedy `fab status` names), its stop binds only itself:
    v100a trains on and takes v100b back; `fab stop` then ends both (the record named v100a only)."""
    cfg = data_ready.cfg
    run_id = start(data_ready, "gaveup", "restarts_per_hour=1")
    try:
        cut(cfg, "v100b")
        wait_for(lambda: any(e["hosts"] == ["v100b"] for e in timeline(cfg, "v100b", run_id))
                 and ranks(cfg, "v100b", run_id), 120)

        def gave_up():
            """v100b stopped alone, its restarts spent"""
            return any(not e["hosts"] and "restarts" in e["why"] for e in timeline(cfg, "v100b", run_id))

        crashes = 0
        while not gave_up() and crashes < 8:
            if ranks(cfg, "v100b", run_id):  # its ranks crash (the keeper restarts them while it may)
                ssh(cfg, "v100b", f"pkill -9 -f '{RUNS}/{run_id}/checkpoint[s]'")
                crashes += 1
            time.sleep(2)
        wait_for(gave_up, 60)
        a_before = timeline(cfg, "v100a", run_id)
        cut(cfg, "v100b", "up")
        plugged = time.monotonic()
        fab(data_ready, "train", "--run", run_id, "--rejoin", "--detach")

        def taken_back():
            """v100a's world takes v100b back, from v100a's checkpoint"""
            return [e for e in timeline(cfg, "v100a", run_id)[len(a_before):] if e["hosts"] == ["v100a", "v100b"]]

        wait_for(taken_back, 240)
        back = time.monotonic() - plugged
        assert taken_back()[0]["source"] == "v100a", taken_back()
        assert not [e for e in timeline(cfg, "v100a", run_id) if not e["hosts"]], timeline(cfg, "v100a", run_id)
        at = update(cfg, run_id)
        wait_for(lambda: update(cfg, run_id) > at + 10 and ranks(cfg, "v100b", run_id), 120)
    finally:
        try:
            stop(data_ready, run_id)
        finally:  # should `fab stop` leave anything, it must not hold the lab's port for the next tests
            ssh(cfg, "v100b", f"pkill -9 -f 'train.agent.[k]eeper.loop .*{RUNS}/{run_id}'; "
                              f"pkill -9 -f '{RUNS}/{run_id}/checkpoint[s]'; true")
    print(f"v100b cut off, its ranks crashed {crashes} times: stopped alone; plugged back and rejoined, taken "
          f"back by v100a's run {back:.0f} s after the cable, v100a never stopped")


def test_a_host_back_with_a_full_disk_is_left_out_never_the_checkpoint_and_taken_back_once_it_has_room(data_ready):
    """v100b is away while its /data fills (another program's file), then comes back without room for
    the run's checkpoint: it says so (host, bytes free, bytes needed), is left out, and v100a goes on from
    its own newest checkpoint (before: the whole run went back to v100b's older one); `fab status` says
    it; once the file is gone v100b is taken back by itself."""
    cfg = data_ready.cfg
    run_id = start(data_ready, "fulldisk")
    filler = "/data/tandem-filler"
    try:
        cut(cfg, "v100b")
        supervise = ssh(cfg, "v100b", f"pgrep -af 'keeper.loop [s]upervise --run {RUNS}/{run_id}'").stdout.split()
        python = supervise[1]
        ssh(cfg, "v100b", f"pkill -9 -f 'train.agent.[k]eeper.loop .*{RUNS}/{run_id}'; "
                          f"pkill -9 -f '{RUNS}/{run_id}/checkpoint[s]'")  # v100b down: every process of the run
        wait_for(lambda: any(e["hosts"] == ["v100a"] for e in timeline(cfg, "v100a", run_id)), 120)
        size = manifest(cfg, "v100a", run_id)["size"]
        free = int(ssh(cfg, "v100b", "df --output=avail -B1 /data | tail -1").stdout)
        ssh(cfg, "v100b", f"fallocate -l {free - size // 2} {filler}", sudo=True)  # less room than one checkpoint
        cut(cfg, "v100b", "up")
        back = time.monotonic()
        ssh(cfg, "v100b", f"{python} -m train.agent.keeper.loop launch --run {RUNS}/{run_id}")
        wait_for(lambda: "this host is left out until there is room" in keeper_log(cfg, "v100b", run_id), 120)
        said_in = time.monotonic() - back
        at = update(cfg, run_id)
        wait_for(lambda: update(cfg, run_id) >= at + 30, 180)  # v100a trains on meanwhile
        entries = timeline(cfg, "v100a", run_id)
        assert entries[-1]["hosts"] == ["v100a"], entries  # never taken back without room, never a rollback
        status = " ".join(fab(data_ready, "status", "--run", run_id).stdout.split())  # as one line, unwrapped
        assert "v100b: /data has" in status and "needs" in status and "left out until there is room" in status, status
        ssh(cfg, "v100b", f"rm -f {filler}", sudo=True)
        freed = time.monotonic()
        wait_for(lambda: timeline(cfg, "v100a", run_id)[-1]["hosts"] == ["v100a", "v100b"]
                 and ranks(cfg, "v100b", run_id), 240)
        taken_back = time.monotonic() - freed
        rejoined = timeline(cfg, "v100a", run_id)[-1]
        assert (rejoined["from_update"] or 0) >= max(e.get("from_update") or 0 for e in entries), rejoined
    finally:
        ssh(cfg, "v100b", f"rm -f {filler}", sudo=True)
        stop(data_ready, run_id)
    print(f"v100b back with a full /data: said {said_in:.0f} s after it was back, left out while v100a trained "
          f"on; taken back {taken_back:.0f} s after its /data had room again, from update {rejoined['from_update']}")
