"""How quickly the everyday commands answer: `fab train --new --detach`, `fab status`, `fab stop`,
each timed as a user runs it (wall time of the whole `fab` process), N tries in turn on a running run.

    FABRIC_INVENTORY=inventory/lab.yml python -m benchmarks.cli_speed [--tries 3] [--dataset synthetic]

Prints one line per try and the medians; benchmarks/README.md records them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

FAB = str(Path(sys.executable).parent / "fab")


def timed(*args: str) -> float:
    started = time.monotonic()
    done = subprocess.run([FAB, *args], capture_output=True, text=True, env=os.environ | {"COLUMNS": "200"})
    took = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"fab {' '.join(args)} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    return took


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tries", type=int, default=3)
    p.add_argument("--dataset", default="synthetic")
    p.add_argument("--settle", type=float, default=10, help="seconds between the start and status (ranks up)")
    args = p.parse_args()
    figures: dict[str, list[float]] = {"train --new --detach": [], "status": [], "stop": []}
    for n in range(args.tries):
        figures["train --new --detach"].append(timed("train", "--new", "--detach", "--dataset", args.dataset,
                                                     "--set", "max_update=100000"))
        time.sleep(args.settle)
        figures["status"].append(timed("status"))
        figures["stop"].append(timed("stop"))
        print(f"try {n + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in figures.items()), flush=True)
    print("median: " + ", ".join(f"fab {k} {statistics.median(v):.2f} s" for k, v in figures.items()))


if __name__ == "__main__":
    main()
