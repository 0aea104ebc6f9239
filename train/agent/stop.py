"""Stop every process of a run on this host and confirm none is left.

    python -m train.agent.stop --run /data/tandem/runs/RUN [--wait 20]

Marks the run as stopped on purpose (RUN/stopped; the next start removes it), then SIGTERM to
every process that names the run's save directory (train.agent.state.run_pids),
up to `--wait` seconds for them to end, then SIGKILL. Prints one word: `none` (nothing was
running), `stopped` (ended on SIGTERM), `killed` (needed SIGKILL); exit 1 with `alive` when a
process outlived SIGKILL.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import time

from train.agent.state import run_pids


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):  # ended meanwhile
            os.kill(pid, sig)


STOPPED_MARK = "stopped"  # in the run's directory: `fab status` says "stopped by fab stop", not "died"


def stop(run_dir: str, wait_s: float = 20, poll_s: float = 0.5) -> str:
    pids = run_pids(run_dir)
    if not pids:
        return "none"
    # a missing run directory still gets its processes stopped
    with contextlib.suppress(OSError), open(os.path.join(run_dir, STOPPED_MARK), "w") as f:
        f.write(time.strftime("%Y-%m-%dT%H:%M:%S%z\n"))
    _signal(pids, signal.SIGTERM)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if not run_pids(run_dir):
            return "stopped"
        time.sleep(poll_s)
    _signal(run_pids(run_dir), signal.SIGKILL)
    time.sleep(1)
    return "alive" if run_pids(run_dir) else "killed"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m train.agent.stop", description=__doc__.split("\n\n")[0])
    p.add_argument("--run", required=True, help="the run's directory on this host (/data/tandem/runs/RUN)")
    p.add_argument("--wait", type=float, default=20, help="seconds between SIGTERM and SIGKILL")
    args = p.parse_args(argv)
    outcome = stop(args.run, args.wait)
    print(outcome)
    return 1 if outcome == "alive" else 0


if __name__ == "__main__":
    raise SystemExit(main())
