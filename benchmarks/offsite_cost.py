"""What copying checkpoints off the cluster costs the step, side by side on a provisioned lab: the same
run (same length, same settings) without a target and with `--checkpoints-to` at a short interval,
alternating, each twice. Prints s/update of each (rank 0's log, the first updates left out) and the
copies each with-run made.

    FABRIC_INVENTORY=inventory/lab.yml python -m benchmarks.offsite_cost [--updates 150] [--every 0.1]
        [--target /data/tandem/offsite-bench]

The default target is a directory on each host's data volume (what an NFS share is to a VM): the
uploader's own work (reading, hashing and writing the snapshot, niced) against the ranks' CPU, with no
network in the way. benchmarks/README.md records the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from train.cluster import load_hosts, run_all
from train.hosts.paths import RUNS_ROOT

FAB = str(Path(sys.executable).parent / "fab")
SKIP = 20  # the first updates (start, first save) are left out of s/update


def fab(*args: str) -> str:
    done = subprocess.run([FAB, *args], capture_output=True, text=True, env=os.environ | {"COLUMNS": "200"})
    if done.returncode != 0:
        raise SystemExit(f"fab {' '.join(args)} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    return done.stdout


def hosts() -> list:
    return load_hosts(Path(os.environ.get("FABRIC_INVENTORY", "inventory/lab.yml")))


def rank0_log(run_id: str, host: str) -> str:
    rank0 = next(h for h in hosts() if h.name == host)
    got = run_all([rank0], f"cat {RUNS_ROOT}/{run_id}/train.log", timeout=60)[host]
    if not got.ok:
        raise SystemExit(f"{host}: {run_id}'s log: {got.why}")
    return got.stdout


def seconds_per_update(run_id: str, host: str) -> float:
    """From rank 0's log: the wall time between train_inner lines over the updates past SKIP."""
    log = rank0_log(run_id, host)
    points = [(int(m.group(2)), time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")))
              for m in re.finditer(r"^(\S+ \S+) \| INFO \| train_inner \| .*\"num_updates\": \"(\d+)\"", log, re.M)]
    points = [p for p in points if p[0] >= SKIP]
    if len(points) < 2:
        raise SystemExit(f"{run_id}: too few train_inner lines in {host}'s log to time")
    (u0, t0), (u1, t1) = points[0], points[-1]
    return (t1 - t0) / (u1 - u0)


def newest_copy(run_id: str) -> str:
    shown = json.loads(fab("status", "--run", run_id, "--json"))
    newest = (shown.get("offsite") or {}).get("newest")
    return f"update {newest['update']}" if newest else "none"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--updates", type=int, default=150)
    p.add_argument("--every", default="0.1", help="minutes between copies in the with-target runs")
    p.add_argument("--target", default="/data/tandem/offsite-bench")
    p.add_argument("--host", default="v100a", help="rank 0's host")
    args = p.parse_args()
    settings = f"max_update={args.updates},save_interval_updates=10,max_tokens=1024"
    made = run_all(hosts(), f"mkdir -p {args.target}", timeout=60)  # the share, as a mount would give it
    if made.problems():
        raise SystemExit("; ".join(made.problems()))
    figures: dict[str, list[float]] = {"without": [], "with": []}
    for n in range(2):
        for kind in ("without", "with"):
            run_id = time.strftime(f"offsite-bench-{kind}-{n}-%H%M%S")
            target = ["--checkpoints-to", args.target, "--checkpoints-every", args.every] if kind == "with" else []
            fab("train", "--new", "--run", run_id, "--set", settings, "--accept-slow-network", *target)
            s = seconds_per_update(run_id, args.host)
            figures[kind].append(s)
            extra = f", newest copy off the cluster: {newest_copy(run_id)}" if kind == "with" else ""
            print(f"{run_id}: {s:.3f} s/update{extra}", flush=True)
    without, with_ = statistics.median(figures["without"]), statistics.median(figures["with"])
    print(f"median s/update: {without:.3f} without a target, {with_:.3f} with copies every {args.every} min: "
          f"x{with_ / without:.3f}")


if __name__ == "__main__":
    main()
