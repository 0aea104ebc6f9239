"""The training report's figures (matplotlib, Agg): one PNG per question, from `train.report.answers`.

Every function takes an `Analysis` and a path, writes the PNG and returns its title: `figure` draws
the skeleton they share (the figure, its title, axis labels and grid, the PNG saved, the figure
closed), each function only what is on its axes. A figure with nothing to show still gets drawn, with
a sentence saying why (e.g. no GPUs on the hosts), so the report's layout never depends on what was
measured.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from train.report import members  # noqa: E402
from train.report.answers import Analysis  # noqa: E402
from train.report.series import loss_points, lr_at, nic_mbps  # noqa: E402

SIZE = (7.0, 3.6)
DPI = 100
TRAIN, VALID, NET, STEP = "#1f77b4", "#d62728", "#2ca02c", "#9467bd"
CHANGE = "#ff7f0e"  # a change of the run's hosts (train.report.members)


def empty_panel(ax, message: str) -> None:
    ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes, fontsize=12, color="#555555",
            wrap=True, bbox={"boxstyle": "round", "facecolor": "#f3f3f3", "edgecolor": "#cccccc"})
    ax.set_xticks([])
    ax.set_yticks([])


def figure(title: str, xlabel: str, ylabel: str):
    """A plot function from what draws on its axes: `draw(an, ax)` returns None, or the sentence an
    empty panel says when there is nothing to show. The plot function `(an, path) -> title` makes the
    figure (its title, axis labels, grid), draws, saves the PNG and closes the figure."""
    def plot_of(draw: Callable[..., str | None]) -> Callable[[Analysis, Path], str]:
        @functools.wraps(draw)
        def plot(an: Analysis, path: Path) -> str:
            fig, ax = plt.subplots(figsize=SIZE, dpi=DPI)
            try:
                ax.set_title(title, fontsize=11)
                ax.set_xlabel(xlabel)
                ax.set_ylabel(ylabel)
                ax.grid(True, alpha=0.3)
                if (nothing := draw(an, ax)) is not None:
                    empty_panel(ax, nothing)
                fig.tight_layout()
                fig.savefig(path, dpi=DPI, bbox_inches="tight")
            finally:
                plt.close(fig)
            return title
        return plot
    return plot_of


def _t0(an: Analysis) -> float:
    """Time zero of the time axes: the first line of rank 0's log, else the first sample."""
    d = an.data
    if d.log_times:
        return min(d.log_times) + d.time_shift_s
    times = [s["t"] for ss in d.samples.values() for s in ss]
    return min(times) if times else 0.0


def segments(points: list[tuple[float, float]]) -> list[list[tuple[float, float]]]:
    """Points split where the update goes back (a resume redoing updates after a stop or a lost host),
    so that a line is not drawn back across the redone updates."""
    out: list[list[tuple[float, float]]] = []
    for p in points:
        if not out or p[0] <= out[-1][-1][0]:
            out.append([])
        out[-1].append(p)
    return out


def _plot_segments(ax, points, fmt: str, **kw) -> None:
    for i, seg in enumerate(segments(points)):
        ax.plot(*zip(*seg, strict=True), fmt, **(kw if i == 0 else {**kw, "label": None}))


def mark_changes(ax, an: Analysis, t0: float | None = None) -> list[tuple[float, str]]:
    """The run's membership changes (Run.members) as labelled vertical lines: on an update axis
    (t0 None) at the update the run had reached, with the updates trained again (from the
    checkpoint it went on from) shaded; on a time axis (minutes since t0) when that update was
    reached. Returns what was drawn: [(x, label)]."""
    drawn = []
    for change in members.changes(an.data.run.get("members")):
        if t0 is None:
            x: float | None = change.update
            if change.resumed < change.update:
                ax.axvspan(change.resumed, change.update, color=CHANGE, alpha=0.12, lw=0)
        else:
            when = members.time_of_change(change, an.intervals)
            x = (when - t0) / 60 if when is not None else None
        if x is None:
            continue
        ax.axvline(x, color=CHANGE, ls="-.", lw=1.3)
        ax.annotate(change.label, xy=(x, 0.98), xycoords=("data", "axes fraction"), rotation=90, ha="right",
                    va="top", fontsize=8, color=CHANGE, xytext=(-2, 0), textcoords="offset points")
        drawn.append((x, change.label))
    return drawn


