"""The feed's one round trip, run by a real shell on real files: new bytes only, partial lines
kept for the next read, a long log read from its tail, a host that does not answer in time."""

from __future__ import annotations

import json
import subprocess
import threading
import time

from train.cluster import Host
from train.watch.feed import FIRST_READ_BYTES, Feed, HostFeed, parse_answer, read_command


def sample(t: float) -> str:
    return json.dumps({"t": t, "host": "h", "nic": "eth0", "tx_Bps": 1e6, "rx_Bps": 2e6, "cpu_percent": 5.0,
                       "mem_used_mb": 1.0, "mem_total_mb": 2.0, "gpus": None})


def read_locally(feed: HostFeed) -> None:
    """What HostFeed.read does over SSH, through bash here."""
    out = subprocess.run(["bash", "-c", read_command(feed.run_dir, feed.offsets, feed.with_log)],
                         capture_output=True, text=True, check=True).stdout
    running, files = parse_answer(out)
    for name, (start, text) in files.items():
        feed._take(name, start, text)
    feed.reading.running = running


def test_reads_only_what_was_appended_and_keeps_partial_lines(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    samples, log = run / "samples.jsonl", run / "train.log"
    samples.write_text(sample(1) + "\n" + sample(2)[:20])  # the sampler is mid-write
    log.write_text("line one\nline t")
    feed = HostFeed(Host("h", "127.0.0.1"), 0, str(run), True, 3.0)
    read_locally(feed)
    assert [s["t"] for s in feed.reading.samples] == [1]
    assert feed.reading.log_lines == ["line one"]
    assert feed.reading.running is False
    with samples.open("a") as f:
        f.write(sample(2)[20:] + "\n" + sample(3) + "\n")
    with log.open("a") as f:
        f.write("wo\n")
    read_locally(feed)
    assert [s["t"] for s in feed.reading.samples] == [1, 2, 3]
    assert feed.reading.log_lines == ["line one", "line two"]
    read_locally(feed)  # nothing new: nothing added
    assert len(feed.reading.samples) == 3 and len(feed.reading.log_lines) == 2


def test_a_long_log_is_read_from_its_tail(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    line = "x" * 99 + "\n"
    (run / "train.log").write_text(line * (FIRST_READ_BYTES // 100 + 500) + "last\n")
    feed = HostFeed(Host("h", "127.0.0.1"), 0, str(run), True, 3.0)
    read_locally(feed)
    lines = feed.reading.log_lines
    assert lines[-1] == "last" and all(x == "x" * 99 for x in lines[:-1])  # the cut line dropped
    assert len(lines) <= FIRST_READ_BYTES // 100 + 1
    assert feed.offsets["train.log"] == (run / "train.log").stat().st_size


def test_sees_the_runs_processes_not_itself(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    feed = HostFeed(Host("h", "127.0.0.1"), 1, str(run), False, 3.0)
    # a process whose command line names the run's save dir, as torchrun and its workers do
    proc = subprocess.Popen(["bash", "-c", f"sleep 30; : --save-dir {run}/checkpoints"])
    try:
        read_locally(feed)
        assert feed.reading.running is True
    finally:
        proc.kill()
        proc.wait()
    read_locally(feed)
    assert feed.reading.running is False


def test_a_host_that_stops_answering_is_unreachable_within_the_timeout(monkeypatch):
    hosts = [Host("fast", "127.0.0.1"), Host("stuck", "127.0.0.2")]
    feed = Feed("/data/tandem/runs/r", hosts, timeout_s=0.5)
    stuck, release = threading.Event(), threading.Event()

    def read(self):
        if self.host.name == "stuck" and stuck.is_set():
            release.wait(10)

    monkeypatch.setattr(HostFeed, "read", read)
    assert all(r.reachable for r in feed.poll())
    stuck.set()
    started = time.monotonic()
    fast, slow = feed.poll()
    assert time.monotonic() - started < 1.0
    assert fast.reachable and not slow.reachable and "no answer within 0.5 s" in slow.error
    fast, slow = feed.poll()  # the stuck request is not sent twice; the other host goes on
    assert fast.reachable and not slow.reachable
    release.set()  # a slow answer, not a dead host: it counts once it comes
    time.sleep(0.1)
    fast, slow = feed.poll()
    assert slow.reachable and slow.error is None
    feed.close()


def test_a_host_not_reached_yet_is_connecting_not_unreachable(monkeypatch):
    from train.watch import screen

    feed = Feed("/data/tandem/runs/r", [Host("slow", "127.0.0.1")], timeout_s=0.2)
    release = threading.Event()
    monkeypatch.setattr(HostFeed, "read", lambda self: release.wait(10))
    (reading,) = feed.poll()
    assert not reading.reachable and reading.error is None
    assert screen.host_row(reading, time.time()).state == "connecting"
    release.set()
    feed.close()
