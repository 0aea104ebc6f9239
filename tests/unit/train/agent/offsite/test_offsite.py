"""Checkpoint copies off the cluster (train.agent.offsite.upload): a directory target (a tmp dir, as an NFS share
is to the hosts) and an S3 target against moto's S3 server on loopback (moto[server], as s3fs's own test
suite runs against; credentials and endpoint from the environment, as botocore reads them on a host).
gs:// and sftp:// are parsed and checked here, never run against a server (none reachable here)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from train.agent.offsite import copies as offsite_copies
from train.agent.offsite import upload as offsite
from train.agent.offsite.target import BadTarget, parse
from train.run import offsite as offsite_run

BIG = 24 << 20  # several of the uploader's blocks


@pytest.fixture(scope="module")
def s3_server():
    """moto's S3 server on a loopback port; a bucket `ckpts`."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    _, port = server.get_host_and_port()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def s3(s3_server, monkeypatch):
    """The environment a host's botocore reads: its endpoint (an S3-compatible store) and keys."""
    for key, value in {"AWS_ENDPOINT_URL": s3_server, "AWS_ACCESS_KEY_ID": "testing",
                       "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    import boto3

    client = boto3.client("s3")
    bucket = f"ckpts-{time.monotonic_ns()}"
    client.create_bucket(Bucket=bucket)
    return f"s3://{bucket}/runs"


@pytest.fixture(params=["directory", "s3"])
def store(request, tmp_path):
    if request.param == "directory":
        (tmp_path / "share").mkdir()
        return str(tmp_path / "share")
    return request.getfixturevalue("s3")


def files(where: Path, update: int, size: int = 4096) -> dict[str, Path]:
    """A checkpoint of `size` bytes (random, or sparse with a random head when large) and a run record."""
    where.mkdir(parents=True, exist_ok=True)
    with (where / "checkpoint_last.pt").open("wb") as f:
        f.write(os.urandom(min(size, BIG)))
        f.truncate(size)
    (where / "run.json").write_text(json.dumps({"run_id": "r1", "preset": "tiny", "update": update}))
    return {"checkpoint_last.pt": where / "checkpoint_last.pt", "run.json": where / "run.json"}


def test_urls_parse_and_one_holding_a_secret_is_refused():
    assert parse("s3://b/runs/").root == "b/runs" and parse("s3://b/runs").protocol == "s3"
    assert parse("gs://b/p").protocol == "gcs" and parse("gs://b").root == "b"
    assert parse("/mnt/share/runs").root == parse("file:///mnt/share/runs/").root == "/mnt/share/runs"
    target = parse("sftp://backup@store.example:2222/srv/ckpts")
    assert (target.root, target.options) == ("/srv/ckpts", {"host": "store.example", "port": 2222,
                                                             "username": "backup"})
    for bad, said in [("sftp://u:hunter2@h/p", "password"), ("s3://b/p?X-Amz-Signature=abc", "query"),
                      ("runs/relative", "not a URL"), ("file://otherhost/p", "absolute path"),
                      ("sftp://h", "a directory on that machine"), ("s3://AKIA:secret@b/p", "password"),
                      ("s3://b/p q", "only letters")]:
        with pytest.raises(BadTarget, match=said) as refused:
            parse(bad)
        assert "hunter2" not in str(refused.value) and "secret" not in str(refused.value)


def test_copies_upload_whole_keep_the_newest_two_and_fetch_verified(store, tmp_path):
    for update in (10, 20, 30):
        made = offsite_copies.upload(parse(store), "r1", "last", update, files(tmp_path / "src", update, BIG),
                                     facts={"preset": "tiny", "world_size": 2})
    assert made["where"] == f"{store}/r1/u30" and made["files"]["checkpoint_last.pt"]["size"] == BIG
    assert [c["update"] for c in offsite_copies.whole_copies(store, "r1")] == [30, 20]  # u10 removed
    newest = offsite_copies.newest(store)  # any run under the URL
    assert newest["where"] == made["where"] and newest["world_size"] == 2
    got = offsite_copies.fetch(newest["where"], tmp_path / "dest")
    assert got["update"] == 30
    fetched, sent = tmp_path / "dest" / "checkpoint_last.pt", tmp_path / "src" / "checkpoint_last.pt"
    assert fetched.read_bytes() == sent.read_bytes()
    assert sorted(p.name for p in (tmp_path / "dest").iterdir()) == ["checkpoint_last.pt", "run.json"]


def test_a_copy_without_its_manifest_never_counts_nor_replaces_the_good_one(store, tmp_path):
    target = parse(store)
    offsite_copies.upload(target, "r1", "last", 10, files(tmp_path / "a", 10))
    fs = target.filesystem()
    torn = offsite_copies.copy_dir(target, "r1", "last", 40)
    fs.pipe_file(f"{torn}/checkpoint_last.pt", b"half of a checkpoint")  # files there, no manifest yet
    assert offsite_copies.newest(store, "r1")["update"] == 10
    offsite_copies.upload(target, "r1", "last", 20, files(tmp_path / "b", 20))
    assert [c["update"] for c in offsite_copies.whole_copies(store, "r1")] == [20, 10]  # two whole, torn one too
    offsite_copies.upload(target, "r1", "last", 50, files(tmp_path / "c", 50))
    assert [c["update"] for c in offsite_copies.whole_copies(store, "r1")] == [50, 20]
    assert not fs.exists(torn)  # older than the newest whole copies: removed with them


def test_a_flipped_byte_in_an_uploaded_copy_is_refused_on_fetch(store, tmp_path):
    target = parse(store)
    made = offsite_copies.upload(target, "r1", "last", 10, files(tmp_path / "src", 10))
    fs = target.filesystem()
    stored = f"{offsite_copies.copy_dir(target, 'r1', 'last', 10)}/checkpoint_last.pt"
    data = bytearray(fs.cat_file(stored))
    data[100] ^= 1
    fs.pipe_file(stored, bytes(data))
    assert offsite_copies.newest(store, "r1")["update"] == 10  # same size: listed; its bytes are checked on fetch
    with pytest.raises(offsite_copies.OffsiteError, match="sha256 .*not taken"):
        offsite_copies.fetch(made["where"], tmp_path / "dest")
    assert not (tmp_path / "dest" / "checkpoint_last.pt").exists()
    assert not list((tmp_path / "dest").glob(".*incoming"))


def upload_job(run_dir: Path, url: str, source: dict[str, Path], update: int) -> None:
    (run_dir / "keeper").mkdir(parents=True, exist_ok=True)
    job = {"id": f"j{update}", "url": url, "run_id": "r1",
           "items": [{"kind": "last", "update": update, "files": {k: str(v) for k, v in source.items()}}]}
    (run_dir / "keeper" / offsite.JOB).write_text(json.dumps(job))


def test_an_uploader_killed_mid_file_leaves_the_previous_copy_the_newest(tmp_path):
    share = tmp_path / "share"
    share.mkdir()
    offsite_copies.upload(parse(str(share)), "r1", "last", 10, files(tmp_path / "old", 10))
    source = files(tmp_path / "new", 20, 400 << 20)
    upload_job(tmp_path / "run", str(share), source, 20)
    child = subprocess.Popen([sys.executable, "-m", "train.agent.offsite.upload", "upload", "--run",
                              str(tmp_path / "run")])
    partial = share / "r1" / "u20" / "checkpoint_last.pt"
    deadline = time.monotonic() + 60
    while not (partial.exists() and partial.stat().st_size > 0) and time.monotonic() < deadline:
        time.sleep(0.01)
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert 0 < partial.stat().st_size < 400 << 20  # killed mid-file
    assert offsite_copies.newest(str(share), "r1")["update"] == 10
    assert not (tmp_path / "run" / "keeper" / offsite.RESULT).exists()
    redo = subprocess.run([sys.executable, "-m", "train.agent.offsite.upload", "upload", "--run",
                           str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=120)  # a keeper restart redoes the job
    assert redo.returncode == 0, redo.stdout + redo.stderr
    assert offsite_copies.newest(str(share), "r1")["update"] == 20
    result = json.loads((tmp_path / "run" / "keeper" / offsite.RESULT).read_text())
    assert result["error"] == "" and result["done"][0]["where"] == f"{share}/r1/u20"


def test_the_uploader_streams_a_large_checkpoint_in_flat_memory(s3, tmp_path):
    """400 MB to S3 (multipart): the child's peak memory (VmHWM: its own, not what fork inherited from
    this process) stays far below the file's size."""
    source = files(tmp_path / "src", 30, 400 << 20)
    upload_job(tmp_path / "run", s3, source, 30)
    code = ("import sys; from train.agent.offsite import upload as offsite; rc = offsite.main(sys.argv[1:]); "
            "import re, pathlib; status = pathlib.Path('/proc/self/status').read_text(); "
            "print('maxrss_kb', re.search(r'VmHWM:\\s+(\\d+)', status).group(1)); sys.exit(rc)")
    done = subprocess.run([sys.executable, "-c", code, "upload", "--run", str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    peak_mb = int(done.stdout.split("maxrss_kb")[-1]) / 1024
    assert peak_mb < 250, f"the uploader peaked at {peak_mb:.0f} MB for a 400 MB file"
    assert offsite_copies.newest(s3, "r1")["files"]["checkpoint_last.pt"]["size"] == 400 << 20


def check(url: str, host: str, env: dict | None = None, prefix: list[str] | None = None):
    argv = [*(prefix or []), sys.executable, "-m", "train.agent.offsite.upload", "check", url, "--host", host]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})})
    return done.returncode, json.loads(done.stdout.strip().splitlines()[-1])


