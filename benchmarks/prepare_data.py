"""prepare-data at a real size against a WMT16-shaped mirror: wall time and peak memory per stage.

    python -m benchmarks.prepare_data --pairs 4560000 [--dir /var/tmp/tandem-prepare-bench] [--bind 127.0.0.1]

Builds the mirror once (benchmarks/wmt16_mirror.py; kept in DIR/www), serves it, and runs the stage
runner (`python -m train.agent.data --wmt16`) as a child whose whole process tree (clean's and
binarize's workers) is sampled every 0.2 s: the peak per stage is the largest sum over the tree of
each process's PSS (proportional set size: a page shared by forked workers counted once, split
among them), the figure a machine's memory has to hold. Before 2026-11-25's later figures the sum
was of RSS, which counts every shared page once per worker. Prints one table and a JSON line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from benchmarks import wmt16_mirror
from train.data import progress


def tree_memory(proc: psutil.Process) -> int:
    """The PSS of `proc` and its descendants, summed (RSS where the kernel has no PSS)."""
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):  # a worker that just ended
            info = p.memory_full_info()
            total += getattr(info, "pss", info.rss)
    return total


def run(pairs: int, where: Path, bind: str = "127.0.0.1", vocab_size: int = 32000, keep: bool = False) -> dict:
    www = where / f"www-{pairs}"
    if not (www / "dev.tgz").exists():
        started = time.monotonic()
        wmt16_mirror.build(www, pairs)
        print(f"mirror of {pairs:,} pairs built in {time.monotonic() - started:.0f} s", flush=True)
    work = where / "work"
    if not keep:
        shutil.rmtree(work, ignore_errors=True)
    httpd, url = wmt16_mirror.serve(www, bind)
    stage, peaks, seconds, since = "start", {}, {}, time.monotonic()
    command = [sys.executable, "-m", "train.agent.data", str(work), "wmt16", "--wmt16", "--vocab-size", str(vocab_size)]
    env = {**os.environ, "TANDEM_WMT16_MIRROR": url}
    started = time.monotonic()
    child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
    proc = psutil.Process(child.pid)
    done = threading.Event()

    def sample():
        while not done.wait(0.2):
            peaks[stage] = max(peaks.get(stage, 0), tree_memory(proc))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    result = None
    assert child.stdout is not None
    for line in child.stdout:
        event = progress.parse(line)
        if event is not None and event["stage"].split(" ")[0] != stage:
            now = time.monotonic()
            seconds[stage] = seconds.get(stage, 0) + now - since
            stage, since = event["stage"].split(" ")[0], now
        elif line.startswith("@@tandem-result "):
            result = json.loads(line[len("@@tandem-result "):])
    child.wait()
    seconds[stage] = seconds.get(stage, 0) + time.monotonic() - since
    done.set()
    sampler.join()
    httpd.shutdown()
    if child.returncode != 0 or result is None:
        raise SystemExit(f"prepare-data failed (exit {child.returncode})")
    figures = {"pairs": pairs, "wall_s": round(time.monotonic() - started, 1),
               "peak_mb": round(max(peaks.values()) / 2**20), "corpus": result["corpus"],
               "stages": {s: {"seconds": round(seconds.get(s, 0), 1), "peak_mb": round(peaks.get(s, 0) / 2**20)}
                          for s in seconds if s != "start"}}
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=sum(wmt16_mirror.TRAIN_SHARE.values()))
    parser.add_argument("--dir", type=Path, default=Path("/var/tmp/tandem-prepare-bench"))
    parser.add_argument("--bind", default="127.0.0.1")
    parser.add_argument("--vocab-size", type=int, default=32000)
    args = parser.parse_args()
    figures = run(args.pairs, args.dir, args.bind, args.vocab_size)
    print(f"{figures['pairs']:,} pairs: {figures['wall_s']:.0f} s, peak {figures['peak_mb']} MB (the process tree)")
    for name, f in figures["stages"].items():
        print(f"  {name:<10} {f['seconds']:>7.1f} s  {f['peak_mb']:>6} MB")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
