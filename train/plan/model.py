"""The cost model: will the network dominate each step, and how long will the run take?

    python -m train.plan.model --preset transformer_wmt_en_de --vocab 32000 --ranks 2 \\
        --link-mbit 100 --compute-s 0.6 --max-update 300000 [--json]

It needs no hosts: every figure is given (exit 3 when network-bound). `fab predict` runs the same
model on figures measured on the cluster (train.plan.predict).

Inputs: the gradient size S (parameters × bytes per element: 4 in fp32, 2 when fairseq
trains in fp16/bf16 and all-reduces half-precision gradients), the number of ranks n, the
hosts' link bandwidth B (measured: iperf3 between the hosts), and a measured compute-only
step time C (one rank, no communication).

- Communication per update: a ring all-reduce moves 2(n−1)/n × S bytes in and out of
  every rank; across hosts every host's NIC carries that much, so comm = 2(n−1)/n × S / B.
  n counts ranks, not hosts: with several ranks a host (GPUs, a CPU host's cpu_ranks), ranks
  numbered host by host put one ring edge through each NIC, which again carries 2(n−1)/n × S
  (2 hosts × 2 ranks: 1.5 S a NIC, against 1.0 S with one rank a host; the lab measures it,
  tests/bench/test_two_ranks_step.py). On one host (no NIC crossing) it is 0 unless an
  intra-host bandwidth is given.
- Overlap: DDP all-reduces gradient buckets while the backward pass still runs, hiding
  part of the communication. Modelled as `hidden = min(comm, overlap × C)`: `overlap` is
  the fraction of one micro-batch's compute time that communication can hide behind. It is
  0 for fairseq's `legacy_ddp` (all-reduce after the backward pass: what the CPU/gloo runs
  use) and at most ≈0.6 for c10d DDP on GPUs (the backward pass is about two thirds of a
  step and the last bucket cannot overlap). Measure it: it is the one free parameter.
- `--update-freq K` (gradient accumulation) runs K micro-batches per update but
  all-reduces once; only the last micro-batch's backward overlaps, so
  step(K) = K × C + comm − hidden.
- Scaling efficiency = K × C / step(K) (the time without communication over the time with
  it); the smallest K with efficiency ≥ 90% is K = ⌈9 × exposed / C⌉.
- Network-bound: the exposed communication (comm − hidden) is more than half of the step.
- The run: max_update × step(K) seconds.
- Communication strategies (train.recipe.strategies): each says the bytes of its all-reduce
  (`fp16` 2 bytes per gradient instead of 4; `local-sgd:H` the fp32 parameters' deltas once every
  H updates, after the optimizer step, so nothing hides it: comm per update = 2(n−1)/n × 4P / B / H)
  and whether it overlaps. `choose` climbs their one ladder (strategies.ladder: sync, fp16,
  update-freq, local SGD, ...) and takes the least invasive one that reaches 90%.

The field reports' numbers come out of it (tests/unit/train/plan/test_model.py): Transformer base ≈
61M parameters = 244 MB of fp32 gradients; two ranks over 100 Mb/s (12.5 MB/s) spend
19.5 s per update communicating, four ranks (2 hosts × 2 GPUs) 29 s: "20–30 s/step".
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass

from train.recipe import strategies
from train.recipe.params import preset_params
from train.recipe.presets import resolve

BYTES_PER_ELEMENT = {"fp32": 4, "fp16": 2, "bf16": 2}


def mbit_to_bytes_per_s(mbit_per_s: float) -> float:
    """Link rate in Mbit/s (as iperf3 and NIC specs give it) → bytes per second."""
    return mbit_per_s * 1e6 / 8


def gradient_bytes(params: int, precision: str = "fp32") -> int:
    """Bytes all-reduced per update: parameters × bytes per element of the gradients."""
    return params * BYTES_PER_ELEMENT[precision]


def allreduce_bytes_per_rank(size_bytes: float, ranks: int) -> float:
    """Bytes each rank sends (and receives) in a ring all-reduce of `size_bytes`: 2(n−1)/n × S."""
    if ranks < 1:
        raise ValueError(f"ranks must be at least 1, not {ranks}")
    return 2 * (ranks - 1) / ranks * size_bytes


@dataclass(frozen=True)
class Prediction:
    """Predicted cost of one update (seconds) and of the run."""

    params: int
    ranks: int
    hosts: int
    gradient_bytes: int
    link_bytes_per_s: float
    compute_s: float  # one micro-batch, measured without communication
    update_freq: int
    overlap: float
    comm_s: float  # all-reduce time if nothing hid it
    hidden_s: float  # part of it hidden behind the backward pass
    step_s: float  # predicted seconds per update
    max_update: int | None
    update_freq_for_90: int  # the --update-freq that brings efficiency to 90%
    comm: str = "sync"  # the communication strategy (train.recipe.strategies)
    sync_updates: int = 0  # the strategy's synchronous start (local SGD's): its first updates
    sync_step_s: float = 0.0  # seconds per update of that start (all-reduced as sync does)

    @property
    def exposed_comm_s(self) -> float:
        return self.comm_s - self.hidden_s

    @property
    def comm_share(self) -> float:
        """Fraction of the step spent waiting on the network."""
        return self.exposed_comm_s / self.step_s if self.step_s else 0.0

    @property
    def network_bound(self) -> bool:
        return self.comm_share > 0.5

    @property
    def efficiency(self) -> float:
        """Scaling efficiency: compute time over step time (1.0 = the network costs nothing)."""
        return self.update_freq * self.compute_s / self.step_s if self.step_s else 1.0

    @property
    def run_hours(self) -> float | None:
        """The run's training steps; local SGD's synchronous start at its own, slower step."""
        if self.max_update is None:
            return None
        start = min(self.sync_updates, self.max_update)
        return (start * self.sync_step_s + (self.max_update - start) * self.step_s) / 3600

    def as_dict(self) -> dict[str, object]:
        out = asdict(self)
        for name in ("exposed_comm_s", "comm_share", "network_bound", "efficiency", "run_hours"):
            out[name] = getattr(self, name)
        return out


def duration(seconds: float) -> str:
    """A run's length as people say it: 48 s, 13 min, 2.3 h."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def update_freq_for_efficiency(compute_s: float, exposed_comm_s: float, target: float = 0.9) -> int:
    """Smallest K with K·C / (K·C + exposed) ≥ target (exposed does not shrink with K)."""
    if not 0 < target < 1:
        raise ValueError(f"target efficiency must be between 0 and 1, not {target}")
    if exposed_comm_s <= 0:
        return 1
    if compute_s <= 0:
        raise ValueError("compute_s must be positive to reach an efficiency target")
    k = math.ceil(target / (1 - target) * exposed_comm_s / compute_s - 1e-9)
    return max(k, 1)


