"""Series and figures drawn from a loaded run (train.report.run_data): rank 0's logged intervals, losses
by update, NIC throughput per sample and per host, the learning-rate schedule, the batch fill and MFU,
the link to compare with, and the statistics (mean, slope, correlation) the answers judge them by. Numbers
only: no verdicts, no words (train.report.answers), no plots.

Definitions used throughout:

- step time of a logged interval = 1 / `ups` of its `train_inner` line: the interval's wall
  time over its updates, as fairseq measured it (validation and checkpoint saves inside the
  interval included).
- NIC throughput of a host = max(tx, rx) of a sample, in Mbit/s (a full-duplex link carries
  its rate each way). "While training" = samples inside a logged interval (its end time
  minus its updates / ups, to its end time).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from train.plan import batch as batch_model
from train.plan import mfu as flops
from train.report.run_data import RunData


@dataclass
class Interval:
    """One `train_inner` line: updates (first, last], seconds per update, its time span."""

    update: int
    updates: int
    step_s: float
    start: float
    end: float
    wps: float | None
    loss: float | None
    lr: float | None


def intervals(data: RunData) -> list[Interval]:
    """Rank 0's `train_inner` lines as intervals. An interval covers the updates since the
    previous line, or since the checkpoint fairseq loaded when it (re)started in between."""
    out: list[Interval] = []
    starts = [s + data.time_shift_s for s in data.starts]
    for r in data.log.of("train_inner"):
        ups, update = r.get("ups"), r.update
        if not ups or update is None:
            continue
        end = data.when(r)
        prev = out[-1] if out else None
        restarted = prev is None or update <= prev.update or any(prev.end < s <= end for s in starts)
        if restarted:
            loaded = [u for u in data.log.resumed_from if u < update]
            base = loaded[-1] if loaded and prev is not None else (loaded[0] if loaded else 0)
        else:
            base = prev.update
        n = max(update - base, 1)
        step = 1.0 / ups
        out.append(Interval(update, n, step, end - n * step, end, r.get("wps"), r.get("loss"), r.get("lr")))
    return out


def nic_mbps(sample: dict) -> float:
    """A sample's NIC throughput: the busier direction, Mbit/s."""
    return max(float(sample.get("tx_Bps") or 0), float(sample.get("rx_Bps") or 0)) * 8 / 1e6


def during(samples: list[dict], spans: list[Interval]) -> list[dict]:
    return [s for s in samples if any(iv.start <= s["t"] <= iv.end for iv in spans)]


def mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def slope(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of ys over xs (None with fewer than two distinct xs)."""
    try:
        return statistics.linear_regression(xs, ys).slope
    except statistics.StatisticsError:
        return None


def pearson(xs: list[float], ys: list[float]) -> float | None:
    """Pearson's r (None with fewer than three points, or when either side is constant)."""
    if len(xs) < 3:
        return None
    try:
        return statistics.correlation(xs, ys)
    except statistics.StatisticsError:
        return None


def last_part(points: list[tuple[int, float]], fraction: float = 1 / 3, at_least: int = 3) -> list[tuple[int, float]]:
    """The points in the last `fraction` of the updates they span, at least `at_least` of them."""
    if not points:
        return []
    first, last = points[0][0], points[-1][0]
    cut = last - (last - first) * fraction
    part = [p for p in points if p[0] >= cut]
    return part if len(part) >= at_least else points[-at_least:]


def link(data: RunData, expected_mbps: float | None) -> tuple[float | None, str]:
    """The link rate to compare with: the one `fab train` measured as this run started, else
    the latest bench-net measurement, else the inventory's."""
    at_start = data.run.get("link_mbps")
    if isinstance(at_start, int | float) and at_start > 0:
        return float(at_start), "measured by iperf3 as this run started"
    measured = [b for b in data.bench if isinstance(b.get("link_mbps"), int | float) and b["link_mbps"] > 0]
    if measured:
        best = max(measured, key=lambda b: str(b.get("timestamp", "")))
        return float(best["link_mbps"]), f"measured by bench-net (iperf3) {best.get('timestamp', '')}".strip()
    if expected_mbps:
        return float(expected_mbps), "the inventory's expected NIC speed (not measured)"
    return None, "unknown (no bench-net result, no expected speed)"


def loss_points(data: RunData, kind: str) -> list[tuple[int, float]]:
    return [(r.update, loss) for r in data.log.of(kind)
            if r.update is not None and (loss := r.get("loss")) is not None]


def gaps(data: RunData) -> list[tuple[int, float, float, float]]:
    """(update, train loss, valid loss, valid − train) at each validation with a train loss before it."""
    train = loss_points(data, "train_inner")
    out = []
    for u, v in loss_points(data, "valid"):
        before = [t for t in train if t[0] <= u]
        if before:
            out.append((u, before[-1][1], v, v - before[-1][1]))
    return out


def run_fill(data: RunData) -> float | None:
    """The run's median logged words an update over the tokens its batches may hold (train.plan.batch.fill):
    max_tokens and update_freq as the run record has them (derived by fab train), ranks of its hosts."""
    wpb = [w for r in data.log.of("train_inner") if (w := r.get("wpb"))]
    run = data.run
    max_tokens = run.get("max_tokens") or data.options.get("max_tokens")
    ranks = len(run.get("hosts") or []) * int(run.get("ranks_per_host") or 1)
    return batch_model.fill(statistics.median(wpb) if wpb else None, max_tokens, run.get("update_freq") or 1, ranks)


def run_mfu(data: RunData, ivs: list[Interval], gpus: int) -> tuple[str | None, float | None]:
    """The GPU's name (run.json's, from the probe; else the monitor's samples) and the run's MFU at its
    median logged words/s (train.plan.mfu); None where the name or its peak is unknown."""
    name = data.run.get("gpu_name") or next((g.get("name") for samples in data.samples.values() for s in samples
                                            for g in s.get("gpus") or [] if g.get("name")), None)
    wps = [iv.wps for iv in ivs if iv.wps]
    vocab = (data.corpus or {}).get("vocab_size") or 32000
    if not wps or not data.options:
        return name, None
    return name, flops.of_run(data.options, int(vocab), statistics.median(wps), gpus, name)


def nic_usage(data: RunData, ivs: list[Interval]) -> dict[str, dict]:
    """Per host: mean and peak NIC Mbit/s while training (all samples when none overlaps the log)."""
    per_host = {}
    for host, samples in data.samples.items():
        training = during(samples, ivs)
        values = [nic_mbps(s) for s in training or samples]
        if values:
            per_host[host] = {"mean_mbps": sum(values) / len(values), "peak_mbps": max(values),
                              "samples": len(values), "while_training": bool(training)}
    return per_host


def step_against_nic(samples: list[dict], ivs: list[Interval]) -> tuple[list[float], list[float]]:
    """Step time and the host's mean NIC throughput, interval by interval (those with samples)."""
    xs, ys = [], []
    for iv in ivs:
        inside = [nic_mbps(s) for s in samples if iv.start <= s["t"] <= iv.end]
        if inside:
            xs.append(iv.step_s)
            ys.append(sum(inside) / len(inside))
    return xs, ys


def lr_at(update: float, opts: dict) -> float | None:
    """fairseq's inverse_sqrt learning rate after `update` updates (None for other schedulers)."""
    if opts.get("lr_scheduler") != "inverse_sqrt" or opts.get("lr") is None:
        return None
    lr, warmup = float(opts["lr"]), int(opts.get("warmup_updates") or 0)
    init = float(opts.get("warmup_init_lr") if opts.get("warmup_init_lr") is not None else (0 if warmup else lr))
    if warmup and update < warmup:
        return init + update * (lr - init) / warmup
    return lr * math.sqrt(warmup / update) if warmup and update > 0 else lr
