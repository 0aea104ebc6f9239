"""Several ranks a host, the shape users run (2 VMs x 2 V100s; 8-GPU VMs): 2 hosts x 2 ranks (cpu_ranks: 2,
tests/conftest.py's two_by_two), torchrun starting two workers on each. One run goes through a user's whole
job: verify's all_reduce over every rank, train (the batch said and logged), status and watch (which
ranks run where), stop (no worker left anywhere), resume, losing v100b (v100a's 2 ranks go on at
update-freq 2: the same tokens per update), growing back to 4 ranks, report, evaluate."""

from __future__ import annotations

import json
import re
import statistics
import time

import pytest
from labtools import TOP, fab, set_links
from test_three_hosts import Follower
from test_train import QUICK_HEARTBEAT, inner_records, log_of, training_processes, wait_for_update

RUN = time.strftime("run-2x2-%Y%m%d-%H%M%S")
MAX_UPDATE = 100
SAVE_EVERY = 20
SETTINGS = f"max_update={MAX_UPDATE},save_interval_updates={SAVE_EVERY},log_interval=5,{QUICK_HEARTBEAT}"
TOKENS = 2048  # the tiny preset's max_tokens
BATCH = f"batch 2 hosts x 2 ranks x {TOKENS:,} tokens x update-freq 1 = {4 * TOKENS:,} tokens per update"


def test_verify_all_reduces_within_each_host_then_across_both(two_by_two):
    """roles/verify runs every rank: each host's two ranks alone (intra-host, no NIC), then all four
    (inter-host), compared with the link."""
    out = two_by_two.first.output
    for name in ("v100a", "v100b"):
        assert re.search(rf"{name}: all_reduce gloo x2 within the host 64 MiB: busbw [\d.]+ GB/s", out), out[-3000:]
    found = re.search(r"all_reduce gloo x4 across 2 hosts 64 MiB: [\d.]+ ms, busbw [\d.]+ GB/s \((\d+) Mb/s\) = "
                      r"([\d.]+) x the measured link", out)
    assert found, out[-3000:]
    print(f"verify: 4 ranks across the hosts, busbw {found.group(1)} Mb/s = {found.group(2)} x the link")


def test_bench_net_measures_each_hosts_ranks_alone_then_all_four(two_by_two):
    """`fab bench-net` starts the same launcher as verify: an intra-host table (each host's 2 ranks, no
    NIC), then the inter-host one over all 4 ranks, compared with the link."""
    out = fab(two_by_two, "bench-net", "--min-size", "1M", "--max-size", "4M", "--iters", "2", "--budget-s", "5",
              "--iperf-seconds", "1").stdout
    assert "# intra-host: all_reduce among each host's own ranks (gloo, no NIC)" in out, out[-3000:]
    assert re.search(r"^v100a\s+2\s+4194304 ", out, re.M) and re.search(r"^v100b\s+2\s+4194304 ", out, re.M), out
    assert "# inter-host: all_reduce, gloo, 4 ranks on 2 hosts; link" in out, out[-3000:]
    report = json.loads((TOP / "reports" / "bench" / "net-latest.json").read_text())
    assert report["allreduce"]["world_size"] == 4 and set(report["allreduce"]["intra"]) == {"v100a", "v100b"}
    assert all(r["ok"] and r["world_size"] == 2 for r in report["allreduce"]["intra"].values())


def test_dry_run_says_each_hosts_ranks_and_the_batch(two_by_two):
    out = fab(two_by_two, "train", "--new", "--dry-run").stdout
    assert "--nproc_per_node 2" in out and '--distributed-rank "$RANK"' in out and "--distributed-world-size 4" in out
    # the batch, the run's length in tokens (train.run.length), the checkpoint interval, then the ranks
    assert re.search(re.escape(BATCH) + r"; .*? tokens per update x 300 updates = .*?; checkpoint every .*; "
                     r"ranks v100a 0-1, v100b 2-3", out), out[-2000:]


@pytest.fixture(scope="module")
def started(two_by_two):
    """The run, detached, past its first checkpoint."""
    out = fab(two_by_two, "train", "--new", "--run", RUN, "--detach", "--set", SETTINGS).stdout
    wait_for_update(two_by_two.cfg, RUN, SAVE_EVERY + 5)
    return out


def test_the_start_line_says_the_batch_of_every_rank(two_by_two, started):
    assert f"{RUN} started on 2 hosts (tiny; {BATCH};" in started, started
    cfg = two_by_two.cfg
    head = log_of(cfg, "v100a", RUN)
    assert "training on 4 devices" in head and f"max tokens per device = {TOKENS}" in head
    v100b = log_of(cfg, "v100b", RUN)
    assert "initialized host v100b as rank 2" in v100b and "initialized host v100b as rank 3" in v100b
    wpb = [float(r["wpb"]) for r in inner_records(head)]
    assert wpb and 0.6 * 4 * TOKENS < statistics.median(wpb) <= 4 * TOKENS, wpb  # 4 ranks' batches an update


def test_status_and_watch_say_which_ranks_run_where(two_by_two, started):
    status = fab(two_by_two, "status", "--run", RUN).stdout
    assert re.search(r"v100a\s+│ 0-1\s+│ running", status) and re.search(r"v100b\s+│ 2-3\s+│ running", status), status
    frame = fab(two_by_two, "watch", "--run", RUN, "--once").stdout
    assert re.search(r"^v100a 0-1\s+running", frame, re.M) and re.search(r"^v100b 2-3\s+running", frame, re.M), frame