OVERLAPPING_BACKENDS = ("pytorch_ddp", "c10d")


def ddp_backend(options: Mapping[str, object], cpu: bool) -> str:
    """The DDP backend a run uses: the preset's, else tandem's default (legacy_ddp on CPU hosts,
    fairseq's pytorch_ddp on GPUs)."""
    return str(options.get("ddp_backend") or ("legacy_ddp" if cpu else "pytorch_ddp"))


def compute_given_overlap(step_s: float, comm_s: float, overlap: float, update_freq: int = 1) -> float:
    """C (one batch) from one measured step of `update_freq` batches, given the overlap:
    step = K × C + max(0, comm − overlap × C)."""
    if comm_s * update_freq <= overlap * step_s:
        return step_s / update_freq
    return max((step_s - comm_s) / (update_freq - overlap), 1e-6)


def fit_overlap(fastest: tuple[float, float], points: Iterable[tuple[float, float]], update_freq: int = 1) -> float:
    """The overlap (0 to 1, in steps of 0.01) that predicts `points` [(comm_s, measured step_s)]
    best (least squares of the relative error), C following from the `fastest` (comm_s, step_s).
    On a tie the smaller overlap: the prediction that promises less."""
    points = list(points)
    if not points:
        return 0.0

    def squared_error(overlap: float) -> float:
        c = compute_given_overlap(fastest[1], fastest[0], overlap, update_freq)
        return sum(((update_freq * c + max(0.0, comm - overlap * c)) / step - 1) ** 2 for comm, step in points)

    return min((squared_error(k / 100), k / 100) for k in range(101))[1]


