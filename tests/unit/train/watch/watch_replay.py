"""Recorded runs replayed as the feed would have read them at a given moment."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from train.report.run_data import read_samples
from train.watch.feed import Reading

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures"
CPU_10MBIT = FIXTURES / "watch" / "cpu-10mbit"  # the lab, tiny preset, 10mbit cap: tw-try1
H100 = FIXTURES / "report" / "h100-base-fp16"  # one H100, the base preset in fp16


def at(text: str) -> float:
    """A log stamp (`2026-11-23 02:13:30`, UTC) as a timestamp."""
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC).timestamp()


def log_until(lines: list[str], now: float) -> list[str]:
    """The lines written by `now` (log times are local; the tests run with TZ=UTC, as recorded)."""
    out = []
    for line in lines:
        stamp = line[:19]
        try:
            if datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S").timestamp() > now:
                break
        except ValueError:
            pass  # an untimed line (a traceback, a warning) belongs to the one before
        out.append(line)
    return out


def reading(name: str, rank: int, gpus: int, samples: Path, now: float, log: Path | None = None) -> Reading:
    return Reading(name, rank, gpus, reachable=True, running=True,
                   samples=[s for s in read_samples(samples) if s["t"] <= now],
                   log_lines=log_until(log.read_text().splitlines(), now) if log else [], answered_at=now)


def unreachable(r: Reading, silent_s: float, error: str) -> Reading:
    r.reachable, r.answered_at, r.error = False, r.answered_at - silent_s, error
    return r


def cpu_run(now: float) -> tuple[dict, list[Reading]]:
    run = json.loads((CPU_10MBIT / "run.json").read_text())
    return run, [reading("v100a", 0, 0, CPU_10MBIT / "v100a.jsonl", now, CPU_10MBIT / "v100a.log"),
                 reading("v100b", 1, 0, CPU_10MBIT / "v100b.jsonl", now)]


def gpu_run(now: float, hosts: int) -> tuple[dict, list[Reading]]:
    """The H100's recording as every host's (one GPU each): its samples, its log as rank 0's."""
    run = {**json.loads((H100 / "run.json").read_text()), "hosts": [f"gpu{i}" for i in range(hosts)]}
    return run, [reading(f"gpu{i}", i, 1, H100 / "samples" / "gpu0.jsonl", now,
                         H100 / "logs" / "gpu0.log" if i == 0 else None) for i in range(hosts)]
