"""A run's batch for the hosts it trains on: the preset's tokens per update (presets.RECIPES) as
max_tokens x update_freq x ranks (train.plan.batch.derive), max_tokens capped by the GPUs' memory
(the probe's figures and the memory model) or, on CPU hosts, the preset's max_tokens.

`fab train` derives it for a new run (the start line and --dry-run say how), again once the probe
has each GPU's memory, and for every new world: an elastic restart on the hosts left, a grow-back,
so the tokens per update stay the recipe's. The user's `--set max_tokens=` or `--update-freq` win.

One decision (`decide`) for every door: `fab train` (apply), `fab bench-step` (the batch its compute
time C is measured at) and `fab predict` (the batch it prices, GPU memory asked from nvidia-smi):
a prediction is for the batch that will run. `fab train`'s network check reads the run's own
(`of_run`): what `decide` gave at its start, --comm auto's extra accumulation included.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..cluster import Host
from ..recipe import presets, strategies
from ..recipe.record import Run
from . import batch as batch_model

VOCAB = 32000  # the joint dictionary the presets are meant for (the memory model's logits)


def options_of(run: Run) -> dict[str, presets.Value]:
    """The run's preset with the user's overrides: what one decision of its batch reads (resolved once,
    handed to the functions below)."""
    return presets.resolve(run.preset, run.overrides).options


def target(run: Run, options: Mapping[str, presets.Value] | None = None) -> int | None:
    """The run's tokens per update: the preset's, or `--set tokens_per_update=`."""
    value = (options_of(run) if options is None else options).get("tokens_per_update")
    return int(value) if value else None


def gpu_gib_of(answers: Mapping[str, dict] | None, hosts: Sequence[Host]) -> dict[str, float]:
    """Each GPU host's smallest GPU memory (GiB) as its probe reported it."""
    out: dict[str, float] = {}
    for host in hosts:
        gpus = (answers or {}).get(host.name, {}).get("gpus") or []
        if host.gpus > 0 and gpus:
            out[host.name] = min(g["memory_mib"] for g in gpus) / 1024
    return out


def cap(run: Run, hosts: Sequence[Host], gpu_gib: Mapping[str, float] | None = None,
        options: Mapping[str, presets.Value] | None = None) -> tuple[int, str]:
    """The largest max_tokens the run may use on `hosts`, and why."""
    options = options_of(run) if options is None else options
    preset_max = int(options.get("max_tokens") or 0) or 4096
    if not hosts or hosts[0].gpus == 0:
        return preset_max, "CPU hosts keep the preset's"
    known = {h.name: gib for h, gib in ((h, (gpu_gib or {}).get(h.name)) for h in hosts) if gib}
    if not known:
        if run.max_tokens_cap:
            return run.max_tokens_cap, "the GPUs' memory as probed at the start"
        return preset_max, "the preset's: GPU memory not probed yet"
    name, gib = min(known.items(), key=lambda kv: kv[1])
    extra = comm_extra_per_param(run, options)
    largest = batch_model.largest_max_tokens(options, VOCAB, gib, run.precision, extra_per_param=extra)
    beside = f", {run.comm}'s {extra} B a parameter" if extra else ""
    if batch_model.allocator_of() == batch_model.DEFAULT:  # PYTORCH_CUDA_ALLOC_CONF set without expandable segments
        beside += ", torch's default allocator"
    measured, said = batch_model.measured_cap(options, run.precision)
    if largest == measured:  # the GPU would hold more by the model: a batch never measured is not derived
        return largest, f"{said}; {name}'s {gib:.0f} GiB GPU would hold more by the memory model"
    return largest, f"what {name}'s {gib:.0f} GiB GPU holds (memory model, margin {batch_model.MARGIN:.2f}x{beside})"


def comm_extra_per_param(run: Run, options: Mapping[str, presets.Value] | None = None) -> int:
    """GPU bytes a parameter the run's --comm keeps beyond sync's (local SGD's copies)."""
    return strategies.parse(run.comm).extra_bytes_per_param(options_of(run) if options is None else options)


def derive(run: Run, hosts: Sequence[Host], gpu_gib: Mapping[str, float] | None = None,
           options: Mapping[str, presets.Value] | None = None) -> batch_model.Batch:
    """The run's batch on `hosts`; the user's max_tokens / --update-freq win."""
    options = options_of(run) if options is None else options
    limit, why = cap(run, hosts, gpu_gib, options)
    ranks = sum(h.ranks for h in hosts)
    given = int(options["max_tokens"]) if presets.overridden(run.overrides, "max_tokens") else None
    return batch_model.derive(target(run, options), ranks, limit, max_tokens=given,
                              update_freq=run.update_freq if run.update_freq_given else None, why=why)


def decide(run: Run, hosts: Sequence[Host], gpu_gib: Mapping[str, float] | None = None,
           options: Mapping[str, presets.Value] | None = None) -> batch_model.Batch:
    """The batch `run` trains with on `hosts`: derived from its tokens per update (derive), or, for a
    preset without one, its max_tokens and update_freq as they are."""
    options = options_of(run) if options is None else options
    if target(run, options):
        return derive(run, hosts, gpu_gib, options)
    return of_run(run, hosts, why="the preset's: no tokens per update to derive a batch from")


def of_run(run: Run, hosts: Sequence[Host], why: str = "as the run was started") -> batch_model.Batch:
    """The batch the run's command trains with as it stands (its max_tokens and update_freq)."""
    options = run.resolved_preset().options
    max_tokens = int(options.get("max_tokens") or 4096)
    return batch_model.Batch(max_tokens, max(1, run.update_freq), sum(h.ranks for h in hosts), target(run, options),
                             run.max_tokens_cap or max_tokens, why)


def apply(run: Run, hosts: Sequence[Host], gpu_gib: Mapping[str, float] | None = None) -> batch_model.Batch | None:
    """Derive and set the run's max_tokens and update_freq (a run without a target: unchanged)."""
    options = options_of(run)
    if not target(run, options):
        return None
    b = decide(run, hosts, gpu_gib, options)
    run.update_freq, run.max_tokens_cap = b.update_freq, b.cap
    run.max_tokens = None if presets.overridden(run.overrides, "max_tokens") else b.max_tokens
    return b


def update_freq_for(run: Run, ranks: int, scaled: int) -> int:
    """The update_freq of a new world of `ranks` ranks (elastic restart, grow-back): re-derived where
    the run has a target, with the max_tokens cap found at its start (max_tokens set again too), then
    times `--comm auto`'s extra accumulation (run.update_freq_scale), else `scaled` (the old ranks x
    update_freq kept, as before)."""
    options = options_of(run)
    if not target(run, options) or run.update_freq_given:
        return scaled
    limit = run.max_tokens_cap or int(options.get("max_tokens") or 4096)
    given = int(options["max_tokens"]) if presets.overridden(run.overrides, "max_tokens") else None
    b = batch_model.derive(target(run, options), ranks, limit, max_tokens=given)
    run.max_tokens = None if given else b.max_tokens
    return b.update_freq * max(1, run.update_freq_scale)


def choose_update_freq(run: Run, chosen: int) -> None:
    """`--comm auto` chose `chosen` (the derived update_freq, or 2x / 4x it on a slow link): set it,
    and remember the factor for every later world (update_freq_for)."""
    derived = max(1, run.update_freq)
    run.update_freq_scale = max(1, chosen // derived) if chosen % derived == 0 else 1
    run.update_freq = chosen
