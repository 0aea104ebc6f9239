"""Bounded loss: how much training a resume can lose, and `fab train`'s word on it.

fairseq saves a checkpoint every `save_interval_updates` updates (on rank 0; tandem copies it to
every host and to the controller). A run that stops, and the elastic restart after a lost host
(train.run.elastic), go on from the newest checkpoint: at most one interval of updates is done
again. Each preset's default interval is chosen so that this is at most ~10 minutes (BOUND_S) on
the hardware the preset is meant for (REFERENCE, with where each figure comes from), and
`fab train`'s start line says what it is for the run at hand, from a measured s/update where
tandem has one:

- resuming: the run's own log (rank 0's recent s/update, validation and saves included);
- else the latest `fab bench-step` of the same model (preset and model options, precision, --comm)
  on as many hosts and ranks: its uncapped ("none") step, else its compute-only C (a lower bound);
- else it says the time is unmeasured, and how to measure it.

    >>> start_phrase(2000, StepFigure(0.27, "fab bench-step of 2026-11-23T05:51:26+00:00"))
    'checkpoint every 2,000 updates (≈ 9 min at 0.27 s/update, fab bench-step of 2026-11-23T05:51:26+00:00)'

Where the measured interval is over the bound, `over_bound` says so and names the interval that
keeps it (`--set save_interval_updates=N`): tandem does not change the run's options by itself.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

BOUND_S = 600  # ~10 minutes of training, at most, done again after a resume


@dataclass(frozen=True)
class Reference:
    """The hardware a preset is meant for and its s/update there: what the default interval is for."""

    hardware: str
    s_per_update: float
    source: str


# H100 figures: benchmarks/README.md, "On a GPU machine" (one H100, the presets' own batch, after the
# cuDNN-attention fix). On a cluster `fab train` refuses a run whose network would take more than half
# of the step (unless --accept-slow-network), so a run that starts has a step of at most 2 × C.
REFERENCE: dict[str, Reference] = {
    "tiny": Reference(
        "the lab: 2 CPU hosts sharing a 2-core machine", 0.5,
        "0.35–0.5 s/update with two ranks on the lab's shared cores (0.155–0.172 s in fab bench-step, "
        "one thread a rank)"),
    "transformer_wmt_en_de": Reference(
        "GPU hosts, one H100 a rank, the network at most half of the step", 2 * 0.061,
        "0.061 s/update measured on one H100 at 4,096 tokens, ×2 for the network's share fab train allows"),
    "transformer_vaswani_wmt_en_de_big": Reference(
        "GPU hosts, one H100 a rank, the network at most half of the step", 2 * 0.074,
        "0.074 s/update measured on one H100 at 3,584 tokens, ×2 for the network's share fab train allows"),
}


@dataclass(frozen=True)
class StepFigure:
    """A measured seconds per update and where it comes from."""

    s_per_update: float
    source: str


def interval_s(updates: int, s_per_update: float) -> float:
    """Seconds of training between two checkpoints: what a resume may have to do again."""
    return updates * s_per_update


def format_duration(seconds: float) -> str:
    """`25 s`, `9 min`, `1 h 05 min`: the start line's ≈ figure."""
    if seconds < 90:
        return f"{max(1, round(seconds))} s"
    minutes = round(seconds / 60)
    if minutes < 60:
        return f"{minutes} min"
    return f"{minutes // 60} h {minutes % 60:02d} min"


def format_step(s_per_update: float) -> str:
    """Two significant digits at least: 0.27, 0.061, 1.8 → 1.80, 12.3."""
    if s_per_update >= 10:
        return f"{s_per_update:.1f}"
    if s_per_update >= 0.1:
        return f"{s_per_update:.2f}"
    return f"{s_per_update:.2g}"


def suggested_interval(s_per_update: float, bound_s: float = BOUND_S) -> int:
    """The largest round interval (1, 2 or 5 × 10^k updates) whose time is within `bound_s`."""
    most = bound_s / s_per_update if s_per_update > 0 else float("inf")
    if most == float("inf"):
        raise ValueError("s_per_update must be positive")
    if most < 1:
        return 1
    power = 10 ** int(math.floor(math.log10(most)))
    for step in (5, 2, 1):
        if step * power <= most:
            return step * power
    return power  # unreachable: 1 × power <= most


def fits(updates: int, s_per_update: float, bound_s: float = BOUND_S) -> bool:
    """Within the bound, with 10% of slack (`~10 minutes`)."""
    return interval_s(updates, s_per_update) <= 1.1 * bound_s


