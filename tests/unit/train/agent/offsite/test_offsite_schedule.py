"""The keeper's copies off the cluster (train.agent.offsite.schedule): started when checkpoint_last's
interval is due and checkpoint_best changed, only by the generation's first host, in a child process
whose death leaves the job to be redone; and two real keepers on loopback uploading to moto's S3 server
(test_offsite's fixture) with no credential anywhere in the run's files."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

from tests.unit.train.agent.keeper.test_keeper import HOSTS, crash, launch, spec, two_hosts, wait_for  # noqa: F401
from tests.unit.train.agent.keeper.test_replica import hold
from tests.unit.train.agent.offsite.test_offsite import s3, s3_server  # noqa: F401
from train.agent.keeper import files, loop, replica
from train.agent.offsite import copies as offsite_copies
from train.agent.offsite import schedule as offsite_schedule


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


def test_checkpoint_best_goes_off_the_cluster_at_most_once_an_interval(tmp_path):
    """Issue 53, 8: a best that changes at every validation went up each time (10 uploads in 90 min at
    a 30-min interval); now it waits for its interval as checkpoint_last does, and goes at the run's end."""
    share, run = tmp_path / "share", tmp_path / "run"
    share.mkdir()
    hold(run, b"update 10 " * 1000, 1, 10)
    clock = Clock()
    up = uploads(run, share, clock)
    best = run / "checkpoints" / "checkpoint_best.pt"
    checkpoint(best, 10)
    up.tick(["v100a"])
    settle(up)
    assert offsite_copies.newest(str(share), "r1", kind="best")["update"] == 10
    for update in (20, 30):  # two validations within the interval: neither goes
        clock.now += 20
        checkpoint(best, update)
        up.tick(["v100a"])
        settle(up)
        assert offsite_copies.newest(str(share), "r1", kind="best")["update"] == 10
    clock.now += 25  # the interval passed: the newest best goes, once
    up.tick(["v100a"])
    settle(up)
    assert offsite_copies.newest(str(share), "r1", kind="best")["update"] == 30


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
    # the interval itself is the schedule's, tested on its own clock above (a manifest's time is an upload's
    # end, its interval counts from the start: timing it here would measure moto's speed)
    a, b = (files.show(str(dirs[h]))["offsite"] for h in HOSTS)
    assert a["newest"]["where"].startswith(f"{bucket}/r1/u") and b["newest"] is None
    for d in dirs.values():
        for path in d.rglob("*"):
            if path.is_file() and path.suffix != ".pt":
                assert b"tandem-test-secret-9f3" not in path.read_bytes(), path


# --- at the end of a run, at a stop, at a notice (the VMs may all be deleted right after)

KEEPER_GROUP = """
import sys, time
from tests.unit.train.agent.offsite.test_offsite_schedule import Clock, uploads
from pathlib import Path
up = uploads(Path(sys.argv[1]), Path(sys.argv[2]), Clock())
up.tick(["v100a"])
print(up.child.pid, flush=True)
time.sleep(120)
"""


def test_an_upload_under_way_outlives_the_signal_fab_stop_sends_the_keepers_process_group(tmp_path):
    """`keeper stop` sends SIGUSR1 to the keeper's process group (a round now), end_lingering SIGTERM:
    the uploader, in a session of its own, finishes its copy."""
    share, run = tmp_path / "share", tmp_path / "run"
    share.mkdir()
    hold(run, os.urandom(1 << 20) * 60, 1, 10)
    keeper_like = subprocess.Popen([sys.executable, "-c", KEEPER_GROUP, str(run), str(share)], stdout=subprocess.PIPE,
                                   text=True, start_new_session=True, cwd=Path(__file__).parents[5])
    uploader = int(keeper_like.stdout.readline())
    os.killpg(keeper_like.pid, signal.SIGUSR1)  # as `fab stop` does, the keeper gone with it
    keeper_like.wait(timeout=10)
    wait_for(lambda: not offsite_schedule.uploader_alive(uploader, str(run)), timeout=60)
    assert offsite_copies.newest(str(share), "r1")["update"] == 10


def test_a_finished_run_has_its_last_save_copied_off_the_cluster_before_the_keepers_end(request, tmp_path):
    """Interval of a day: only the first save goes up by it; the run's last (update 40) before the end."""
    dirs, port = request.getfixturevalue("two_hosts")
    share = tmp_path / "share"
    share.mkdir()
    for host, d in dirs.items():
        launch(d, spec(dirs, host, port, 40) | {"offsite": {"url": str(share), "every_s": 86400}})
    wait_for(lambda: all((d / "keeper" / "ended").exists() for d in dirs.values()), timeout=60)
    wait_for(lambda: files.supervisor_pid(str(dirs["v100a"])) is None, timeout=30)  # the keeper ended
    assert offsite_copies.newest(str(share), "r1")["update"] == 40
    said = (dirs["v100a"] / "keeper" / "keeper.log").read_text()
    assert "the run finished: its newest save goes off the cluster before the keeper ends (at most 1800 s)" in said
    assert "checkpoint_last of update 40 copied off the cluster" in said
    assert files.show(str(dirs["v100a"]))["offsite"]["newest"]["update"] == 40