def predict(
    params: int,
    ranks: int,
    link_bytes_per_s: float,
    compute_s: float,
    *,
    hosts: int | None = None,
    precision: str = "fp32",
    overlap: float = 0.0,
    update_freq: int = 1,
    max_update: int | None = None,
    intra_host_bytes_per_s: float | None = None,
    target_efficiency: float = 0.9,
    comm: str = "sync",
    sync_updates: int | Mapping[str, int] = 0,
) -> Prediction:
    """Predict seconds per update (and the run's hours) for `ranks` ranks on `hosts` hosts.

    `hosts` defaults to `ranks` (one rank per host). With one host the all-reduce never
    crosses a NIC: it costs 0 unless `intra_host_bytes_per_s` is given. `comm`: the
    communication strategy; `comm_s` is then its average per update. `sync_updates`: the strategy's
    synchronous start (local SGD's), in the run's hours; a mapping gives each strategy's own
    (strategies.starts).
    """
    strategy = strategies.parse(comm)
    hosts = ranks if hosts is None else hosts
    if not 1 <= hosts <= ranks:
        raise ValueError(f"hosts must be between 1 and ranks ({ranks}), not {hosts}")
    if not 0 <= overlap <= 1:
        raise ValueError(f"overlap is a fraction between 0 and 1, not {overlap}")
    if update_freq < 1:
        raise ValueError(f"update_freq must be at least 1, not {update_freq}")
    if hosts > 1 and link_bytes_per_s <= 0:
        raise ValueError("link bandwidth must be positive")
    rate = link_bytes_per_s if hosts > 1 else intra_host_bytes_per_s if ranks > 1 else None

    def seconds(size: float) -> float:
        return allreduce_bytes_per_rank(size, ranks) / rate if rate else 0.0

    size = strategy.payload_bytes(params, precision)
    comm = seconds(size) / strategy.syncs_every
    hidden = min(comm, overlap * compute_s) if strategy.overlaps else 0.0
    step = update_freq * compute_s + comm - hidden
    if isinstance(sync_updates, Mapping):
        sync_updates = sync_updates.get(strategy.name, 0)
    start = sync_updates if strategy.starts_synchronous else 0
    start_step = 0.0
    if start:
        start_comm = seconds(params * strategy.start_bytes_per_element(precision))
        start_step = update_freq * compute_s + start_comm - (
            min(start_comm, overlap * compute_s) if strategy.start_overlaps else 0.0)
    return Prediction(
        params=params,
        ranks=ranks,
        hosts=hosts,
        gradient_bytes=size,
        link_bytes_per_s=link_bytes_per_s,
        compute_s=compute_s,
        update_freq=update_freq,
        overlap=overlap,
        comm_s=comm,
        hidden_s=hidden,
        step_s=step,
        max_update=max_update,
        update_freq_for_90=update_freq_for_efficiency(compute_s, comm - hidden, target_efficiency),
        comm=str(strategy),
        sync_updates=start,
        sync_step_s=start_step,
    )


def period_for(every_update_s: float, compute_s: float, target: float, max_period: int) -> int:
    """The smallest period H (2..max_period) of a periodic strategy (local SGD's averaging every H
    updates) that keeps `target` of the compute speed: C / (C + comm/H) ≥ target, so
    H ≥ comm × target / ((1 − target) × C)."""
    if compute_s <= 0:
        return max_period
    return min(max_period, max(2, math.ceil(every_update_s * target / ((1 - target) * compute_s) - 1e-9)))


