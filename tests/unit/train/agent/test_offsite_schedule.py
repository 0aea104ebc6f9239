"""The keeper's copies off the cluster (train.agent.offsite_schedule): started when checkpoint_last's
interval is due and checkpoint_best changed, only by the generation's first host, in a child process
whose death leaves the job to be redone; and two real keepers on loopback uploading to moto's S3 server
(test_offsite's fixture) with no credential anywhere in the run's files."""

from __future__ import annotations

import json
import os
import pickle
import signal
import zipfile
from pathlib import Path

from tests.unit.train.agent.test_keeper import HOSTS, keeper_files, launch, spec, two_hosts, wait_for  # noqa: F401
from tests.unit.train.agent.test_offsite import s3, s3_server  # noqa: F401
from tests.unit.train.agent.test_replica import hold
from train.agent import offsite_copies, offsite_schedule, replica


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def uploads(run_dir: Path, share: Path, clock: Clock, me: str = "v100a", every_s: float = 60):
    (run_dir / "keeper").mkdir(parents=True, exist_ok=True)
    (run_dir / "run.json").write_text(json.dumps({"run_id": "r1", "preset": "tiny", "dataset": "synthetic",
                                                  "max_tokens": 4096, "update_freq": 2, "hosts": list(HOSTS)}))
    told = {"run_id": "r1", "me": me, "ranks": {"v100a,v100b": 2}, "update_freq": {"v100a,v100b": 2},
            "offsite": {"url": str(share), "every_s": every_s}}
    return offsite_schedule.Uploads(str(run_dir), told, said.append, clock)


said: list[str] = []


def settle(up: offsite_schedule.Uploads) -> None:
    """The upload under way, finished and collected."""
    if up.child is not None:
        up.child.wait(timeout=60)
    up.tick(up.members)


def checkpoint(path: Path, update: int) -> None:
    """A torch-style checkpoint (a zip whose data.pkl says its update), as fairseq writes one."""
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", pickle.dumps({"optimizer_history": [{"num_updates": update}]}))


def save(run_dir: Path, update: int) -> None:
    """Rank 0 saved again, and its keeper snapshot it (as replica.snapshot does)."""
    last, snap, man = replica.paths(run_dir)
    data = f"update {update} ".encode() * 1000
    last.write_bytes(data)
    snap.unlink()
    snap.hardlink_to(last)
    man.write_text(json.dumps({"generation": 1, "update": update, "size": len(data),
                               "sha256": replica.sha256_of(last)}))


def test_rank_0s_host_uploads_when_the_interval_is_due_and_best_when_it_changes(tmp_path):
    share, run = tmp_path / "share", tmp_path / "run"
    share.mkdir()
    hold(run, b"update 10 " * 1000, 1, 10)
    clock = Clock()
    up = uploads(run, share, clock)
    up.tick(["v100a", "v100b"])
    settle(up)
    copy = offsite_copies.newest(str(share), "r1")
    assert copy["update"] == 10 and copy["host"] == "v100a" and copy["tokens_per_update"] == 4096 * 2 * 2
    assert offsite_schedule.newest_copy(str(run))["newest"]["where"] == f"{share}/r1/u10"
    save(run, 20)
    clock.now += 30  # half the interval: nothing
    up.tick(["v100a", "v100b"])
    assert up.child is None and offsite_copies.newest(str(share), "r1")["update"] == 10
    checkpoint(run / "checkpoints" / "checkpoint_best.pt", 20)  # best changed
    up.tick(["v100a", "v100b"])
    settle(up)
    assert offsite_copies.newest(str(share), "r1", kind="best")["update"] == 20
    assert offsite_copies.newest(str(share), "r1")["update"] == 10  # last waits for its interval
    clock.now += 31
    up.tick(["v100a", "v100b"])
    settle(up)
    assert offsite_copies.newest(str(share), "r1")["update"] == 20
    assert not list((run / "checkpoints" / offsite_schedule.STAGED).iterdir())  # staged links gone


def test_only_the_generations_first_host_uploads(tmp_path):
    share, run = tmp_path / "share", tmp_path / "run"
    share.mkdir()
    hold(run, b"update 10 " * 1000, 1, 10)
    up = uploads(run, share, Clock(), me="v100b")
    up.tick(["v100a", "v100b"])
    assert up.child is None and offsite_copies.whole_copies(str(share)) == []
    up.tick(["v100b"])  # v100a lost: v100b is rank 0's host now
    settle(up)
    assert offsite_copies.newest(str(share), "r1")["host"] == "v100b"


def test_an_upload_whose_child_dies_is_redone_by_a_keeper_started_again(tmp_path):
    share, run = tmp_path / "share", tmp_path / "run"
    share.mkdir()
    hold(run, os.urandom(1 << 20) * 300, 1, 10)  # 300 MB: killed before it is through
    clock = Clock()
    up = uploads(run, share, clock)
    up.tick(["v100a"])
    os.kill(up.child.pid, signal.SIGKILL)
    up.child.wait()
    again = uploads(run, share, clock)  # the keeper started again: its state from disk
    again.tick(["v100a"])
    assert offsite_schedule.newest_copy(str(run))["error"] == "the upload ended before it finished"
    assert again.child is None and offsite_copies.whole_copies(str(share)) == []  # waits before retrying
    clock.now += offsite_schedule.RETRY_S[0]
    again.tick(["v100a"])
    settle(again)
    assert offsite_copies.newest(str(share), "r1")["update"] == 10


def test_two_keepers_copy_rank_0s_checkpoints_to_s3_and_no_credential_reaches_a_file(request, monkeypatch):
    dirs, port = request.getfixturevalue("two_hosts")  # test_keeper's: two keepers' run directories, their port
    bucket = request.getfixturevalue("s3")  # test_offsite's: moto's S3 on loopback, a bucket
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "tandem-test-secret-9f3")  # the keepers' environment: a host's
    for host, d in dirs.items():
        launch(d, spec(dirs, host, port, 100000) | {"offsite": {"url": bucket, "every_s": 3}})
    wait_for(lambda: len(offsite_copies.whole_copies(bucket, "r1")) == 2, timeout=60)
    copies = offsite_copies.whole_copies(bucket, "r1")
    assert {c["host"] for c in copies} == {"v100a"} and copies[0]["update"] > copies[1]["update"]
    assert copies[0]["time"] - copies[1]["time"] >= 3
    a, b = (keeper_files.show(str(dirs[h]))["offsite"] for h in HOSTS)
    assert a["newest"]["where"].startswith(f"{bucket}/r1/u") and b["newest"] is None
    for d in dirs.values():
        for path in d.rglob("*"):
            if path.is_file() and path.suffix != ".pt":
                assert b"tandem-test-secret-9f3" not in path.read_bytes(), path
