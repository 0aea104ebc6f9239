"""The controller's bounded copy of rank 0's newest checkpoint (`--backup`): how often, said while
it is under way, never left half on the controller. Host-to-host copies are the keepers'."""

from __future__ import annotations

import threading

import pytest

from train.cluster import Host
from train.recipe.record import Run
from train.run import checkpoints

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


def test_following_copies_to_the_controller_at_most_every_n_and_pushes_nothing(cluster):
    backup = checkpoints.Backup(RUN, checkpoints.BackupPolicy.parse("every:60"), say=print)
    for saved in (10, 20, 30):
        backup.maybe_start([A, B, C], saved)
        backup.wait()
    copies = cluster["copies"]
    assert not [c for c in copies if c[0] == "push"]  # the hosts' keepers copy host to host, not the follower
    assert copies.count(("fetch", "v100a")) == 1  # the first at once, then not before an hour
    backup.final([A, B, C])
    assert copies.count(("fetch", "v100a")) == 2  # the newest when the run ends


def test_backup_off_never_copies_to_the_controller(cluster):
    backup = checkpoints.Backup(RUN, checkpoints.BackupPolicy.parse("off"), say=print)
    backup.maybe_start([A, B], 10)
    backup.final([A, B])
    assert cluster["copies"] == []


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