@figure("Train and validation loss", "update", "loss (label-smoothed CE, base 2)")
def loss(an: Analysis, ax) -> str | None:
    train, valid = loss_points(an.data, "train_inner"), loss_points(an.data, "valid")
    if train:
        _plot_segments(ax, train, "-", color=TRAIN, label="train (per log interval)")
    if valid:
        ax.plot(*zip(*valid, strict=True), "o-", color=VALID, label="validation")
    if train or valid:
        mark_changes(ax, an)
        ax.legend()
    else:
        return "no loss logged yet"


@figure("BLEU on the test set", "", "SacreBLEU")
def bleu(an: Analysis, ax) -> str | None:
    b = an.data.bleu or {}
    if isinstance(b.get("score"), int | float):
        score = float(b["score"])
        ax.bar(["checkpoint evaluated"], [score], color=TRAIN, width=0.4)
        ax.set_ylim(0, max(100.0 if score > 40 else 40.0, score * 1.2))
        ax.annotate(f"{score:.2f}", (0, score), ha="center", va="bottom", xytext=(0, 4), textcoords="offset points",
                    fontsize=12)
    else:
        return "not evaluated (no bleu.json): run `fab evaluate`"


@figure("Learning rate", "update", "learning rate")
def learning_rate(an: Analysis, ax) -> str | None:
    opts = an.data.options
    points = [(iv.update, iv.lr) for iv in an.intervals if iv.lr is not None]
    last = max([p[0] for p in points], default=0)
    warmup = int(opts.get("warmup_updates") or 0)
    end = max(last, 2 * warmup, 10)
    if lr_at(1, opts) is not None:
        xs = [end * i / 400 for i in range(1, 401)]
        ax.plot(xs, [lr_at(x, opts) for x in xs], "--", color="#888888",
                label=f"schedule from the config (inverse_sqrt, warmup {warmup})")
        if warmup:
            ax.axvline(warmup, color="#bbbbbb", lw=1)
    if points:
        ax.plot(*zip(*points, strict=True), "o", color=TRAIN, ms=4, label="logged")
    if points or lr_at(1, opts) is not None:
        ax.legend()
    else:
        return "no learning rate logged"


@figure("Seconds per update", "update", "s / update (1 / ups per log interval)")
def step_time(an: Analysis, ax) -> str | None:
    ivs = an.intervals
    if ivs:
        _plot_segments(ax, [(iv.update, iv.step_s) for iv in ivs], "o-", color=STEP, ms=3)
        avg = sum(iv.step_s for iv in ivs) / len(ivs)
        ax.axhline(avg, color="#444444", ls="--", lw=1, label=f"mean {avg:.3f} s")
        ax.set_ylim(bottom=0)
        mark_changes(ax, an)
        ax.legend()
    else:
        return "no train_inner lines logged"


@figure("Words per second", "update", "target words / s (all ranks)")
def words_per_second(an: Analysis, ax) -> str | None:
    points = [(iv.update, iv.wps) for iv in an.intervals if iv.wps is not None]
    if points:
        _plot_segments(ax, points, "o-", color=TRAIN, ms=3)
        ax.set_ylim(bottom=0)
        mark_changes(ax, an)
    else:
        return "no words per second logged"


@figure("GPU utilization per GPU per host", "minutes since start", "utilization (%)")
def gpu_utilization(an: Analysis, ax) -> str | None:
    t0, drawn = _t0(an), False
    absent = []
    for host, samples in sorted(an.data.samples.items()):
        series: dict[int, list[tuple[float, float]]] = {}
        for s in samples:
            for g in s.get("gpus") or []:
                if g.get("util_percent") is not None:
                    series.setdefault(int(g.get("index", 0)), []).append(((s["t"] - t0) / 60, g["util_percent"]))
        if not series:
            absent.append(host)
        for index, pts in sorted(series.items()):
            ax.plot(*zip(*pts, strict=True), "-", label=f"{host} GPU {index}")
            drawn = True
    if drawn:
        ax.set_ylim(0, 105)
        ax.legend(fontsize=8)
        if absent:
            ax.text(0.01, 0.02, f"no GPU on {', '.join(absent)}", transform=ax.transAxes, fontsize=9)
    elif an.data.samples:
        return f"no GPUs on these hosts ({', '.join(absent)}):\nNVML absent, utilization not measured"
    else:
        return "no samples collected"