def test_stop_leaves_no_worker_on_either_host(two_by_two, started):
    assert "no training process left" in fab(two_by_two, "stop", "--run", RUN).stdout
    for name in two_by_two.cfg.names:
        assert training_processes(two_by_two.cfg, name) == [], f"{name} still trains after fab stop"
    assert "stopped by fab stop at update" in fab(two_by_two, "status", "--run", RUN, check=False).stdout


@pytest.fixture(scope="module")
def resumed(two_by_two, started):
    """`fab train` resumes the run and follows it; v100b's link is cut past the next checkpoint and
    plugged back once the run went on without it. Returns what the follower said and rank 0's log."""
    cfg = two_by_two.cfg
    fab(two_by_two, "stop", "--run", RUN, check=False)  # stopped already when the stop test ran first
    began = time.monotonic()
    follower = Follower(two_by_two, "train", "--run", RUN)
    try:
        _, resuming = follower.wait_for(rf"resuming {RUN} from update (\d+)", timeout=180)
        wait_for_update(cfg, RUN, int(resuming.group(1)) + SAVE_EVERY + 3)  # past a checkpoint of the resumed run
        down = time.monotonic()
        set_links(cfg, "v100b", "down")
        _, lost = follower.wait_for(r"generation \d+: v100a from update (?P<resumed>\d+) \(v100a's checkpoint\), "
                                    r"update-freq 2, 2 ranks; v100b lost at update (?P<at>[\d,]+)", timeout=180)
        set_links(cfg, "v100b", "up")
        print(f"v100b's link cut at update {lost.group('at')}: v100a's 2 ranks went on from update "
              f"{lost.group('resumed')} {time.monotonic() - down:.0f} s later")
        _, back = follower.wait_for(r"generation \d+: v100a, v100b from update (\d+) \(\S+'s checkpoint\), "
                                    r"update-freq 1, 4 ranks; v100b rejoined", timeout=300)
        follower.proc.wait(timeout=600)
        follower.reader.join(timeout=10)
    finally:
        set_links(cfg, "v100b", "up")
        if follower.proc.poll() is None:
            follower.proc.kill()
            fab(two_by_two, "stop", "--run", RUN, check=False)
    print(f"resumed, lost v100b, grew back and finished in {time.monotonic() - began:.0f} s")
    assert follower.proc.returncode == 0, follower.out[-4000:]
    return follower.out, int(lost.group("resumed")), int(back.group(1)), log_of(cfg, "v100a", RUN)


def test_losing_v100b_keeps_the_tokens_per_update_on_v100as_two_ranks_and_grows_back_to_four(two_by_two, resumed):
    out, lost_from, grown_at, log = resumed
    assert f"{MAX_UPDATE}/{MAX_UPDATE}" in out
    assert re.findall(r"training on (\d+) devices", log) == ["4", "4", "2", "4"]  # start, resume, lost, back
    parts = log.split("Loaded checkpoint")  # [start], [resumed], [v100a alone], [grown back]
    assert f"@ {lost_from} updates" in parts[2].splitlines()[0] and f"@ {grown_at} updates" in parts[3].splitlines()[0]
    alone, four = ([float(r["wpb"]) for r in inner_records(p)] for p in (parts[2], parts[1] + parts[3]))
    assert alone and four, (alone, four)
    ratio = statistics.median(alone) / statistics.median(four)
    print(f"tokens per update: {statistics.median(four):.0f} on 4 ranks, {statistics.median(alone):.0f} on v100a's "
          f"2 ranks at update-freq 2 ({ratio:.2f}x)")
    batching = re.findall(r"'(?:update_freq|max_tokens|distributed_world_size)': [^,]+", log)
    assert 0.85 <= ratio <= 1.15, (alone, four, batching)  # 2 ranks x 2 batches = 4 ranks x 1
    members = json.loads((TOP / "reports" / RUN / "run.json").read_text())["members"]
    members = [m for i, m in enumerate(members) if i == 0 or m["why"] != "start"]  # the resume's start: no change
    # the history the run went on with: v100a's 2 ranks, or v100b's (cut off, it trained alone too: the
    # reunion goes on from the newer checkpoint of the two)
    assert [(m["hosts"], m["ranks"], m["update_freq"]) for m in members] in (
        [(["v100a", "v100b"], 4, 1), ([alone], 2, 2), (["v100a", "v100b"], 4, 1)] for alone in ("v100a", "v100b")), \
        members
    for name in two_by_two.cfg.names:
        assert training_processes(two_by_two.cfg, name) == [], name


def test_report_and_evaluate_on_two_by_two(two_by_two, resumed):
    fab(two_by_two, "report", "--run", RUN)
    page = (TOP / "reports" / RUN / "index.html").read_text()
    assert "hosts v100a (ranks 0-1), v100b (ranks 2-3) (rank 0: v100a)" in page
    assert "<td>v100b</td><td>2-3</td>" in page and "Membership (which hosts trained when)" in page
    scored = fab(two_by_two, "evaluate", "--run", RUN).stdout
    assert re.search(r"SacreBLEU [0-9.]+", scored), scored[-2000:]  # the checkpoint of 4 ranks' training scores
