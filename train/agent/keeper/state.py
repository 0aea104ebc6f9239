"""A run's state on this host: are its processes alive, its last update, the tail of its log.

    python -m train.agent.keeper.state --run /data/tandem/runs/RUN [--tail 400]

prints one JSON object: {"running": true, "pids": [...], "update": 120, "tail": [...],
"stopped_by_user": false} (the last: `fab stop` stopped it, train.agent.keeper.stop's mark).
Every process of a run names its save directory on its command line (`--save-dir
RUN/checkpoints`): torchrun, and the workers it starts in sessions of their own, which a
process-group kill would miss. `fab status`, `fab train` (following), `fab bench-step` and
`train.agent.keeper.stop` find a run's processes this way.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path

UPDATE = re.compile(rb'"num_updates": "(\d+)"')


def save_dir(run_dir: str) -> str:
    return f"{run_dir.rstrip('/')}/checkpoints"


def run_pids(run_dir: str, proc: str = "/proc") -> list[int]:
    """The pids of the run whose directory is `run_dir` (this process excluded)."""
    return save_dir_pids(save_dir(run_dir), proc)


def save_dir_pids(save_dir: str, proc: str = "/proc") -> list[int]:
    """The pids whose command line holds `--save-dir SAVE_DIR` (this process excluded). Matched
    in the command line as one string, as `pgrep -f` does: a worker started through
    `bash -c '... --save-dir X ...'` holds it inside one argument."""
    wanted = f"--save-dir {save_dir.rstrip('/')}".encode()
    own = os.getpid()
    pids = []
    for entry in os.listdir(proc):
        if not entry.isdigit() or int(entry) == own:
            continue
        try:
            with open(f"{proc}/{entry}/cmdline", "rb") as f:
                line = f.read().replace(b"\0", b" ")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        at = line.find(wanted)
        if at >= 0 and line[at + len(wanted):at + len(wanted) + 1] in (b"", b" ", b"'", b'"'):
            pids.append(int(entry))
    return sorted(pids)


def tail(path: Path, lines: int, chunk: int = 1 << 16) -> list[str]:
    """The last `lines` lines of a file, read from its end ([] when it does not exist)."""
    if lines <= 0 or not path.exists():
        return []
    with path.open("rb") as f:
        f.seek(0, os.SEEK_END)
        end = pos = f.tell()
        data = b""
        while pos > 0 and data.count(b"\n") <= lines:
            pos = max(0, pos - chunk)
            f.seek(pos)
            data = f.read(end - pos)
    return [line.decode("utf-8", "replace") for line in data.splitlines()[-lines:]]


def last_update(path: Path, window: int = 1 << 20) -> int | None:
    """The last `num_updates` fairseq logged (searched in the log's last MB), None before the first."""
    if not path.exists():
        return None
    with path.open("rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - window))
        found = UPDATE.findall(f.read())
    return int(found[-1]) if found else None


def state(run_dir: str, lines: int = 400) -> dict:
    log = Path(run_dir) / "train.log"
    pids = run_pids(run_dir)
    return {"running": bool(pids), "pids": pids, "update": last_update(log), "tail": tail(log, lines),
            "stopped_by_user": not pids and (Path(run_dir) / "stopped").exists()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m train.agent.keeper.state", description=__doc__.split("\n\n")[0])
    p.add_argument("--run", required=True, help="the run's directory on this host (/data/tandem/runs/RUN)")
    p.add_argument("--tail", type=int, default=400, help="log lines to include (0: none)")
    args = p.parse_args(argv)
    from train.agent.keeper.files import show  # what the run's keeper knows

    print(json.dumps({**state(args.run, args.tail), "keeper": show(args.run)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
