"""Bounded loss: how often a run saves, chosen in minutes of its own update time, and `fab train`'s word on it.

fairseq saves a checkpoint every `save_interval_updates` updates (on rank 0; tandem copies it to
every host and to the controller). A run that stops, and the elastic restart after a lost host
(train.run.elastic), go on from the newest checkpoint: at most one interval of updates is done
again. `fab train` chooses the interval for the run at hand (`choose`): the largest round number
of updates (1, 2 or 5 x 10^k) whose time is within ~10 minutes (BOUND_S) at the run's s/update
from, first found (the lab's tiny keeps 50 updates, ≈ 25 s there: its tests resume past update 50):

- resuming: the run's own log (rank 0's recent s/update, validation and saves included);
- else the latest `fab bench-step` of the same model (preset and model options, precision, --comm)
  on as many hosts and ranks: its uncapped ("none") step, its compute part scaled to the run's batch
  where bench-step trained another, else its compute-only C (a lower bound);
- else the preset's REFERENCE, predicted for the run's tokens per rank and GPU (`predicted_step`).

A user's `--set save_interval_updates=N` wins; the start line says the interval and its time either way:

    >>> start_phrase(2000, StepFigure(0.27, "fab bench-step of 2026-11-23T05:51:26+00:00"))
    'checkpoint every 2,000 updates (≈ 9 min at 0.27 s/update, fab bench-step of 2026-11-23T05:51:26+00:00)'

Where the user's interval is over the bound, `over_bound` says so and names the interval that
keeps it: tandem does not change what the user set.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from ..plan.batching import VOCAB
from ..plan.mfu import peak_tflops
from ..recipe import presets
from . import disk

BOUND_S = 600  # ~10 minutes of training, at most, done again after a resume


@dataclass(frozen=True)
class Reference:
    """A preset's measured s/update on the hardware it is meant for: the prediction where the run has
    no measurement of its own (predicted_step), and the loss bound it is held to."""

    hardware: str  # whose step it is, as the start line says it
    s_per_update: float  # the network's share fab train allows included
    source: str
    tokens: int  # max_tokens x update_freq of one rank at which s_per_update was measured
    least_s: float = 0.0  # no update takes less, however few its tokens (a small batch is launch-bound)
    gpu: str | None = None  # NVML's name of the GPU measured: another GPU scales by its peak (train.plan.mfu)
    # a fixed interval instead of one chosen by time: the lab's tests and demos stop or lose a host
    # past update 50 of tiny and expect to resume from a checkpoint there, whatever the lab's step
    every: int | None = None


H100 = "NVIDIA H100 80GB HBM3"

# H100 figures on one GPU at the batch fab train derives for it (issue 36's table: words/s, and
# benchmarks/README.md's 0.875 words a max_tokens token); the least step: benchmarks/README.md's at the
# presets' 4,096 and 3,584 tokens. On a cluster `fab train` refuses a run whose network would take more
# than half of the step (unless --accept-slow-network), so a run that starts has a step of at most 2 x C.
REFERENCE: dict[str, Reference] = {
    "tiny": Reference(
        "the lab's step (2 CPU hosts on 2 shared cores)", 0.5,
        "0.35–0.5 s/update with two ranks on the lab's shared cores (0.155–0.172 s in fab bench-step, "
        "one thread a rank)", tokens=2048, every=50),
    "transformer_wmt_en_de": Reference(
        "an H100's step x2 for the network", 2 * 0.0875,
        "0.0875 s/update on one H100 at 32,768 tokens (313,682 words/s), x2 for the network's share",
        tokens=32768, least_s=2 * 0.061, gpu=H100),
    "transformer_vaswani_wmt_en_de_big": Reference(
        "an H100's step x2 for the network", 2 * 2.12,
        "2.12 s/update on one H100 at 30,583 tokens x update-freq 15 (189,407 words/s), x2 for the "
        "network's share", tokens=30583 * 15, least_s=2 * 0.074, gpu=H100),
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


def on_fewer_ranks(run, update_freq: int) -> int | None:
    """`run`'s checkpoint interval once the keepers restart it on fewer ranks at `update_freq`: each
    update then takes about update_freq / run.update_freq times longer (more batches a rank), so fewer
    updates keep the interval's minutes (a host lost late in a days-long run would otherwise double
    the work the next loss costs). An interval tandem did not choose by time stays: the user's
    --set (run.save_interval_updates None), tiny's fixed one."""
    every = run.save_interval_updates
    reference = REFERENCE.get(run.preset)
    if not every or update_freq <= max(1, run.update_freq) or (reference and reference.every):
        return every
    return suggested_interval(update_freq / max(1, run.update_freq), every)