def test_the_check_writes_reads_and_deletes_and_refuses_naming_what_failed(store, tmp_path):
    code, said = check(store, "v100a")
    assert (code, said["ok"]) == (0, True)
    assert offsite_copies.whole_copies(store) == []  # nothing left behind
    code, said = check(str(tmp_path / "no-such-share"), "v100b")
    assert code == 1 and "no such directory on v100b" in said["error"] and "mount the share on v100b" in said["error"]
    code, said = check("sftp://u:pw@h/p", "v100b")
    assert code == 2 and "password" in said["error"] and "pw" not in said["error"].replace("password", "")


def test_the_check_makes_a_copy_as_uploads_do_and_times_it(store):
    """The check runs the upload's own path (a probe copy made, listed, fetched back, deleted) and says
    its write speed, which fab train turns into a checkpoint's copy time (issue 53, 3)."""
    said = offsite_copies.check(store, "v100a", probe_bytes=2 << 20)
    assert said["mb_s"] > 0 and offsite_copies.listed(store) == []  # nothing left behind
    line = offsite_run.copy_time_line({"v100a": 50.0, "v100b": 10.0}, 2.53e9, 30)
    assert line.startswith("a probe copy went up at 10 MB/s from the slowest host (v100b): one checkpoint "
                           "(2.53 GB) takes ~253 s off the cluster; too long for AWS spot's 2-min"), line
    assert "30-s preemption notice" not in offsite_run.copy_time_line({"v100a": 500.0}, 2.53e9, 30)