def start_phrase(updates: int | None, figure: StepFigure | None) -> str:
    """The start line's part on checkpoints, e.g. `checkpoint every 2,000 updates (≈ 9 min at 0.27
    s/update, fab bench-step of ...)`."""
    if not updates:
        return "no periodic checkpoint (save_interval_updates=0): a resume starts from the last epoch's end"
    head = f"checkpoint every {updates:,} updates"
    if figure is None:
        return f"{head} (time unmeasured: `fab bench-step --rates none` with the same model measures it)"
    took = format_duration(interval_s(updates, figure.s_per_update))
    return f"{head} (≈ {took} at {format_step(figure.s_per_update)} s/update, {figure.source})"


def over_bound(updates: int | None, figure: StepFigure | None, bound_s: float = BOUND_S) -> str | None:
    """A line when the measured interval is over the bound, naming the interval that keeps it."""
    if not updates or figure is None or fits(updates, figure.s_per_update, bound_s):
        return None
    n = suggested_interval(figure.s_per_update, bound_s)
    return (f"a resume could redo {format_duration(interval_s(updates, figure.s_per_update))} of training "
            f"(more than {format_duration(bound_s)}): --set save_interval_updates={n} keeps it to "
            f"≈ {format_duration(interval_s(n, figure.s_per_update))}")


# ---------------------------------------------------------------- where the s/update comes from


def from_log(text: str) -> StepFigure | None:
    """The run's own recent s/update (rank 0's log), when it logged enough."""
    from train.report import logparse

    s = logparse.seconds_per_update(logparse.parse_log(text.splitlines()).records)
    return StepFigure(s, "this run's log") if s and s > 0 else None


def _model_options(overrides: list[str]) -> list[str]:
    """The overrides that change a step's cost (not how long the run is or how often it saves)."""
    ignore = {"max_update", "max_epoch", "save_interval_updates", "keep_interval_updates", "log_interval",
              "validate_interval_updates", "heartbeat_timeout"}
    return sorted(o.replace(" ", "") for o in overrides if o.split("=")[0].strip().replace("-", "_") not in ignore)


def from_bench(report: Mapping | None, *, preset: str, overrides: list[str], precision: str, comm: str,
               n_hosts: int, ranks: int, update_freq: int = 1) -> StepFigure | None:
    """The figure a `fab bench-step` report gives for a run of this model on as many hosts and ranks:
    its uncapped step ("none"), else its compute-only C (said as such). bench-step trains at
    update-freq 1: for K the compute part is counted K times (K × C plus the step's communication)."""
    if not report or report.get("preset") != preset or report.get("n_hosts") != n_hosts \
            or report.get("ranks") != ranks or report.get("precision", precision) != precision \
            or report.get("comm", "sync") != comm \
            or _model_options(list(report.get("overrides") or [])) != _model_options(overrides):
        return None
    when = f"fab bench-step of {report.get('timestamp', '?')}"
    compute = report.get("compute_s")
    step = next((p.get("s_per_update") for p in report.get("points", []) if p.get("rate") == "none"), None)
    if step:
        if update_freq > 1 and compute:
            return StepFigure(step + (update_freq - 1) * compute, f"{when}, scaled to update-freq {update_freq}")
        return StepFigure(float(step), when)
    if compute:
        return StepFigure(update_freq * float(compute), f"compute only, a lower bound: {when}")
    return None


def measured_step(run, hosts, resuming: bool) -> StepFigure | None:
    """The measured s/update for `fab train`'s start line (see the module docstring); None when
    tandem has none. Never fails the start: a log out of reach is skipped."""
    from ..cluster import world_size
    from ..plan import measurements
    from . import launch

    if resuming:
        try:
            figure = from_log(launch.read_log(run.hosts_of(hosts)[0], run, lines=2000))
        except Exception:  # noqa: BLE001 - an unreachable log only loses the figure
            figure = None
        if figure:
            return figure
    try:
        report = measurements.latest("step")
    except (OSError, ValueError):
        report = None
    ranks = world_size(hosts)
    return from_bench(report, preset=run.preset, overrides=list(run.overrides), precision=run.precision,
                      comm=run.comm, n_hosts=len(hosts), ranks=ranks, update_freq=run.update_freq)


def save_interval(run) -> int | None:
    value = run.resolved_preset().options.get("save_interval_updates")
    return int(value) if value else None