def fits(updates: int, s_per_update: float, bound_s: float = BOUND_S) -> bool:
    """Within the bound, with 10% of slack (`~10 minutes`)."""
    return interval_s(updates, s_per_update) <= 1.1 * bound_s


def start_phrase(updates: int | None, figure: StepFigure | None, given: bool = False) -> str:
    """The start line's part on checkpoints, e.g. `checkpoint every 2,000 updates (≈ 9 min at 0.27
    s/update, fab bench-step of ...)`; `given`: the user's --set chose the interval."""
    if not updates:
        return "no periodic checkpoint (save_interval_updates=0): a resume starts from the last epoch's end"
    head = f"checkpoint every {updates:,} updates" + (" as set" if given else "")
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
    from train.recipe import logformat

    s = logformat.seconds_per_update(logformat.parse_log(text.splitlines()).records)
    return StepFigure(s, "this run's log") if s and s > 0 else None


def _model_options(overrides: list[str]) -> list[str]:
    """The overrides that change a step's cost (not how long the run is or how often it saves)."""
    ignore = {"max_update", "max_epoch", "save_interval_updates", "keep_interval_updates", "log_interval",
              "validate_interval_updates", "heartbeat_timeout"}
    return sorted(o.replace(" ", "") for o in overrides if o.split("=")[0].strip().replace("-", "_") not in ignore)


def from_bench(report: Mapping | None, *, preset: str, overrides: list[str], precision: str, comm: str,
               n_hosts: int, ranks: int, update_freq: int = 1, max_tokens: int | None = None) -> StepFigure | None:
    """The figure a `fab bench-step` report gives for a run of this model on as many hosts and ranks
    at `max_tokens` x `update_freq` a rank (None: the batch bench-step trained at): its uncapped step
    ("none") with the compute part scaled to the run's batch where it differs
    (train.plan.measurements.uncapped_step_at), else its compute-only C (said as such)."""
    from ..plan import measurements

    if not report or report.get("preset") != preset or report.get("n_hosts") != n_hosts \
            or report.get("ranks") != ranks or report.get("precision", precision) != precision \
            or report.get("comm", "sync") != comm \
            or _model_options(list(report.get("overrides") or [])) != _model_options(overrides):
        return None
    tokens = max_tokens or measurements.batch_of(dict(report))[0]
    if scaled := measurements.uncapped_step_at(dict(report), tokens, update_freq):
        return StepFigure(*scaled)
    step = next((p.get("s_per_update") for p in report.get("points", []) if p.get("rate") == "none"), None)
    if step:  # no compute-only C to scale it with: as measured
        return StepFigure(float(step), f"fab bench-step of {report.get('timestamp', '?')}")
    if compute := measurements.compute_at(dict(report), tokens):
        return StepFigure(update_freq * compute.seconds, f"compute only, a lower bound: {compute.source}")
    return None


def measured_step(run, hosts, resuming: bool, options: Mapping | None = None) -> StepFigure | None:
    """The measured s/update for `fab train`'s start line (see the module docstring); None when
    tandem has none. Never fails the start: a log out of reach is skipped. `options`: the run's
    preset's, already resolved."""
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
    max_tokens = int((options if options is not None else run.resolved_preset().options).get("max_tokens") or 0) \
        or None
    return from_bench(report, preset=run.preset, overrides=list(run.overrides), precision=run.precision,
                      comm=run.comm, n_hosts=len(hosts), ranks=ranks, update_freq=run.update_freq,
                      max_tokens=max_tokens)