local_sgd_period = period_for  # its first name


@dataclass(frozen=True)
class Choice:
    """What `--comm auto` picked, with the prediction that decided it and the ones it passed over."""

    prediction: Prediction
    tried: list[Prediction]
    reached: bool  # the pick reaches the target (else it is the best there was)
    target: float

    @property
    def comm(self) -> str:
        return self.prediction.comm

    @property
    def update_freq(self) -> int:
        return self.prediction.update_freq

    def flag(self) -> str:
        """The fab train options that run it."""
        extra = f" --update-freq {self.update_freq}" if self.update_freq > 1 else ""
        return f"--comm {self.comm}{extra}"

    def lines(self) -> list[str]:
        def line(p: Prediction) -> str:
            k = f" --update-freq {p.update_freq}" if p.update_freq > 1 else ""
            return f"{p.comm}{k}: {p.step_s / p.update_freq:.3f} s per batch, efficiency {p.efficiency:.0%}"
        out = [f"tried, least invasive first (target {self.target:.0%}):", *("  " + line(p) for p in self.tried)]
        p = self.prediction
        verdict = "reaches" if self.reached else "misses; the best there is"
        out.append(f"choice: {self.flag()}: {p.step_s:.3f} s/update, {p.efficiency:.0%} of the compute-only speed "
                   f"({verdict} {self.target:.0%})")
        return out


def choose(params: int, ranks: int, link_bytes_per_s: float, compute_s: float, *, overlaps: Mapping[str, float],
           max_update_freq: int = 4, max_period: int = 1000, target: float = 0.9, update_freq: int = 1,
           **kwargs: object) -> Choice:
    """The least invasive strategy predicted to reach `target` scaling efficiency, up the one ladder
    (train.recipe.strategies.ladder): sync as the run would run it (at its `update_freq`: the one
    derived from the preset's tokens per update, train.plan.batch); fp16 compression; the update_freq
    up to `max_update_freq` times larger (the effective batch grows with it); ...; local SGD with the
    smallest H that reaches it (at most `max_period`). `overlaps`: the overlap each strategy gets
    ({"sync": ..., "fp16": ...})."""
    def at(strategy: strategies.Strategy, k: int = update_freq) -> Prediction:
        return predict(params, ranks, link_bytes_per_s, compute_s, comm=str(strategy), update_freq=k,
                       overlap=overlaps.get(strategy.name, 0.0), **kwargs)  # type: ignore[arg-type]

    tried: list[Prediction] = []
    sync = strategies.parse("sync")
    for rung in strategies.ladder(str(kwargs.get("precision", "fp32")), params):
        if tried and tried[-1].efficiency >= target:
            break
        if rung == strategies.UPDATE_FREQ:
            k = 2
            while tried[-1].efficiency < target and k <= max_update_freq:
                tried.append(at(sync, update_freq * k))
                k *= 2
        elif isinstance(rung, strategies.Strategy) and rung.periodic:
            every_update = at(rung.with_period(2)).comm_s * 2  # its all-reduce, were it every update
            tried.append(at(rung.with_period(period_for(every_update, compute_s * update_freq, target, max_period))))
        elif isinstance(rung, strategies.Strategy):
            tried.append(at(rung))
    good = [p for p in tried if p.efficiency >= target]
    pick = good[0] if good else max(tried, key=lambda p: p.efficiency)
    return Choice(pick, tried, bool(good), target)


def sweep(params: int, ranks: int, compute_s: float, rates_mbit: Iterable[float], **kwargs: object) -> list[Prediction]:
    """Predictions at several link rates (Mbit/s): the model's curve for the bench-step plot."""
    return [
        predict(params, ranks, mbit_to_bytes_per_s(rate), compute_s, **kwargs)  # type: ignore[arg-type]
        for rate in rates_mbit
    ]


