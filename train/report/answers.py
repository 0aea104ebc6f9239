"""The training report's answers: a loaded run (train.report.run_data) and its series (train.report.series)
in, the users' questions answered out, each an `Answer` with a one-line verdict and the numbers
behind it (no plotting, no reading of files but cost.json and offsite.json).

`analyze(data, link_mbps)` answers them all. The average step time is the plain mean of the logged
intervals' step times (1 / `ups`) over every `train_inner` line of rank 0's log (all restarts included);
the other definitions are train.report.series's. A run comes in through `load(run_dir)` (the collected
files) or `from_texts(...)` (what `fab watch` reads live), train.report.run_data's, named here too.
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass, field

from train.plan import mfu as flops
from train.recipe.logformat import format_eta, progress
from train.report.run_data import RunData, read_json
from train.report.run_data import from_texts as from_texts  # the way in, with load: a run, then analyze(...)
from train.report.run_data import load as load
from train.report.series import (
    Interval,
    during,
    gaps,
    intervals,
    last_part,
    link,
    loss_points,
    lr_at,
    mean,
    nic_usage,
    pearson,
    run_fill,
    run_mfu,
    slope,
    step_against_nic,
)

# The link busy more than half the training time: the network takes most of each step, the same
# definition `fab predict` uses (train.plan.model.Prediction.network_bound).
NETWORK_BOUND_SHARE = 0.50
GPU_FULL_PERCENT = 90.0  # mean utilization at or above this: fully used
# MFU below this with NVML busy: the kernels wait (an all-reduce on a slow link counts as busy to NVML).
# fairseq's Transformers on one H100 at their best measured batch: base 11%, big 21% (benchmarks/README.md);
# the field report's run, 15x slower behind a 100 Mb/s port, would be near 1%.
MFU_LOW = 0.10
PLATEAU_FRACTION = 0.01  # a loss change smaller than 1 % over the last part: not improving


@dataclass
class Answer:
    key: str
    question: str
    answer: str  # the verdict, one or two sentences, with its numbers
    numbers: dict = field(default_factory=dict)
    verdict: str | None = None  # a short machine-readable verdict where there is one


def _mb(n: float) -> str:
    return f"{n / 1e6:,.1f} MB"


def _lr(x: float | None) -> str:
    return "?" if x is None else f"{x:.3g}"


def answer_duration(data: RunData) -> Answer:
    log, opts = data.log, data.options
    now = progress(log, opts.get("max_update") or log.max_update)
    update, max_update, recent, eta = now.update, now.max_update, now.seconds_per_update, now.eta_seconds
    elapsed = (max(data.log_times) - min(data.log_times)) if data.log_times else None
    # time fairseq was running: each start to the last line before the next start
    running = None
    if data.log_times and data.starts:
        bounds = sorted(data.starts) + [math.inf]
        running = 0.0
        for a, b in zip(bounds, bounds[1:], strict=False):
            inside = [t for t in data.log_times if a <= t < b]
            running += max(inside) - a if inside else 0.0
    numbers = {"elapsed_s": elapsed, "running_s": running, "restarts": max(len(data.starts) - 1, 0),
               "update": update, "max_update": max_update, "recent_s_per_update": recent,
               "eta_s": eta, "finished": log.finished}
    if elapsed is None:
        text = f"no log collected from {data.rank0 or 'rank 0'}"
    else:
        who = "'s then ".join(data.rank0_logs) if len(data.rank0_logs) > 1 else data.rank0
        text = f"{format_eta(elapsed)} from the first to the last line of {who}'s log"
    if running is not None and numbers["restarts"]:
        text += f" ({format_eta(running)} running, {numbers['restarts']} restart(s))"
    text += f"; {update} of {max_update or '?'} updates"
    verdict = "finished" if log.finished else ("reached" if max_update and update >= int(max_update) else
                                               "not finished")
    if max_update and update >= int(max_update):
        text += " — max_update reached."
    elif eta is not None:
        text += (f"; {format_eta(eta)} more to max_update at the recent {recent:.3f} s/update "
                 f"(last ≤10 logged intervals){' — the run stopped early' if not log.finished else ''}.")
    else:
        text += "; no step time logged, no ETA."
    if log.finished and max_update and update < int(max_update):
        text += " (fairseq finished before max_update.)"
    return Answer("duration", "How long did the run take, and how long to max_update?", text, numbers, verdict)


def answer_step_time(data: RunData, ivs: list[Interval]) -> Answer:
    steps = [iv.step_s for iv in ivs]
    avg = mean(steps)
    numbers = {"mean_s_per_update": avg, "intervals": len(steps),
               "min_s": min(steps) if steps else None, "max_s": max(steps) if steps else None,
               "median_s": statistics.median(steps) if steps else None}
    if avg is None:
        return Answer("step_time", "What is the average step time?", "no train_inner lines logged.", numbers)
    wps = [iv.wps for iv in ivs if iv.wps]
    numbers.update(median_wps=statistics.median(wps) if wps else None, fill=run_fill(data))
    text = (f"{avg:.3f} s/update: the mean of 1/ups over the {len(steps)} logged intervals "
            f"(min {numbers['min_s']:.3f}, median {numbers['median_s']:.3f}, max {numbers['max_s']:.3f}); "
            f"each interval's wall time over its updates, validation and saves inside it included.")
    if numbers["median_wps"]:
        text += f" Median {numbers['median_wps']:,.0f} words/s"
        text += (f" at fill {numbers['fill']:.2f} (target words an update over max_tokens x update-freq x "
                 f"ranks: words/s compare at the same fill)." if numbers["fill"] is not None else ".")
    return Answer("step_time", "What is the average step time?", text, numbers)


def answer_improving(data: RunData) -> Answer:
    valid = loss_points(data, "valid")
    q = "Is the model still improving?"
    if len(valid) < 2:
        return Answer("improving", q, f"cannot tell: {len(valid)} validation point(s).", {"points": len(valid)},
                      "unknown")
    part = last_part(valid)
    s = slope([p[0] for p in part], [p[1] for p in part])
    span = part[-1][0] - part[0][0]
    change = (s or 0) * span
    level = abs(mean([p[1] for p in part]) or 1.0)
    if s is None:
        verdict = "unknown"
    elif change <= -PLATEAU_FRACTION * level:
        verdict = "improving"
    elif change >= PLATEAU_FRACTION * level:
        verdict = "worse"
    else:
        verdict = "plateau"
    per_k = (s or 0) * 1000
    words = {"improving": "yes", "worse": "no — the validation loss is rising",
             "plateau": "barely — the validation loss is flat", "unknown": "cannot tell"}[verdict]
    text = (f"{words}: validation loss slope {per_k:+.3f} per 1000 updates over updates "
            f"{part[0][0]}–{part[-1][0]} ({len(part)} points; {change:+.3f} in that span), "
            f"last {part[-1][1]:.3f}, best {min(p[1] for p in valid):.3f}.")
    return Answer("improving", q, text, {"slope_per_1000": per_k, "from_update": part[0][0],
                                         "to_update": part[-1][0], "points": len(part), "last_valid_loss": part[-1][1],
                                         "best_valid_loss": min(p[1] for p in valid)}, verdict)


def answer_overfit(data: RunData) -> Answer:
    q = "Does it overfit?"
    g = gaps(data)
    if len(g) < 2:
        return Answer("overfit", q, f"cannot tell: {len(g)} validation point(s) with a train loss.",
                      {"points": len(g)}, "unknown")
    part = last_part([(u, gap) for u, _, _, gap in g])
    s = slope([p[0] for p in part], [p[1] for p in part]) or 0.0
    last = g[-1]
    tv = [(u, t, v) for u, t, v, _ in g if u >= part[0][0]]
    valid_s = slope([x[0] for x in tv], [x[2] for x in tv]) or 0.0
    train_s = slope([x[0] for x in tv], [x[1] for x in tv]) or 0.0
    if valid_s > 0 and train_s < 0:
        verdict, words = "overfitting", "yes: the validation loss rises while the train loss falls"
    elif last[3] > 0 and s > 0 and s * (part[-1][0] - part[0][0]) > PLATEAU_FRACTION * abs(last[2]):
        verdict, words = "widening", "not yet, but the gap is widening"
    else:
        verdict, words = "no", "no"
    text = (f"{words}: valid − train loss = {last[3]:+.3f} at update {last[0]} (train {last[1]:.3f}, "
            f"valid {last[2]:.3f}); gap trend {s * 1000:+.3f} per 1000 updates over updates "
            f"{part[0][0]}–{part[-1][0]}. (Train loss is with dropout, so a small negative gap is normal.)")
    return Answer("overfit", q, text, {"gap": last[3], "gap_slope_per_1000": s * 1000, "update": last[0],
                                       "train_loss": last[1], "valid_loss": last[2]}, verdict)


def answer_gpus(data: RunData, ivs: list[Interval]) -> Answer:
    q = "Were the GPUs fully used?"
    if not data.samples:
        return Answer("gpus", q, "not measured: no samples collected.", {}, "unknown")
    per_gpu: dict[str, list[float]] = {}
    absent: list[str] = []
    mem: dict[str, float] = {}
    for host, samples in data.samples.items():
        training = during(samples, ivs) or samples
        with_gpus = [s for s in training if s.get("gpus")]
        if not with_gpus:
            absent.append(host)
            continue
        for s in with_gpus:
            for gpu in s["gpus"]:
                key = f"{host}:{gpu.get('index', 0)}"
                if gpu.get("util_percent") is not None:
                    per_gpu.setdefault(key, []).append(float(gpu["util_percent"]))
                if gpu.get("mem_used_mb") is not None:
                    mem[key] = max(mem.get(key, 0.0), float(gpu["mem_used_mb"]))
    means = {k: sum(v) / len(v) for k, v in per_gpu.items() if v}
    if not means:
        text = (f"no GPUs: {', '.join(absent)} reported no GPU (NVML absent); utilization not measured "
                f"(absent, not 0 %).")
        return Answer("gpus", q, text, {"absent_hosts": absent}, "absent")
    overall = sum(means.values()) / len(means)
    low = [k for k, m in means.items() if m < GPU_FULL_PERCENT]
    name, used = run_mfu(data, ivs, len(means))
    waiting = not low and used is not None and used < MFU_LOW
    verdict = "waiting" if waiting else "full" if not low and (used is None or used >= MFU_LOW) else "underused"
    each = ", ".join(f"{k} {m:.0f} %" for k, m in sorted(means.items()))
    mfu_said = (f"MFU {used:.1%} of {len(means)} × {name}'s {flops.peak_tflops(name):g} TFLOP/s dense fp16/bf16"
                if used is not None else f"MFU: peak unknown ({name or 'GPU not named'})")
    if waiting:
        text = (f"no: NVML says busy ({overall:.0f} % mean, {each}) but MFU is {used:.1%} (low means < "
                f"{MFU_LOW:.0%}): the kernels wait, most likely on the network (NVML counts a kernel waiting "
                f"in an all-reduce as busy); {mfu_said}.")
    else:
        text = (f"{'yes' if verdict == 'full' else 'no'}: mean utilization while training {overall:.0f} % "
                f"({each}; full means ≥ {GPU_FULL_PERCENT:.0f} % and MFU ≥ {MFU_LOW:.0%}); {mfu_said}.")
    if absent:
        text += f" No GPU on {', '.join(absent)} (absent, not 0 %)."
    return Answer("gpus", q, text, {"mean_util_percent": overall, "per_gpu": means, "peak_mem_mb": mem,
                                    "absent_hosts": absent, "mfu": used, "gpu_name": name}, verdict)


def answer_network(data: RunData, ivs: list[Interval], expected_mbps: float | None) -> Answer:
    q = "Was the network the bottleneck?"
    rate, source = link(data, expected_mbps)
    if not data.samples:
        return Answer("network", q, "not measured: no samples collected.", {"link_mbps": rate}, "unknown")
    per_host = nic_usage(data, ivs)
    if not per_host:
        return Answer("network", q, "not measured: the sample files are empty.", {"link_mbps": rate}, "unknown")
    busiest = max(per_host, key=lambda h: per_host[h]["mean_mbps"])
    b = per_host[busiest]
    xs, ys = step_against_nic(data.samples[busiest], ivs)
    r = pearson(xs, ys)
    numbers = {"link_mbps": rate, "link_source": source, "busiest_host": busiest, "per_host": per_host,
               "mean_mbps": b["mean_mbps"], "peak_mbps": b["peak_mbps"], "correlation": r,
               "correlated_intervals": len(xs), "threshold_share": NETWORK_BOUND_SHARE}
    corr = f"correlation of step time with NIC throughput r = {r:+.2f} over {len(xs)} intervals" if r is not None \
        else f"correlation of step time with NIC throughput: n/a ({len(xs)} intervals with samples)"
    when = "while training" if b["while_training"] else "over all samples (no overlap with the logged intervals)"
    if rate is None:
        text = (f"cannot tell without a link rate: {busiest} averaged {b['mean_mbps']:.1f} Mbit/s "
                f"(peak {b['peak_mbps']:.1f}) {when}; {corr}. Run `fab bench-net` for a measured link.")
        return Answer("network", q, text, numbers, "unknown")
    share, peak = b["mean_mbps"] / rate, b["peak_mbps"] / rate
    numbers.update(mean_share=share, peak_share=peak)
    if share >= NETWORK_BOUND_SHARE:
        verdict, words = "network-bound", "yes, network-bound"
    elif peak >= NETWORK_BOUND_SHARE:
        verdict, words = "bursts", "partly: the link saturates in bursts, not on average"
    else:
        verdict, words = "not", "no"
    text = (f"{words}: {busiest}'s NIC averaged {b['mean_mbps']:.1f} Mbit/s = {share:.0%} of the "
            f"{rate:g} Mbit/s link (peak {b['peak_mbps']:.1f} = {peak:.0%}) {when}; {corr}. "
            f"Link: {source}; network-bound means the link busy ≥ {NETWORK_BOUND_SHARE:.0%} of the time on average.")
    return Answer("network", q, text, numbers, verdict)


_NETWORK_WORDS = {"network-bound": "network-bound", "bursts": "network-bound in bursts", "not": "not network-bound",
                  "unknown": "network: cannot tell"}


def verdict_line(network: Answer, gpus: Answer) -> str:
    """The network and GPU answers in one line, as `fab watch` shows them:
    "network-bound: NIC at 92% of the 1000 Mbit/s link while GPUs idle 40%"."""
    n, words = network.numbers, _NETWORK_WORDS.get(network.verdict or "unknown", "network: cannot tell")
    if n.get("mean_share") is not None:
        nic = f"NIC at {n['mean_share']:.0%} of the {n['link_mbps']:g} Mbit/s link"
    elif n.get("mean_mbps") is not None:
        nic = f"NIC at {n['mean_mbps']:.1f} Mbit/s, link rate unknown"
    else:
        nic = "no NIC samples"
    util = gpus.numbers.get("mean_util_percent")
    if util is not None:
        gpu = f"GPUs idle {100 - util:.0f}%" if gpus.verdict == "underused" else f"GPUs busy {util:.0f}%"
        used = gpus.numbers.get("mfu")
        if used is not None:
            gpu += f" · MFU {used:.0%}" + (" (waiting)" if gpus.verdict == "waiting" else "")
        elif "mfu" in gpus.numbers:  # the GPU named where known: an unknown one is said, never guessed
            name = gpus.numbers.get("gpu_name")
            gpu += f" · MFU: peak unknown ({name})" if name else " · MFU: peak unknown"
    else:
        gpu = "no GPU (absent, not 0%)" if gpus.verdict == "absent" else "GPUs not measured"
    joint = "while" if network.verdict == "network-bound" and util is not None else "·"
    return f"{words}: {nic} {joint} {gpu}"


def answer_lr(data: RunData) -> Answer:
    q = "What does the learning-rate schedule do?"
    o = data.options
    inner = [r for r in data.log.of("train_inner") if r.get("lr") is not None and r.update is not None]
    now = inner[-1] if inner else None
    sched = o.get("lr_scheduler")
    numbers = {"scheduler": sched, "lr": o.get("lr"), "warmup_updates": o.get("warmup_updates"),
               "warmup_init_lr": o.get("warmup_init_lr"), "lr_now": now.get("lr") if now else None,
               "update_now": now.update if now else None}
    if sched != "inverse_sqrt":
        text = (f"scheduler {sched or 'unknown (no resolved preset)'}, lr {o.get('lr', '?')}; "
                f"lr now {_lr(numbers['lr_now'])}.")
        return Answer("lr", q, text, numbers)
    w, peak = int(o.get("warmup_updates") or 0), float(o["lr"])
    max_update = o.get("max_update") or data.log.max_update
    numbers.update(peak_lr=peak, peak_update=w, predicted_now=lr_at(now.update, o) if now else None,
                   lr_at_max_update=lr_at(int(max_update), o) if max_update else None, max_update=max_update)
    text = (f"inverse_sqrt: rises linearly from {_lr(o.get('warmup_init_lr'))} to the peak {_lr(peak)} over the "
            f"first {w} updates, then decays ∝ 1/√update (lr = {_lr(peak)}·√({w}/update)).")
    if now:
        text += (f" Now (update {now.update}): {_lr(now.get('lr'))} logged, {_lr(numbers['predicted_now'])} "
                 f"by the formula.")
    if max_update:
        text += f" At max_update {max_update}: {_lr(numbers['lr_at_max_update'])}."
    return Answer("lr", q, text, numbers)


def answer_corpus(data: RunData) -> Answer:
    q = "How big is the training set?"
    c = data.corpus or {}
    dataset = data.run.get("dataset", "?")
    if not c:
        return Answer("corpus", q, f"unknown: no corpus.json collected for dataset {dataset}.", {"dataset": dataset})
    mb, lines, vocab = c.get("train_mb"), c.get("train_lines"), c.get("vocab_size")
    text = (f"{dataset}: {mb:,.1f} MB" if isinstance(mb, int | float) else f"{dataset}: ? MB")
    text += f", {lines:,} lines (sentence pairs)" if isinstance(lines, int) else ", ? lines"
    if isinstance(vocab, int):
        text += f", vocabulary {vocab:,}"
    return Answer("corpus", q, text + ".", {"dataset": dataset, "train_mb": mb, "train_lines": lines,
                                            "vocab_size": vocab})


def answer_checkpoints(data: RunData) -> Answer:
    q = "What is a checkpoint made of, and how big is it?"
    ck = data.checkpoints
    expected = data.params * 4 * 3 if data.params else None
    if not ck:
        text = "unknown: no checkpoints.txt collected" if ck is None else "no checkpoint saved yet"
        if expected:
            text += f" (expected ≈ {_mb(expected)}: {data.params:,} params × 4 B × 3)"
        return Answer("checkpoints", q, text + ".", {"expected_bytes": expected, "files": []})
    one = next((c for c in ck if c.name == "checkpoint_last.pt"), max(ck, key=lambda c: c.size))
    total = sum(c.size for c in ck)
    kinds = {
        "checkpoint_last.pt": "the latest (resume from it)",
        "checkpoint_best.pt": "the best by validation loss",
    }
    best = [c.name for c in ck if c.name.startswith("checkpoint.best_")]
    interval = [c.name for c in ck if re.fullmatch(r"checkpoint_\d+_\d+\.pt", c.name)]
    text = (f"one .pt file per checkpoint (model weights + Adam's two moments + trainer state): "
            f"{one.name} is {_mb(one.size)}")
    if expected:
        text += f" (≈ {data.params:,} params × 4 B × 3 = {_mb(expected)})"
    text += (f". The directory holds {len(ck)} files, {_mb(total)}: last and best, {len(best)} kept best-k "
             f"(checkpoint.best_loss_*), {len(interval)} by update interval (checkpoint_E_U.pt).")
    return Answer("checkpoints", q, text, {"checkpoint_bytes": one.size, "total_bytes": total, "files": len(ck),
                                           "expected_bytes": expected, "params": data.params,
                                           "kinds": {k: v for k, v in kinds.items() if any(c.name == k for c in ck)}})


def answer_members(data: RunData) -> Answer | None:
    """Which hosts trained from which update to which (Run.members, train.report.members); None
    for a run that never changed its hosts."""
    from train.report import members

    history = data.run.get("members")
    update = progress(data.log, data.options.get("max_update") or data.log.max_update).update
    text = members.describe(history, update or None)
    if text is None:
        return None
    found = members.changes(history)
    spans = [{"hosts": s.hosts, "from_update": s.first, "to_update": s.last, "why": s.why, "ended": s.ended}
             for s in members.spans(history, update or None)]
    return Answer("members", "Which hosts trained, from which update to which?", text + ".",
                  {"spans": spans, "changes": [c.label for c in found], "redone_updates": members.redone(history)},
                  "changed")


def answer_bleu(data: RunData) -> Answer | None:
    if not data.bleu or not isinstance(data.bleu.get("score"), int | float):
        return None
    b = data.bleu
    text = f"SacreBLEU {b['score']:.2f} on the test set ({b.get('verbose_score', '')}; {b.get('signature', '')})."
    return Answer("bleu", "What BLEU did it reach?", text, {"bleu": b["score"]})


@dataclass
class Analysis:
    data: RunData
    intervals: list[Interval]
    answers: list[Answer]

    def get(self, key: str) -> Answer | None:
        return next((a for a in self.answers if a.key == key), None)

    def to_json(self) -> dict:
        return {"run": self.data.run, "answers": [
            {"key": a.key, "question": a.question, "answer": a.answer, "verdict": a.verdict, "numbers": a.numbers}
            for a in self.answers]}


def answer_cost(data: RunData) -> Answer | None:
    """What the run has cost and what the idle cluster costs, from cost.json (train.run.idle, written
    by `fab report` with the inventory's prices); None when it was not collected."""
    figures = read_json(data.run_dir / "cost.json")
    if figures is None:
        return None
    q = "What has the run cost so far, and what does the cluster cost now?"
    hours, usd = figures.get("billed_hours") or 0.0, figures.get("run_usd")
    n = len(figures.get("hosts", []))
    if usd is not None:
        text = f"${usd:,.2f}: {n} host(s) × {hours:.2f} h since the run started (restarts and gaps included)."
    else:
        text = (f"unknown: no hourly_usd in the inventory for {', '.join(figures.get('unpriced', []))} "
                f"({hours:.2f} h since the run started).")
    idle = figures.get("idle_s")
    if idle is not None:
        rate = figures.get("usd_per_hour")
        text += (f" The cluster has been idle {format_eta(idle)} since the last log line, at "
                 + (f"${rate:,.2f}/h" if rate is not None else "an unknown price")
                 + f"; tandem stops no VM: stop them at the provider ({figures.get('stop_hint')}).")
    return Answer("cost", q, text, figures, "idle" if idle is not None else "running")


def answer_offsite(data: RunData) -> Answer | None:
    """The newest copy off the cluster (--checkpoints-to), from offsite.json (train.run.offsite.summary,
    written by `fab report` from the hosts' keepers); None for a run that copies nothing off the cluster."""
    copies = read_json(data.run_dir / "offsite.json")
    if copies is None:
        return None
    newest = copies.get("newest")
    if newest:
        text = (f"update {newest['update']:,}, copied {format_eta(newest['age_s'])} before this report, at "
                f"{newest['where']} (`fab train --resume-from {copies.get('target') or newest['where']}` goes on "
                f"from it on other VMs).")
    else:
        text = f"none yet: rank 0's host uploads to {copies.get('target')} (checkpoint_last at its interval)."
    for host, update in (copies.get("uploading") or {}).items():
        text += f" {host} was uploading update {update:,}."
    for host, error in (copies.get("errors") or {}).items():
        text += f" {host}'s last upload failed: {error}."
    return Answer("offsite", "Where is the newest checkpoint copy off the cluster?", text, copies,
                  "copied" if newest else "no copy")


def analyze(data: RunData, link_mbps: float | None = None) -> Analysis:
    """Every answer for a loaded run; `link_mbps` is the inventory's expected link (a measured
    bench-net link wins over it)."""
    ivs = intervals(data)
    answers = [answer_duration(data), answer_step_time(data, ivs), answer_improving(data), answer_overfit(data)]
    if hosts := answer_members(data):
        answers.insert(1, hosts)
    if bleu := answer_bleu(data):
        answers.append(bleu)
    if cost := answer_cost(data):
        answers.append(cost)
    if offsite := answer_offsite(data):
        answers.append(offsite)
    answers += [answer_gpus(data, ivs), answer_network(data, ivs, link_mbps), answer_lr(data),
                answer_corpus(data), answer_checkpoints(data)]
    return Analysis(data, ivs, answers)