def predicted_step(preset: str, tokens_per_rank: int | None = None, gpu_name: str | None = None) -> StepFigure | None:
    """The preset's REFERENCE step for a run of `tokens_per_rank` (max_tokens x update_freq) on
    `gpu_name`: linear in the tokens (no less than the reference's least step), and another GPU
    than the one measured by the ratio of their peaks; None for a preset without a reference."""
    ref = REFERENCE.get(preset)
    if ref is None:
        return None
    tokens = tokens_per_rank or ref.tokens
    s = max(ref.least_s, ref.s_per_update * tokens / ref.tokens)
    scaled = f", scaled to {tokens:,} tokens a rank" if tokens != ref.tokens else ""
    theirs, ours = peak_tflops(ref.gpu), peak_tflops(gpu_name)
    if theirs and ours and gpu_name != ref.gpu:
        s *= theirs / ours
        scaled += f" and to a {gpu_name}'s peak"
    return StepFigure(s, f"predicted: {ref.hardware}{scaled}; `fab bench-step --rates none` measures it")


def derived_interval(preset: str, figure: StepFigure | None, given: int | None = None,
                     bound_s: float = BOUND_S) -> int | None:
    """The run's save_interval_updates: the user's (`given`), else the reference's fixed one (tiny),
    else the largest round interval within `bound_s` (~10 minutes) at `figure`'s s/update; None
    without any (the preset's own value stays)."""
    if given is not None:
        return given
    ref = REFERENCE.get(preset)
    if ref and ref.every:
        return ref.every
    if figure is None:
        return None
    return suggested_interval(figure.s_per_update, bound_s)


# The keepers copy each checkpoint from rank 0's host to every other host over the cluster link, beside
# the all-reduce: at most this share of the link's time goes to it. Transformer big's 2.5 GB file to one
# peer at 100 Mbit/s takes 200 s, so it saves every 1,000 s at least there, not every 10 minutes.
REPLICATION_SHARE = 0.2


def replication_floor_s(checkpoint_bytes: float, peers: int, link_mbps: float | None) -> float | None:
    """The shortest time between saves that keeps copying checkpoints to `peers` hosts (all from rank
    0's NIC) within REPLICATION_SHARE of a `link_mbps` link; None without a link or a peer."""
    if not link_mbps or peers < 1:
        return None
    return checkpoint_bytes * peers * 8 / (link_mbps * 1e6) / REPLICATION_SHARE


@dataclass(frozen=True)
class Checkpoints:
    """How often a run saves and why: what `fab train`'s start line says."""

    every: int | None
    figure: StepFigure | None
    given: bool  # the user's --set save_interval_updates
    replication_s: float | None = None  # a save's copy to the peers, when it stretched the interval

    def phrase(self) -> str:
        said = start_phrase(self.every, self.figure, given=self.given)
        if self.replication_s is None:
            return said
        return (f"{said}; longer than {format_duration(BOUND_S)}: each checkpoint takes "
                f"{format_duration(self.replication_s * REPLICATION_SHARE)} to reach the other hosts over the "
                f"measured link, at most {REPLICATION_SHARE:.0%} of its time")

    def warning(self) -> str | None:
        return None if self.replication_s is not None else over_bound(self.every, self.figure)


def choose(run, hosts, read_log: bool) -> Checkpoints:
    """Set the run's save_interval_updates from its step's time (the user's --set wins) and say it.
    `read_log`: a resume whose rank 0 log may be read for its measured step. Call it once the batch
    (max_tokens, update_freq) and the GPU are known: the predicted step depends on them."""
    run.save_interval_updates = None  # the preset's, or the user's, until derived below
    options = run.resolved_preset().options
    given = int(options.get("save_interval_updates") or 0) \
        if presets.overridden(run.overrides, "save_interval_updates") else None
    tokens = int(options.get("max_tokens") or 0) * max(1, run.update_freq) or None
    figure = measured_step(run, hosts, read_log, options) or predicted_step(run.preset, tokens, run.gpu_name)
    floor = replication_floor_s(disk.checkpoint_bytes(options, VOCAB), len(hosts) - 1, run.link_mbps)
    fixed = REFERENCE[run.preset].every if run.preset in REFERENCE else None
    stretched = floor if floor and floor > BOUND_S and given is None and figure and not fixed else None
    every = derived_interval(run.preset, figure, given, bound_s=stretched or BOUND_S)
    if given is None and every:
        run.save_interval_updates = every  # train.recipe.record applies it to the command
    elif every is None:
        every = int(options.get("save_interval_updates") or 0)
    return Checkpoints(every, figure, given is not None, stretched)
