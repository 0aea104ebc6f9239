"""A notice's save goes off the cluster first (train.agent.offsite.schedule): before the back-off of
uploads that failed, and before a routine upload under way, which is stopped. The store fails, then
recovers: a share whose path runs through a file until the file is replaced by the directory."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.unit.train.agent.keeper.test_replica import hold
from tests.unit.train.agent.offsite.test_offsite_schedule import Clock, save, settle, uploads
from train.agent.offsite import copies as offsite_copies
from train.agent.offsite import schedule as offsite_schedule


def broken_share(tmp_path: Path) -> tuple[Path, Path]:
    """A share path under a plain file: every write there fails until `recover`."""
    blocker = tmp_path / "mnt"
    blocker.write_text("not a directory")
    return blocker, blocker / "share"


def recover(blocker: Path) -> None:
    blocker.unlink()
    (blocker / "share").mkdir(parents=True)


def test_a_notices_save_goes_up_at_once_though_failed_uploads_backed_off(tmp_path):
    blocker, share = broken_share(tmp_path)
    run = tmp_path / "run"
    hold(run, b"update 10 " * 1000, 1, 10)
    clock = Clock()
    up = uploads(run, share, clock, every_s=60)
    for _ in range(5):  # five failures: the next try 600 s away
        up.tick(["v100a"])
        settle(up)
        clock.now = up.state["retry_at"]
    up.tick(["v100a"])
    settle(up)
    assert up.state["failures"] == 6 and up.state["retry_at"] - clock.now == 600
    recover(blocker)
    save(run, 20)  # the save rank 0 made for v100b's notice (2 min)
    up.soon(10, clock.now + 120, "v100b's notice")
    up.tick(["v100a"])
    assert up.child is not None, "the notice's save waited for the failed upload's back-off"
    settle(up)
    assert offsite_copies.newest(str(share), "r1")["update"] == 20  # the notice's, not the old job's u10


def test_a_notices_save_that_fails_is_tried_again_within_seconds(tmp_path):
    blocker, share = broken_share(tmp_path)
    run = tmp_path / "run"
    hold(run, b"update 10 " * 1000, 1, 10)
    clock = Clock()
    up = uploads(run, share, clock, every_s=86400)
    up.soon(None, clock.now + 120, "v100b's notice")
    up.tick(["v100a"])
    settle(up)
    assert up.state["retry_at"] - clock.now == offsite_schedule.NOTICE_RETRY_S
    recover(blocker)
    clock.now += offsite_schedule.NOTICE_RETRY_S
    up.tick(["v100a"])
    settle(up)
    assert offsite_copies.newest(str(share), "r1")["update"] == 10


def test_a_routine_upload_under_way_is_stopped_for_the_notices_save(tmp_path):
    share, run = tmp_path / "share", tmp_path / "run"
    share.mkdir()
    hold(run, b"update 10 " * 1000, 1, 10)
    clock = Clock()
    up = uploads(run, share, clock, every_s=86400)
    # a routine upload of update 10 under way (a keeper before this one started it): a process that stays
    routine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "train.agent.offsite.upload",
                                str(run)], start_new_session=True)
    try:
        up.state["pending"] = {"id": "routine", "pid": routine.pid, "started": clock.now, "staged": [],
                               "items": [{"kind": "last", "update": 10, "files": {}}]}
        up.tick(["v100a"])
        assert offsite_schedule.uploader_alive(routine.pid, str(run))  # no notice: it goes on
        save(run, 20)
        up.soon(10, clock.now + 120, "v100b's notice")
        up.tick(["v100a"])
        assert routine.wait(timeout=15) is not None  # stopped
        assert up.child is not None and up.state["pending"]["items"][0]["update"] == 20
        settle(up)
    finally:
        routine.kill()
    assert offsite_copies.newest(str(share), "r1")["update"] == 20
    assert up.state["failures"] == 0  # stopped for the notice: not a failure