def test_a_probe_a_killed_check_left_is_no_run_to_resume(tmp_path):
    share = tmp_path / "share"
    share.mkdir()
    target = parse(str(share))
    offsite_copies.upload(target, "tandem-check-v100a-1-2", "last", 0, files(tmp_path, 0))
    offsite_copies.upload(target, "r1", "last", 5, files(tmp_path, 5))
    assert [r["run"] for r in offsite_copies.listed(str(share))] == ["r1"]


def test_the_check_refuses_a_store_that_takes_objects_but_cannot_list_them(tmp_path, monkeypatch):
    """A role allowed Put/Get/DeleteObject but not s3:ListBucket passed a put-get-delete check, and then no
    copy was ever made in 3 days (issue 53, 3): its listing now fails the check, naming the step."""
    from fsspec.implementations.local import LocalFileSystem

    def denied(self, path, detail=True, **kwargs):
        raise PermissionError("AccessDenied: not authorized to perform s3:ListBucket")

    monkeypatch.setattr(LocalFileSystem, "ls", denied)
    (tmp_path / "share").mkdir()
    refused = "PermissionError: AccessDenied.*(writing a probe copy|listing)"
    with pytest.raises(offsite_copies.OffsiteError, match=refused):
        offsite_copies.check(str(tmp_path / "share"), "v100b", probe_bytes=1 << 20)


def test_the_check_refuses_an_unreachable_store_naming_the_host(s3):
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, never listening: connections refused
    try:
        endpoint = f"http://127.0.0.1:{closed.getsockname()[1]}"
        code, said = check(s3, "v100b", {"AWS_ENDPOINT_URL": endpoint, "AWS_MAX_ATTEMPTS": "1"})
    finally:
        closed.close()
    assert code == 1 and "writing" in said["error"] and "reachable from v100b" in said["error"]


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="a read-only mount needs root")
def test_the_check_refuses_a_read_only_share_naming_the_host(tmp_path):
    share = tmp_path / "share"
    share.mkdir()
    ro = f"mount --bind {share} {share} && mount -o remount,ro,bind {share} && exec \"$@\""
    code, said = check(str(share), "v100b", prefix=["unshare", "--mount", "--propagation", "private", "sh", "-c",
                                                      ro, "sh"])
    assert code == 1 and "Read-only file system" in said["error"] and "v100b" in said["error"]
    assert "writing" in said["error"]