def explain(p: Prediction) -> str:
    """A few lines a user can act on: the numbers behind the verdict."""
    mb = p.gradient_bytes / 1e6
    strategy = strategies.parse(p.comm)
    what = strategy.describe()
    lines = [
        f"model: {p.params / 1e6:.1f}M parameters → {mb:.0f} MB of {what}",
        f"ring all-reduce over {p.ranks} ranks on {p.hosts} hosts: "
        f"{allreduce_bytes_per_rank(p.gradient_bytes, p.ranks) / 1e6:.0f} MB per rank"
        + (f" at {p.link_bytes_per_s * 8 / 1e6:.0f} Mbit/s" if p.hosts > 1 else ""),
        f"per update: compute {p.update_freq} × {p.compute_s:.3f} s + communication {p.comm_s:.2f} s"
        f" − hidden {p.hidden_s:.2f} s = {p.step_s:.2f} s",
        f"network share of the step {p.comm_share:.0%}, scaling efficiency {p.efficiency:.0%}"
        + (" — NETWORK-BOUND" if p.network_bound else ""),
    ]
    if p.run_hours is not None:
        if p.sync_updates:
            lines.append(f"the first {min(p.sync_updates, p.max_update):,} updates synchronous "
                         f"({strategy.start_label}): {p.sync_step_s:.2f} s each")
        lines.append(f"{p.max_update} updates ≈ {duration(p.run_hours * 3600)} (training steps only: validation "
                     "and checkpoints come on top)")
    if p.update_freq_for_90 > p.update_freq and strategy.syncs_every == 1:
        lines.append(f"--update-freq {p.update_freq_for_90} would bring scaling efficiency to 90%")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Print the prediction (or its JSON); exit 3 when the run would be network-bound."""
    parser = argparse.ArgumentParser(description="Predict seconds per update and the run's hours.")
    size = parser.add_mutually_exclusive_group(required=True)
    size.add_argument("--params", type=float, help="parameters, e.g. 61e6")
    size.add_argument("--preset", help="a train.recipe.presets preset (with --vocab)")
    parser.add_argument("--vocab", type=int, default=32000, help="joint dictionary size (with --preset)")
    parser.add_argument("--ranks", type=int, required=True)
    parser.add_argument("--hosts", type=int, help="default: one rank per host")
    parser.add_argument("--link-mbit", type=float, required=True, help="measured host-to-host Mbit/s")
    parser.add_argument("--compute-s", type=float, required=True, help="measured compute-only s/update")
    parser.add_argument("--precision", choices=sorted(BYTES_PER_ELEMENT), default="fp32")
    parser.add_argument("--overlap", type=float, default=0.0)
    parser.add_argument("--update-freq", type=int, default=1)
    parser.add_argument("--max-update", type=int)
    parser.add_argument("--comm", default="sync", help=f"{strategies.syntax()} or auto")
    parser.add_argument("--sync-updates", type=int, help="local SGD's synchronous start in updates "
                        "(default: the preset's warmup_updates, else 0)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    start: int | dict[str, int] = 0
    if args.preset:
        options = resolve(args.preset).options
        params = preset_params(options, args.vocab)
        start = strategies.starts(options)
    else:
        params = int(args.params)
    kw = {"hosts": args.hosts, "precision": args.precision, "max_update": args.max_update,
          "sync_updates": start if args.sync_updates is None else args.sync_updates}
    link = mbit_to_bytes_per_s(args.link_mbit)
    choice = None
    if args.comm == "auto":
        choice = choose(params, args.ranks, link, args.compute_s,
                        overlaps=dict.fromkeys(strategies.overlapping(), args.overlap), **kw)  # type: ignore[arg-type]
        p = choice.prediction
    else:
        p = predict(params, args.ranks, link, args.compute_s, overlap=args.overlap, update_freq=args.update_freq,
                    comm=args.comm, **kw)  # type: ignore[arg-type]
    if args.json:
        print(json.dumps(p.as_dict(), indent=1))
    else:
        print("\n".join([*(choice.lines() if choice else []), explain(p)]))
    return 3 if p.network_bound else 0


if __name__ == "__main__":
    raise SystemExit(main())
