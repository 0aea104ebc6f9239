"""A lease on what a benchmark changed on this host: undone by the host itself when nobody renews it.

    python -m train.agent.measure.lease hold --file ~/.tandem/leases/NAME --ttl 60 --undo 'SHELL LINE'

`fab bench-step` starts training ranks and caps the cluster NIC with tc; its `finally` undoes both,
but a controller killed, asleep or offline never gets there, and a rented GPU cluster would train
and stay capped for as long as nobody notices. So before it changes anything the controller starts
this holder on every host (detached), and touches the lease file every 15 s while it works. A file
older than `--ttl` seconds means the controller is gone: the holder runs `--undo` (stop the ranks,
remove the cap), says so in NAME.log, and ends. A removed file is a release: the controller undid
everything itself; the holder ends without undoing.
"""

from __future__ import annotations

import argparse
import subprocess
import time
from pathlib import Path


def hold(path: Path, ttl_s: float, undo: str, every_s: float = 2.0, clock=time.time) -> str:
    """Until the lease is released (`released`) or expires (`expired`: `undo` was run)."""
    while True:
        try:
            age = clock() - path.stat().st_mtime
        except FileNotFoundError:
            return "released"
        if age > ttl_s:
            done = subprocess.run(["bash", "-c", undo], capture_output=True, text=True)
            print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} lease {path.name} not renewed for {age:.0f} s: undone "
                  f"(exit {done.returncode}) {done.stdout.strip()} {done.stderr.strip()[-500:]}", flush=True)
            path.unlink(missing_ok=True)
            return "expired"
        time.sleep(every_s)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m train.agent.measure.lease", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    h = sub.add_parser("hold")
    h.add_argument("--file", type=Path, required=True)
    h.add_argument("--ttl", type=float, default=60)
    h.add_argument("--undo", required=True, help="the shell line that undoes what the lease covers")
    args = p.parse_args(argv)
    print(hold(args.file.expanduser(), args.ttl, args.undo), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
