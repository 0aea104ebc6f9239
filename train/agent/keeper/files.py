"""A run's keeper record on a host (RUN/keeper/), read by the keeper (train.agent.keeper.loop) and by
train.agent.keeper.state, which `fab status` and following ask: spec.json (what `fab train` told it),
generation.json (the newest generation it knows), timeline.jsonl (every membership change, with its
time, update and reason), keeper.pid (its supervisor), ended (why it ended: finished, stopped),
offsite.json (its checkpoint copies off the cluster: train.agent.offsite.schedule), keeper.log (what it
said, a line each, with its time)."""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path

from train.agent.keeper.replica import set_aside_list
from train.agent.offsite.schedule import newest_copy


def keeper_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "keeper"


def read_json(path: Path, default=None):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return default


def write_json(path: Path, data) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


LISTENER = None  # the fault simulator hears the keepers here (tests/sim), on its own clock


def say(text: str) -> None:
    """A line of the keeper's log (its standard output), with its time."""
    if LISTENER is not None:
        LISTENER(text)
        return
    print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {text}", flush=True)


def read_timeline(kdir: Path) -> list[dict]:
    """The membership changes this host recorded, oldest first."""
    try:
        lines = (kdir / "timeline.jsonl").read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        with contextlib.suppress(ValueError):
            out.append(json.loads(line))
    return out


def supervisor_pid(run_dir: str) -> int | None:
    """The keeper's supervisor on this host, if it runs."""
    try:
        pid = int((keeper_dir(run_dir) / "keeper.pid").read_text())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    return pid if b"train.agent.keeper.loop" in cmdline and run_dir.encode() in cmdline else None


def show(run_dir: str) -> dict:
    """What this host's keeper knows: alive?, its generation, why it ended, its timeline."""
    kdir = keeper_dir(run_dir)
    ended = kdir / "ended"
    return {"keeper": supervisor_pid(run_dir) is not None, "spec": (kdir / "spec.json").exists(),
            "generation": read_json(kdir / "generation.json"),
            "ended": ended.read_text().strip() if ended.exists() else "",
            "timeline": read_timeline(kdir), "set_aside": set_aside_list(run_dir), "offsite": newest_copy(run_dir),
            "no_room": read_json(kdir / "no_room.json", {}).get("why", "")}


