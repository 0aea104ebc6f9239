"""The benchmarks' records on this controller: reports/bench/<kind>-<time>.json, and the newest
of each kind again as <kind>-latest.json.

`fab bench-net`, `bench-step` and `bench-quality` (benchmarks/) write them; `fab predict`, `fab
train`'s network check (train.plan.predict) and its start line (train.run.interval) read the
latest: the measured link, compute-only step and overlap they plan with.

A bench-step record says the batch it trained at (`max_tokens` per rank and `update_freq`, the
batch train.plan.batching decided for its GPUs; older records: the preset's max_tokens at
update-freq 1) and its compute-only C for one batch (`compute_s`). A run at another max_tokens gets
C scaled per token (`compute_at`), and says so.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from train.cluster import TOP
from train.recipe import presets

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


def batch_of(report: dict) -> tuple[int, int]:
    """The batch a bench-step record trained at: (max_tokens per rank, update_freq). A record
    from before bench-step derived its batch trained at the preset's max_tokens, update-freq 1."""
    if report.get("max_tokens"):
        return int(report["max_tokens"]), int(report.get("update_freq") or 1)
    options = presets.resolve(report["preset"], report.get("overrides") or []).options
    return int(options.get("max_tokens") or 4096), 1


@dataclass(frozen=True)
class Compute:
    """Compute-only seconds for one batch (one rank's max_tokens) and where the figure comes from."""

    seconds: float
    source: str
    measured_tokens: int  # the batch bench-step measured at
    scaled: bool  # from another batch, per token


def compute_at(report: dict, max_tokens: int) -> Compute | None:
    """bench-step's compute-only C for a batch of `max_tokens` per rank: as measured when it trained
    at that batch, else scaled per token from the batch it did (C grows with the tokens a step
    computes; a larger batch usually runs a little faster per token, so a scaled-up C errs long)."""
    seconds = report.get("compute_s")
    if not seconds:
        return None
    measured, update_freq = batch_of(report)
    when = f"fab bench-step of {report.get('timestamp', '?')}"
    if measured == max_tokens:
        return Compute(float(seconds), f"{when} at {measured:,} tokens a batch x update-freq {update_freq}",
                       measured, False)
    return Compute(float(seconds) * max_tokens / measured,
                   f"scaled from {measured:,} tokens a batch ({when}: {float(seconds):.3f} s) to {max_tokens:,}, "
                   "the same seconds per token", measured, True)


def uncapped_step_at(report: dict, max_tokens: int, update_freq: int) -> tuple[float, str] | None:
    """The uncapped s/update a run at `max_tokens` x `update_freq` would take: bench-step's uncapped
    step with its compute part (update_freq x C) replaced by the run's (compute_at); the
    communication's exposed part stays as measured. None without an uncapped point or C."""
    step = next((p.get("s_per_update") for p in report.get("points", []) if p.get("rate") == "none"), None)
    compute = compute_at(report, max_tokens)
    if not step or compute is None:
        return None
    measured_tokens, measured_freq = batch_of(report)
    here = float(step) - measured_freq * float(report["compute_s"]) + update_freq * compute.seconds
    same = (measured_tokens, measured_freq) == (max_tokens, update_freq)
    when = f"fab bench-step of {report.get('timestamp', '?')}"
    return here, when if same else f"{when}, scaled from {measured_tokens:,} x {measured_freq} to " \
        f"{max_tokens:,} x update-freq {update_freq}"