def mark_link(ax, rate: float | None, peak: float, color: str) -> None:
    """The link's speed on a throughput axis that stays scaled to the traffic: a labelled line when
    it fits (within 3x the peak), else a note that says it and the peak's share of it (a 36 Mbit/s
    run on a 6.6 Gbit/s link would be a flat line at zero under the link's line)."""
    top = max(peak, 1e-9) * 1.15
    if rate and rate <= 3 * max(peak, 1e-9):
        ax.axhline(rate, color=color, ls="--", lw=1, alpha=0.7, label=f"link {rate:g} Mbit/s")
        top = max(top, rate * 1.1)
    elif rate:
        ax.annotate(f"link {rate:g} Mbit/s, above the plot: the traffic peaked at {peak:.3g} Mbit/s "
                    f"({peak / rate:.1%} of it)", xy=(0.99, 0.97), xycoords="axes fraction", ha="right", va="top",
                    fontsize=8, color="#444444")
    ax.set_ylim(0, top)


@figure("NIC throughput per host", "minutes since start", "Mbit/s")
def nic_throughput(an: Analysis, ax) -> str | None:
    t0 = _t0(an)
    peak = 0.0
    for host, samples in sorted(an.data.samples.items()):
        if not samples:
            continue
        ts = [(s["t"] - t0) / 60 for s in samples]
        tx = [float(s.get("tx_Bps") or 0) * 8 / 1e6 for s in samples]
        rx = [float(s.get("rx_Bps") or 0) * 8 / 1e6 for s in samples]
        line = ax.plot(ts, tx, "-", label=f"{host} tx")[0]
        ax.plot(ts, rx, ":", color=line.get_color(), label=f"{host} rx")
        peak = max([peak, *tx, *rx])
    net = an.get("network")
    rate = net.numbers.get("link_mbps") if net else None
    if any(an.data.samples.values()):
        mark_link(ax, rate, peak, "#444444")
        ax.legend(fontsize=8)
    else:
        return "no samples collected"


@figure("Step time and NIC throughput over time", "minutes since start", "s / update")
def timeline(an: Analysis, ax) -> str | None:
    t0 = _t0(an)
    ivs = an.intervals
    net = an.get("network")
    busiest = net.numbers.get("busiest_host") if net else None
    if ivs:
        # each interval as a horizontal segment over the time it covers
        for i, iv in enumerate(ivs):
            ax.hlines(iv.step_s, (iv.start - t0) / 60, (iv.end - t0) / 60, color=STEP, lw=2.5,
                      label="step time (per log interval)" if i == 0 else None)
        ax.set_ylim(bottom=0)
        mark_changes(ax, an, t0)
    ax.tick_params(axis="y", labelcolor=STEP)
    ax.yaxis.label.set_color(STEP)
    ax2 = ax.twinx()
    ax2.set_ylabel("Mbit/s", color=NET)
    ax2.tick_params(axis="y", labelcolor=NET)
    samples = an.data.samples.get(busiest or "", [])
    if samples:
        mbps = [nic_mbps(s) for s in samples]
        ax2.plot([(s["t"] - t0) / 60 for s in samples], mbps, "-", color=NET, lw=1,
                 label=f"{busiest} NIC (busier direction)")
        mark_link(ax2, net.numbers.get("link_mbps") if net else None, max(mbps), NET)
    if ivs or samples:
        handles = ax.get_legend_handles_labels()
        handles2 = ax2.get_legend_handles_labels()
        ax.legend(handles[0] + handles2[0], handles[1] + handles2[1], fontsize=8, loc="upper center",
                  bbox_to_anchor=(0.5, -0.2), ncol=3, frameon=False)
    else:
        return "no step times or samples"


# file name → (figure function, caption) in page order; bleu.png only when evaluated
FIGURES: dict[str, Callable[[Analysis, Path], str]] = {
    "loss.png": loss,
    "bleu.png": bleu,
    "lr.png": learning_rate,
    "step_time.png": step_time,
    "wps.png": words_per_second,
    "gpu.png": gpu_utilization,
    "nic.png": nic_throughput,
    "timeline.png": timeline,
}


def draw_all(an: Analysis, out_dir: Path) -> dict[str, str]:
    """Every figure into `out_dir`: {file name: title}. BLEU only when the run was evaluated."""
    out = {}
    for name, draw in FIGURES.items():
        if name == "bleu.png" and not an.get("bleu"):
            continue
        out[name] = draw(an, out_dir / name)
    return out
