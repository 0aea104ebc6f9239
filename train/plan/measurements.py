"""The benchmarks' records on this controller: reports/bench/<kind>-<time>.json, and the newest
of each kind again as <kind>-latest.json.

`fab bench-net`, `bench-step` and `bench-quality` (benchmarks/) write them; `fab predict`, `fab
train`'s network check (train.plan.predict) and its start line (train.run.interval) read the
latest: the measured link, compute-only step and overlap they plan with.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from train.cluster import TOP

REPORT_DIR = TOP / "reports" / "bench"


def write(report: dict, kind: str, when: datetime | None = None) -> Path:
    """reports/bench/<kind>-<time>.json and <kind>-latest.json (same content)."""
    when = when or datetime.now(UTC)
    REPORT_DIR.mkdir(parents=True, exist_ok=True)
    path = REPORT_DIR / f"{kind}-{when.strftime('%Y%m%d-%H%M%S')}.json"
    text = json.dumps(report, indent=2, default=str) + "\n"
    path.write_text(text)
    (REPORT_DIR / f"{kind}-latest.json").write_text(text)
    return path


def latest(kind: str) -> dict | None:
    """The newest record of `kind` (net, step, quality), None when there is none."""
    path = REPORT_DIR / f"{kind}-latest.json"
    return json.loads(path.read_text()) if path.exists() else None
