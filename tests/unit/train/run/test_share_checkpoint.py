"""A restart takes the checkpoint host to host from the survivor that holds the newest; the
controller's copy is the last resort, and a backup to it under way never holds up a restart that
does not read it."""

from __future__ import annotations

import threading
import time

import pytest

from train.cluster import Host
from train.run import checkpoints
from train.run.record import Run

RUN = Run(run_id="run-x", hosts=["v100a", "v100b", "v100c"], preset="tiny", overrides=[], dataset="synthetic")
A, B, C = Host("v100a", "10.0.0.1"), Host("v100b", "10.0.0.2"), Host("v100c", "10.0.0.3")


@pytest.fixture
def cluster(monkeypatch, tmp_path):
    """What each host holds (update of its checkpoint_last.pt), the controller's copy's update,
    and a record of every copy asked for."""
    state = {"held": {}, "controller": None, "copies": []}
    monkeypatch.setattr(Run, "local_dir", property(lambda self: tmp_path / self.run_id))
    monkeypatch.setattr(checkpoints, "held", lambda run, hosts: {h.name: u for h, u in
                                                                 ((h, state["held"].get(h.name)) for h in hosts)
                                                                 if u is not None})
    monkeypatch.setattr(checkpoints, "controller_update", lambda local: state["controller"])
    monkeypatch.setattr(checkpoints, "push_between_hosts", lambda source, peers, save_dir: state["copies"].append(
        ("push", source.name, [p.name for p in peers])))
    monkeypatch.setattr(checkpoints, "fetch_checkpoints", lambda source, *a, **k: state["copies"].append(
        ("fetch", source.name)) or [])
    monkeypatch.setattr(checkpoints, "upload_checkpoints", lambda hosts, *a: state["copies"].append(
        ("upload", [h.name for h in hosts])))
    return state


def test_survivors_take_the_newest_checkpoint_from_a_peer_and_nothing_through_the_controller(cluster):
    cluster["held"] = {"v100b": 40, "v100c": 50}  # v100a (rank 0) lost; v100c got its last save
    cluster["controller"] = 30
    shared = checkpoints.share_checkpoint(RUN, [B, C])
    assert shared == checkpoints.Shared(50, "v100c")
    assert cluster["copies"] == [("push", "v100c", ["v100b"])]


def test_a_restart_that_does_not_need_the_controllers_copy_never_waits_for_the_backup(cluster):
    cluster["held"] = {"v100b": 40}
    with checkpoints.CONTROLLER_COPY:  # a GB backup under way, from the lost host, for a minute
        started = time.monotonic()
        shared = checkpoints.share_checkpoint(RUN, [B, C])
    assert shared.source == "v100b" and time.monotonic() - started < 1


def test_the_controllers_copy_is_the_last_resort_read_once_the_backup_under_way_is_whole(cluster):
    cluster["controller"] = 30  # rank 0's host lost, and only rank 0 held checkpoints
    result = []
    with checkpoints.CONTROLLER_COPY:
        restart = threading.Thread(target=lambda: result.append(checkpoints.share_checkpoint(RUN, [B, C])))
        restart.start()
        restart.join(0.3)
        assert restart.is_alive() and not cluster["copies"]  # waits for the copy under way, never reads half
        cluster["controller"] = 40  # the backup under way finished: a newer whole copy
    restart.join(5)
    assert result == [checkpoints.Shared(40, "the controller's copy")]
    assert cluster["copies"] == [("upload", ["v100b", "v100c"])]


def test_nothing_anywhere_is_none(cluster):
    assert checkpoints.share_checkpoint(RUN, [B, C]) is None


def test_among_equals_rank_0s_is_taken():
    assert checkpoints.newest_holder([A, B, C], {"v100b": 50, "v100a": 50, "v100c": 20}) is A
    assert checkpoints.newest_holder([A, B], {}) is None