def test_fab_stop_returns_once_the_newest_save_is_off_the_cluster(request, tmp_path):
    dirs, port = request.getfixturevalue("two_hosts")
    a = dirs["v100a"]
    share = tmp_path / "share"
    share.mkdir()
    for host, d in dirs.items():
        launch(d, spec(dirs, host, port, 100000) | {"offsite": {"url": str(share), "every_s": 86400}})
    first = wait_for(lambda: offsite_copies.newest(str(share), "r1"), timeout=60)["update"]
    wait_for(lambda: (replica.manifest(a) or {}).get("update", 0) >= first + 20, timeout=60)
    assert loop.stop(str(a), wait_s=5) == "stopped"
    newest = files.show(str(a))["offsite"]  # what `fab stop` reads from the hosts next
    assert newest["newest"]["update"] == replica.manifest(a)["update"] > first + 10
    assert newest["uploading"] == [] and not newest["closing"]
    assert offsite_copies.newest(str(share), "r1")["update"] == newest["newest"]["update"]
    said = (a / "keeper" / "keeper.log").read_text()
    assert "the run stopped (fab stop): its newest save goes off the cluster" in said


def test_a_final_upload_is_bounded_and_says_so(tmp_path):
    share, run = tmp_path / "share", tmp_path / "run"
    share.mkdir()
    hold(run, os.urandom(1 << 20) * 300, 1, 10)
    said.clear()
    up = uploads(run, share, Clock())
    up.config["final_s"] = 0.5
    up.finish(["v100a"], "stopped (fab stop)")
    assert "the copy off the cluster of checkpoint_last of update 10 did not finish within 0.5 s: stopped" in said
    assert said[-1].startswith("checkpoint copy off the cluster failed") and said[-1].endswith("newest (none)")
    pid = int(next(line for line in said if line.startswith("copying")).rsplit("pid ", 1)[1].rstrip(")"))
    assert not offsite_schedule.uploader_alive(pid, str(run)) and offsite_copies.whole_copies(str(share)) == []
    assert not offsite_schedule.newest_copy(str(run))["closing"]


def test_a_notice_sends_the_save_made_for_it_off_the_cluster_at_once(tmp_path, monkeypatch):
    """v100b's cloud gives notice. Interval of a day: the first save went up by it, the later ones
    wait; the save rank 0 (v100a) makes for the notice goes up at once, from v100a."""
    from tests.unit.train.agent.keeper.test_preemption import aws, dmi, metadata

    dirs = {h: tmp_path / h / "runs" / "r1" for h in HOSTS}
    share = tmp_path / "share"
    share.mkdir()
    port = 29000 + os.getpid() % 300
    state: dict = {}
    told = {"offsite": {"url": str(share), "every_s": 86400}, "lost_after_s": 30}
    try:
        with metadata(aws(state)) as (_, url):
            monkeypatch.setenv("TANDEM_TEST_DMI", str(dmi(tmp_path, "aws", sys_vendor="Amazon EC2")))
            monkeypatch.setenv("TANDEM_TEST_METADATA_URL", url)
            launch(dirs["v100b"], spec(dirs, "v100b", port, 100000) | told)
            monkeypatch.delenv("TANDEM_TEST_DMI")
            monkeypatch.delenv("TANDEM_TEST_METADATA_URL")
            launch(dirs["v100a"], spec(dirs, "v100a", port, 100000) | told)
            a = dirs["v100a"]
            first = wait_for(lambda: offsite_copies.newest(str(share), "r1"), timeout=60)["update"]
            wait_for(lambda: (replica.manifest(a) or {}).get("update", 0) >= first + 20, timeout=60)
            when = time.time() + 120
            state["action"] = {"action": "terminate", "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when))}
            entry = wait_for(lambda: next((g for g in files.read_timeline(a / "keeper")
                                           if g["generation"] == 2), None))
            noticed = time.monotonic()
            copy = wait_for(lambda: (c := offsite_copies.newest(str(share), "r1"))["update"] >= entry["from_update"]
                            and c, timeout=30)
            print(f"the notice's save (update {entry['from_update']}) off the cluster "
                  f"{time.monotonic() - noticed:.1f} s after generation 2")
            assert copy["host"] == "v100a"
            assert "the save for v100b's notice (update" in (a / "keeper" / "keeper.log").read_text()
    finally:
        for d in dirs.values():
            crash(d)