@pytest.mark.parametrize(("text", "every_s", "at_end"), [("off", None, False), ("last", None, True),
                                                          ("every:60", 3600, True), ("EVERY:0.5", 30, True)])
def test_backup_policies(text, every_s, at_end):
    policy = checkpoints.BackupPolicy.parse(text)
    assert (policy.every_s, policy.at_end) == (every_s, at_end)
    assert checkpoints.BackupPolicy.parse(str(policy)) == policy


@pytest.mark.parametrize("text", ["every:0", "every:x", "hourly", ""])
def test_a_bad_backup_policy_is_named(text):
    with pytest.raises(ValueError, match=r"--backup must be off, last or every:MIN"):
        checkpoints.BackupPolicy.parse(text)


def test_following_pushes_every_save_to_the_next_host_and_the_controller_copy_at_most_every_n(cluster):
    backup = checkpoints.Backup(RUN, checkpoints.BackupPolicy.parse("every:60"), say=print)
    for saved in (10, 20, 30):
        backup.maybe_start([A, B, C], saved)
        backup.wait()
    copies = cluster["copies"]
    assert copies.count(("push", "v100a", ["v100b"])) == 3  # every save, to one peer: not N-1 copies a save
    assert copies.count(("fetch", "v100a")) == 1  # the first at once, then not before an hour
    backup.final([A, B, C])
    assert copies.count(("fetch", "v100a")) == 2  # the newest when the run ends


def test_backup_off_never_copies_to_the_controller(cluster):
    backup = checkpoints.Backup(RUN, checkpoints.BackupPolicy.parse("off"), say=print)
    backup.maybe_start([A, B], 10)
    backup.final([A, B])
    assert cluster["copies"] == [("push", "v100a", ["v100b"])]


def test_a_failed_copy_is_said_and_the_run_goes_on(cluster, monkeypatch):
    said = []

    def gone(*a, **k):
        raise TimeoutError("no answer within 60 s")

    monkeypatch.setattr(checkpoints, "fetch_checkpoints", gone)
    checkpoints.Backup(RUN, checkpoints.BackupPolicy.parse("last"), say=said.append).final([A])
    assert said == ["copying v100a's checkpoint_last.pt to the controller (--backup last); Ctrl-C leaves it unfinished",
                    "checkpoint backup to the controller failed (training goes on): "
                    "TimeoutError: no answer within 60 s"]


def test_waiting_for_a_copy_under_way_says_which(cluster, monkeypatch):
    """A GB copy to a laptop takes minutes: the end of a run (or Ctrl-C) that waits for it says what
    it waits for, instead of looking hung."""
    release = threading.Event()
    monkeypatch.setattr(checkpoints, "fetch_checkpoints", lambda *a, **k: release.wait(10) and [])
    said = []
    backup = checkpoints.Backup(RUN, checkpoints.BackupPolicy.parse("every:60"), say=said.append)
    backup.maybe_start([A, B], 40)
    assert "update 40 from v100a to the controller" in backup.under_way()
    threading.Timer(0.3, release.set).start()
    backup.wait(say=said.append)
    assert said and said[0].startswith("waiting for the checkpoint copy under way (")
    assert "update 40 from v100a to the controller" in said[0] and "Ctrl-C leaves it unfinished" in said[0]
    assert backup.under_way() == []
    backup.wait(say=said.append)  # nothing under way: nothing said
    assert len(said) == 1


def test_a_copy_left_unfinished_leaves_no_partial_file_on_the_controller(cluster, tmp_path):
    local = tmp_path / RUN.run_id / "checkpoints"
    local.mkdir(parents=True)
    (local / "checkpoint_last.pt").write_bytes(b"update 30")
    (local / "checkpoint_last.pt.partial").write_bytes(b"upd")
    checkpoints.Backup(RUN, checkpoints.BackupPolicy.parse("every:60")).leave()
    assert sorted(p.name for p in local.iterdir()) == ["checkpoint_last.pt"]
