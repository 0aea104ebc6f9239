"""`fab bench-step`: seconds per update against the link's bandwidth, measured and predicted.

1. For each rate (`10mbit`, `100mbit`, `1gbit`, ..., `none` = no cap) cap every host's
   cluster NIC (tc tbf on its egress, train.plan.link) and measure the ring's links with
   iperf3 (2 s, all links at once).
2. Start the configured model once on every host through train.run.launch (run `bench-<time>`,
   `log_interval=1`, no validation, no checkpoints; `reports/latest` is left alone), at the batch
   `fab train` would run on these GPUs (train.plan.batching.decide: max_tokens per rank from the
   probed GPU memory, update_freq from the preset's tokens per update; the record keeps both), and,
   while it trains, change the cap under it: `cycles` times through the rates, each for
   `skip` updates to settle and then `updates` measured ones. Interleaving the rates in one
   run means a change in the machine's load (other jobs, thermal, a noisy neighbour) hits
   every rate alike, and start-up is paid once.
3. Per rate: the median seconds per update (wpb / wps of each logged update), the median
   words per second, and the bytes each host's NIC sent per update
   (/sys/class/net/NIC/statistics/tx_bytes at the segment's first and last update).

Afterwards, and on any error, Ctrl-C (SIGINT), SIGTERM or SIGHUP, the job is stopped
(train.run.launch.stop) and every cap removed, then read back (`tc qdisc show`): the run prints
that no cap is left, or fails naming the host that kept one.

The model (train.plan.model.predict) gets the compute-only time C of one batch (max_tokens per
rank) from the uncapped rate: step(none) = K x C + comm(none) − what the overlap hides, at the
run's update_freq K. `fab predict` and `fab train` scale C per token to another max_tokens
(train.plan.measurements.compute_at). The overlap is 0
for fairseq's legacy_ddp (the CPU default: all-reduce after the backward pass); for pytorch_ddp
it is fitted to the capped rates (each capped rate is predicted from the others' fit). Without
a `none` rate, the fastest rate stands in for it. Every rate's prediction is then
C + 2(n−1)/n × S / B − hidden, with B the rate an all_reduce of exactly S reached under that cap
(iperf3's steady state is shown beside it; short transfers through a shaped link lose more to
TCP retransmission timeouts than a long stream): the table shows predicted
against measured, and the plot (reports/bench/step-<time>.png) the model's curve over
bandwidth with the measured points on it.

`--comm` takes several strategies, one job each (`auto`: what `fab train --comm auto` would
pick at each capped rate, auto_per_rate), and then compares them side by side (compare,
reports/bench/step-compare-<time>.png). `run` is what `fab bench-step` calls.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import signal
import statistics
import time
from datetime import UTC, datetime

from benchmarks.net import run_allreduce
from train.cluster import ClusterError, Host, connect, run_each, world_size
from train.hosts.remote import agent_command
from train.plan import batching, link, measurements, model, predict
from train.plan import mfu as flops
from train.plan.predict import dataset_vocab
from train.recipe import logformat, presets, strategies
from train.recipe.gpu_defaults import default_precision
from train.recipe.params import preset_params
from train.recipe.record import Run
from train.recipe.strategies import CommError, Strategy
from train.run import launch, preflight
from train.run.lease import HostLease

BENCH_OVERRIDES = ["log_interval=1", "disable_validation=true", "no_save=true"]


def steady_state(strategy: Strategy) -> list[str]:
    """A strategy measured as it runs after its synchronous start (local SGD's), from the first
    update: the start costs sync's step, which the sync rows measure."""
    return strategy.steady_state()


def parse_rates(text: str) -> list[str]:
    rates = [r.strip().lower() for r in text.split(",") if r.strip()]
    for r in rates:
        link.rate_bits(r)  # raises on a bad one
    if not rates:
        raise ValueError("no rates given (e.g. --rates 10mbit,100mbit,1gbit,none)")
    return rates


def tx_bytes(hosts: list[Host]) -> dict[str, int]:
    answers = run_each(hosts, {h.name: f"cat /sys/class/net/{shlex.quote(link.nic_of(h))}/statistics/tx_bytes"
                               for h in hosts})
    bad = list(answers.failed)
    if bad:
        raise ClusterError(f"could not read the NIC counters on {', '.join(bad)}")
    return {n: int(r.stdout.strip()) for n, r in answers.items()}


def comm_mbps(point: dict) -> float:
    """The rate the model uses: the gradient's own all_reduce under this cap when measured, else iperf3."""
    return point.get("allreduce_mbps") or point["link_mbps"]


def comm_s(point: dict, params: int, ranks: int, hosts: int, precision: str = "fp32", comm: str = "sync") -> float:
    """The all-reduce's seconds per update at this point's rate (0 on one host); local SGD's every
    H updates, averaged over them."""
    if hosts < 2:
        return 0.0
    strategy = strategies.parse(comm)
    size = strategy.payload_bytes(params, precision)
    return (model.allreduce_bytes_per_rank(size, ranks) / model.mbit_to_bytes_per_s(comm_mbps(point))
            / strategy.syncs_every)


def fastest(points: list[dict]) -> dict:
    """The point C comes from: the uncapped rate, else the fastest link."""
    return next((p for p in points if p["rate"] == "none"), None) or max(points, key=lambda p: p["link_mbps"] or 0)


def with_predictions(points: list[dict], params: int, ranks: int, hosts: int, backend: str = "legacy_ddp",
                     precision: str = "fp32", comm: str = "sync",
                     update_freq: int = 1) -> tuple[float, str | None, float]:
    """Adds predicted_s, error and network_share to every point; returns the compute-only C of one
    batch (an update is `update_freq` of them), the rate it came from (whose error is 0 by
    construction) and the overlap.

    legacy_ddp all-reduces after the backward pass: overlap 0. An overlapping backend
    (pytorch_ddp) hides part of the all-reduce behind the backward pass: its overlap is fitted to
    the capped rates, and each capped rate's prediction uses the overlap fitted to the *other*
    capped rates (leave one out), so that no point checks itself."""
    ok = [p for p in points if p.get("s_per_update") and p.get("link_mbps")]
    if not ok:
        return 0.0, None, 0.0
    source = fastest(ok)["rate"]
    measured = {p["rate"]: (comm_s(p, params, ranks, hosts, precision, comm), p["s_per_update"]) for p in ok}
    fast = measured[source]
    capped = [r for r in measured if r != source]
    fits = backend in model.OVERLAPPING_BACKENDS and hosts > 1 and strategies.parse(comm).overlaps

    def overlap_without(rate: str | None) -> float:
        others = [measured[r] for r in capped if r != rate]
        return model.fit_overlap(fast, others, update_freq) if fits else 0.0

    overlap = overlap_without(None)
    c = model.compute_given_overlap(fast[1], fast[0], overlap, update_freq)
    for p in ok:
        ov = overlap_without(p["rate"]) if p["rate"] != source and len(capped) > 1 else overlap
        c_p = model.compute_given_overlap(fast[1], fast[0], ov, update_freq)
        pred = model.predict(params, ranks, model.mbit_to_bytes_per_s(comm_mbps(p)), c_p, hosts=hosts,
                             overlap=ov, precision=precision, comm=comm, update_freq=update_freq)
        p["predicted_s"] = pred.step_s
        p["error"] = pred.step_s / p["s_per_update"] - 1
        p["overlap_used"] = ov
        # one capped rate alone: the overlap was fitted to it, so its error is no check
        p["fitted_on_itself"] = fits and p["rate"] != source and len(capped) == 1
        p["gives_compute"] = p["rate"] == source  # C is taken from it: its error is 0 by construction
        p["network_share"] = pred.comm_share
        p["model_tx_bytes"] = (model.allreduce_bytes_per_rank(pred.gradient_bytes, ranks)
                               / strategies.parse(comm).syncs_every)  # local SGD: one in H updates sends
    return c, source, overlap


def _error_cell(p: dict, f) -> str:
    if p.get("gives_compute"):
        return "(C)"
    return "(fit)" if p.get("fitted_on_itself") else f("error", "+.0%")


def table(points: list[dict]) -> str:
    head = (f"{'rate':>8} {'link(Mbit/s)':>12} {'allreduce(Mbit/s)':>17} {'s/update':>9} {'predicted':>9} "
            f"{'error':>6} {'wps':>8} {'tx/update(MB)':>13} {'model(MB)':>9} {'net share':>9} {'MFU':>6}")
    lines = [head]
    for p in points:
        def f(key, fmt, scale=1.0, p=p):
            v = p.get(key)
            return format(v * scale, fmt) if v is not None else "-"
        lines.append(f"{p['rate']:>8} {f('link_mbps', '.1f'):>12} {f('allreduce_mbps', '.1f'):>17} "
                     f"{f('s_per_update', '.3f'):>9} "
                     f"{f('predicted_s', '.3f'):>9} {_error_cell(p, f):>6} "
                     f"{f('wps', '.0f'):>8} "
                     f"{f('tx_per_update', '.2f', 1e-6):>13} {f('model_tx_bytes', '.2f', 1e-6):>9} "
                     f"{f('network_share', '.0%'):>9} {f('mfu', '.1%'):>6}")
    return "\n".join(lines)


def plot(report: dict, path) -> None:
    """Step time against bandwidth: measured points, the model's curve (log-log)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    pts = [p for p in report["points"] if p.get("s_per_update") and p.get("link_mbps")]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    if pts:
        rates = [p["link_mbps"] for p in pts]
        xs = np.logspace(np.log10(min(rates) / 2), np.log10(max(rates) * 2), 200)
        k = int(report.get("update_freq") or 1)
        curve = model.sweep(report["params"], report["ranks"], report["compute_s"], xs, hosts=report["n_hosts"],
                            update_freq=k)
        ax.plot(xs, [c.step_s for c in curve], label="model: K·C + 2(n−1)/n·S / B", color="tab:blue")
        ax.axhline(k * report["compute_s"], color="grey", ls=":",
                   label=f"compute only K·C = {k} × {report['compute_s']:.3f} s")
        ax.scatter(rates, [p["s_per_update"] for p in pts], color="tab:red", zorder=3, label="measured (median)")
        pred = [p for p in pts if p.get("predicted_s")]
        ax.scatter([p["link_mbps"] for p in pred], [p["predicted_s"] for p in pred], marker="x", color="black",
                   zorder=4, label="predicted with the gradient's all_reduce rate")
        for p in pts:
            ax.annotate(p["rate"], (p["link_mbps"], p["s_per_update"]), textcoords="offset points", xytext=(5, 5))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("link bandwidth, iperf3 (Mbit/s)")
    ax.set_ylabel("seconds per update")
    ax.set_title(f"{report['preset']} {report['params'] / 1e6:.2f}M params, {report['ranks']} ranks "
                 f"on {report['n_hosts']} hosts")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


class _Interrupted(KeyboardInterrupt):
    pass


@contextlib.contextmanager
def signals_raise():
    """SIGTERM/SIGHUP behave like Ctrl-C, so `finally` blocks run (removing caps, stopping jobs)."""
    def handler(signum, frame):
        raise _Interrupted(f"signal {signal.Signals(signum).name}")

    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


@contextlib.contextmanager
def signals_ignored():
    """Ctrl-C, SIGTERM and SIGHUP ignored while a cleanup runs: a second one (a user pressing Ctrl-C
    again, `timeout` signalling its whole process group after the first) must not cut it short and
    leave ranks training or a cap on the link."""
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


class Follower:
    """Rank 0's last logged update, asked over one kept-open connection; raises when a rank stopped."""

    def __init__(self, run: Run, hosts: list[Host]):
        self.run, self.hosts = run, hosts
        self.conn = connect(hosts[0])
        self.command = agent_command(hosts[0], "keeper.state", "--run", run.remote_dir, "--tail", 0)

    def update(self) -> int:
        result = self.conn.run(self.command, hide=True, warn=True, in_stream=False)
        try:
            state = json.loads(result.stdout)
        except ValueError:
            state = {}
        if not state.get("running"):
            self._fail()
        return state.get("update") or 0

    def wait(self, update: int, timeout: float, poll: float = 0.5) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            now = self.update()
            if now >= update:
                return now
            time.sleep(poll)
        raise ClusterError(f"{self.run.run_id}: update {update} not reached in {timeout:.0f} s")

    def _fail(self):
        states = launch.states(self.run, self.hosts)
        gone = [s for s in states if not s.running] or states[:1]
        raise ClusterError("a rank stopped during the benchmark: " + "; ".join(
            f"{s.name}: {' | '.join(s.tail[-3:]) or s.error}" for s in gone))

    def close(self):
        self.conn.close()


def per_update(records: list[logformat.Record]) -> dict[int, dict[str, float]]:
    """{update: {s, wps, wpb}} from log_interval=1 lines (s = wpb / wps)."""
    out = {}
    for r in records:
        if r.kind == "train_inner" and r.update and r.get("wps") and r.get("wpb"):
            out[r.update] = {"s": r.get("wpb") / r.get("wps"), "wps": r.get("wps"), "wpb": r.get("wpb")}
    return out


def summarize(rates: list[str], segments: list[dict], updates: dict[int, dict[str, float]],
              links: dict[str, float | None], average=statistics.median) -> list[dict]:
    """One point per rate: medians over every update of its segments (and of each segment alone: the
    repeats, measured side by side with the other rates), bytes per update from the counters. Local
    SGD's updates are not alike (one in H syncs): `average` is then the mean over whole periods."""
    points = []
    for rate in dict.fromkeys(rates):
        segs = [g for g in segments if g["rate"] == rate]
        ups = [updates[u] for g in segs for u in range(g["first"], g["last"] + 1) if u in updates]
        n = sum(g["last"] - g["first"] + 1 for g in segs)
        sent: dict[str, int] = {}
        for g in segs:
            for host, b in g["tx"].items():
                sent[host] = sent.get(host, 0) + b
        per_cycle = [[updates[u]["s"] for u in range(g["first"], g["last"] + 1) if u in updates] for g in segs]
        points.append({
            "rate": rate, "link_mbps": links.get(rate), "segments": len(segs), "updates_measured": len(ups),
            "s_per_update": average([u["s"] for u in ups]) if ups else None,
            "cycle_s": [average(c) for c in per_cycle if c],  # each repeat's own figure, in cycle order
            "wps": (sum(u["wpb"] for u in ups) / sum(u["s"] for u in ups) if average is statistics.mean
                    else statistics.median([u["wps"] for u in ups])) if ups else None,
            "wpb": statistics.median([u["wpb"] for u in ups]) if ups else None,
            "tx_bytes": sent, "tx_per_update": statistics.mean(sent.values()) / n if sent and n else None,
        })
    return points


def measure_links(hosts: list[Host], rates: list[str], size: int, ranks: int, port: int,
                  say=print) -> tuple[dict[str, float | None], dict[str, float]]:
    """Under each cap: iperf3 on the ring's links, and the gradient's own all-reduce (short transfers lose
    more to TCP than iperf3), with an idle second before each as between updates (TCP restarts slow start
    after idle). ({rate: iperf3 Mbit/s}, {rate: all-reduce Mbit/s})."""
    links: dict[str, float | None] = {}
    effective: dict[str, float] = {}
    per_rank = model.allreduce_bytes_per_rank(size, ranks)
    for rate in dict.fromkeys(rates):
        link.apply_caps(hosts, rate)
        pairs, _ = link.iperf(hosts, "ring", seconds=2)
        links[rate] = link.link_mbps(pairs)
        result = run_allreduce(hosts, str(size - size % 4), iters=5, warmup=1, budget_s=15, port=port + 1,
                               gap_s=1.0, intra=False)
        ms = result["results"][0]["time_ms"]
        effective[rate] = per_rank / (ms / 1e3) * 8 / 1e6
        say(f"[{rate}] iperf3 {links[rate]} Mbit/s (slowest ring link); all_reduce of the "
            f"{size / 1e6:.1f} MB gradient {ms:.0f} ms = {effective[rate]:.1f} Mbit/s")
    return links, effective


def sweep(follower: Follower, hosts: list[Host], rates: list[str], cycles: int, updates: int, skip: int,
          warmup: int, say=print) -> list[dict]:
    """Change the cap under the running job, `cycles` times through the rates: per segment its rate, cycle,
    first and last update, and the bytes each host's NIC sent meanwhile."""
    segments = []
    follower.wait(warmup, timeout=600)
    for cycle in range(cycles):
        for rate in rates:
            link.apply_caps(hosts, rate)
            now = follower.update()
            first = follower.wait(now + skip, timeout=120 + skip * 120)
            before = tx_bytes(hosts)
            last = follower.wait(first + updates, timeout=120 + updates * 120)
            after = tx_bytes(hosts)
            segments.append({"rate": rate, "cycle": cycle, "first": first + 1, "last": last,
                             "tx": {n: after[n] - before[n] for n in after}})
            say(f"[{rate}] cycle {cycle + 1}: updates {first + 1}..{last}")
    return segments


def clean_up(run: Run, hosts: list[Host], started: bool, follower: Follower | None, say=print) -> None:
    """Stop the job (when it was started) and remove every cap, even on a second Ctrl-C or SIGTERM."""
    with signals_ignored():
        if follower:
            follower.close()
        if started:
            try:
                launch.stop(run, hosts)
                say(f"stopped {run.run_id} on every host")
            except ClusterError as err:  # said, and the caps still come off
                say(f"could not stop {run.run_id}: {err}")
        link.remove_caps(hosts)
        say(f"cap removed on {', '.join(h.name for h in hosts)} (tc qdisc show: no tbf left)")


def require_cluster(hosts: list[Host], precision: str, too_few: str) -> list[str]:
    """Two hosts at least, and GPUs on every host for fp16/bf16; returns the CPU-only hosts."""
    if len(hosts) < 2:
        raise ClusterError(too_few)
    cpu_only = [h.name for h in hosts if h.gpus == 0]
    if precision != "fp32" and cpu_only:
        raise ClusterError(f"{precision} needs GPUs; {', '.join(cpu_only)} have none (gpus: 0): use fp32 there")
    return cpu_only


def bench_step(hosts: list[Host], rates: list[str], preset: str = "tiny", overrides: list[str] | None = None,
               dataset: str = "synthetic", updates: int = 8, cycles: int = 2, skip: int = 1, warmup: int = 3,
               port: int = 29500, precision: str = "fp32", comm: str = "sync", say=print) -> dict:
    """The sweep; returns the report (JSON and PNG written). Caps are always removed. With local
    SGD every segment is a whole number of sync periods (`updates` rounded up to a multiple of H)."""
    cpu_only = require_cluster(hosts, precision, "bench-step needs at least two hosts (the link between them is "
                                                 "the point)")
    link.require_sudo(hosts)  # the caps need root: a host where sudo would refuse is named before anything runs
    overrides = list(overrides or [])
    options = presets.resolve(preset, overrides).options
    vocab = dataset_vocab(hosts[0], dataset)
    params = preset_params(options, vocab)
    ranks = world_size(hosts)
    strategy = strategies.parse(comm)
    period = strategy.syncs_every
    updates = -(-updates // period) * period
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    run = Run(run_id=f"bench-{stamp}", hosts=[h.name for h in hosts], preset=preset,
                     overrides=[*overrides, "max_update=1000000", *BENCH_OVERRIDES, *steady_state(strategy)],
                     dataset=dataset,
                     master_port=port, precision=precision, comm=str(strategy))
    started, gpu_name = False, None
    follower = None
    # a controller killed, asleep or offline never reaches clean_up: each host undoes by itself then
    undo = {h.name: f"{agent_command(h, 'keeper.stop', '--run', run.remote_dir)}; {link.host_cap_command(h, 'none')}"
            for h in hosts}
    with signals_raise(), HostLease(hosts, run.run_id, undo):
        try:
            links, effective = measure_links(hosts, rates, strategy.payload_bytes(params, precision), ranks,
                                             port, say)
            link.apply_caps(hosts, "none")
            # the run trains under every cap: its heartbeat and collective timeout outlast an update's
            # all-reduce at the slowest (a base step at 10 Mbit/s outlasted the old 45 s)
            run.link_mbps = min((m for m in links.values() if m), default=None)
            run.ranks_per_host = hosts[0].ranks
            answers = preflight.probe(run, hosts)
            gpu_name = next((g["name"] for g in answers[hosts[0].name].get("gpus") or []), None)
            # the batch fab train would run here: C is measured at it (fab predict scales it per token)
            derived = batching.apply(run, hosts, batching.gpu_gib_of(answers, hosts))
            if derived:
                say(f"batch derived: {derived.line()}")
            problems = preflight.check(run, hosts, answers)
            if problems:
                raise ClusterError("preflight failed:\n  " + "\n  ".join(problems))
            started = True
            launch.start(run, hosts)
            say(f"training {preset} on {len(hosts)} hosts ({run.run_id}); the cap changes under it: "
                f"{cycles} x ({', '.join(rates)}), {updates} updates each after {skip} to settle")
            follower = Follower(run, hosts)
            segments = sweep(follower, hosts, rates, cycles, updates, skip, warmup, say)
        finally:
            clean_up(run, hosts, started, follower, say)
    batch = batching.of_run(run, hosts)
    report = {"run_id": run.run_id, "hosts": [h.name for h in hosts], "n_hosts": len(hosts), "ranks": ranks,
              "preset": preset, "overrides": overrides, "dataset": dataset, "vocab": vocab, "params": params,
              "max_tokens": batch.max_tokens, "update_freq": batch.update_freq,
              "tokens_per_update": batch.tokens_per_update,
              "precision": precision, "gradient_bytes": strategy.payload_bytes(params, precision),
              "comm": str(strategy),
              "ddp_backend": strategy.ddp_backend(model.ddp_backend(options, cpu=bool(cpu_only))),
              "updates": updates, "cycles": cycles, "skip": skip, "segments": segments,
              "gpus": sum(h.gpus for h in hosts), "gpu_name": gpu_name}
    return finish(report, launch.read_log(hosts[0], run, lines=100000), rates, links, effective)


def finish(report: dict, log_text: str, rates: list[str], links: dict, effective: dict) -> dict:
    """The points (medians per rate from rank 0's log), the model's predictions, JSON and plot written."""
    log = logformat.parse_log(log_text.splitlines())
    comm = report.get("comm", "sync")
    average = statistics.mean if strategies.parse(comm).syncs_every > 1 else statistics.median
    points = summarize(rates, report["segments"], per_update(log.records), links, average)
    options = presets.resolve(report["preset"], report.get("overrides") or []).options
    for p in points:
        p["devices"] = log.devices
        p["allreduce_mbps"] = effective.get(p["rate"])
        # MFU where the hosts have GPUs of a known peak (train.plan.mfu); CPU hosts: absent
        p["mfu"] = flops.of_run(options, int(report.get("vocab") or 32000), p.get("wps"), int(report.get("gpus") or 0),
                                report.get("gpu_name")) if report.get("gpus") else None
    backend = report.get("ddp_backend", "legacy_ddp")
    compute_s, compute_from, overlap = with_predictions(points, report["params"], report["ranks"], report["n_hosts"],
                                                        backend=backend, precision=report["precision"], comm=comm,
                                                        update_freq=int(report.get("update_freq") or 1))
    now = datetime.now(UTC)
    report = {"benchmark": "bench-step", "timestamp": now.isoformat(timespec="seconds"), **report,
              "params_logged": logformat.logged_params(log_text), "compute_s": compute_s, "overlap": overlap,
              "compute_from": compute_from, "points": points}
    path = measurements.write(report, "step", now)
    png = path.with_suffix(".png")
    plot(report, png)
    (measurements.REPORT_DIR / "step-latest.png").write_bytes(png.read_bytes())
    report["path"], report["plot"] = str(path), str(png)
    return report


def summary(report: dict) -> str:
    """What `fab bench-step` prints at the end: the model, C, the table, where the files are."""
    k = int(report.get("update_freq") or 1)
    batch = (f" a batch of {report['max_tokens']:,} tokens a rank x update-freq {k} = {k * report['compute_s']:.3f} "
             "s/update" if report.get("max_tokens") else "/update")
    head = (f"# {report['preset']}, --comm {report.get('comm', 'sync')}: {report['params']:,} parameters "
            f"({report['gradient_bytes'] / 1e6:.1f} MB all-reduced per sync), {report['ranks']} ranks; compute-only C "
            f"{report['compute_s']:.3f} s{batch} (the {report['compute_from']} step less its all-reduce, marked (C): "
            f"its error is 0 by construction); {report.get('ddp_backend', 'legacy_ddp')}, overlap "
            f"{report.get('overlap', 0.0):.2f}"
            + (" (fitted to the capped rates; each rate's prediction uses the others' fit)"
               if report.get("ddp_backend") in model.OVERLAPPING_BACKENDS else " (all-reduce after the backward pass)"))
    return f"{head}\n{table(report['points'])}\nJSON {report['path']}\nplot {report['plot']}"


def compare(reports: list[dict]) -> str:
    """Strategies side by side: each rate's updates/s (every strategy has the same samples per
    update) as a share of the synchronous run's uncapped speed (the compute's own, the issue's
    yardstick) and of its own job's uncapped rate, measured interleaved with it (the fair ratio on
    a noisy machine), and the model's prediction. Updates/s, not words/s: under local SGD fairseq
    logs one rank's words between syncs."""
    base = next((p for r in reports if r.get("comm", "sync") == "sync" for p in r["points"]
                 if p["rate"] == "none" and p.get("s_per_update")), None)
    lines = [f"{'comm':>14} {'rate':>8} {'s/update':>9} {'updates/s':>9} {'of sync uncapped':>16} "
             f"{'of own uncapped':>15} {'predicted':>9}"]
    for r in reports:
        own = next((p for p in r["points"] if p["rate"] == "none" and p.get("s_per_update")), None)
        for p in r["points"]:
            if not p.get("s_per_update"):
                continue
            share = f"{base['s_per_update'] / p['s_per_update']:.0%}" if base else "-"
            mine = f"{own['s_per_update'] / p['s_per_update']:.0%}" if own else "-"
            pred = f"{p['predicted_s']:.3f}" if p.get("predicted_s") else "-"
            lines.append(f"{r.get('comm', 'sync'):>14} {p['rate']:>8} {p['s_per_update']:>9.3f} "
                         f"{1 / p['s_per_update']:>9.2f} {share:>16} {mine:>15} {pred:>9}")
    return "\n".join(lines)


def plot_compare(reports: list[dict], path, quality: dict | None = None) -> None:
    """Updates/s against link bandwidth, one line per strategy (the model's curve, the measured
    points on it); the quality each strategy reached (fab bench-quality) in the legend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    losses = {r["comm"]: r for r in (quality or {}).get("results", []) if r.get("comm")}
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    rates = [p["link_mbps"] for r in reports for p in r["points"] if p.get("link_mbps")]
    xs = np.logspace(np.log10(max(min(rates), 1) / 2), np.log10(max(rates) * 2), 200) if rates else []
    for i, r in enumerate(reports):
        colour = f"C{i}"
        comm = r.get("comm", "sync")
        label = comm + (f" (valid loss {losses[comm]['valid_loss']:.3f})" if comm in losses
                        and losses[comm].get("valid_loss") is not None else "")
        if len(xs):
            curve = model.sweep(r["params"], r["ranks"], r["compute_s"], xs, hosts=r["n_hosts"],
                                comm=comm, precision=r.get("precision", "fp32"), overlap=r.get("overlap", 0.0),
                                update_freq=int(r.get("update_freq") or 1))
            ax.plot(xs, [1 / c.step_s for c in curve], color=colour, label=f"{label}: model")
        pts = [p for p in r["points"] if p.get("s_per_update") and p.get("link_mbps")]
        ax.scatter([p["link_mbps"] for p in pts], [1 / p["s_per_update"] for p in pts], color=colour, zorder=3)
    ax.set_xscale("log")
    ax.set_xlabel("link bandwidth, iperf3 (Mbit/s)")
    ax.set_ylabel("updates per second (same samples per update)")
    first = reports[0]
    ax.set_title(f"{first['preset']} {first['params'] / 1e6:.2f}M params, {first['ranks']} ranks: "
                 "communication strategies")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def auto_per_rate(hosts: list[Host], rates: list[str], preset: str, overrides: list[str], dataset: str,
                  precision: str, say=print) -> list[str]:
    """`--comm auto`: what `fab train --comm auto` would pick at each capped rate (the predict model;
    C from the latest bench-step of this model), one job per distinct pick."""
    capped = [r for r in rates if link.rate_bits(r)] or ["measure"]
    picked = []
    for rate in capped:
        where = "measure" if rate == "measure" else f"{link.rate_bits(rate) / 1e6:g}"
        # without a compute-only time predict_for says how to get one (train.plan.predict.assess)
        verdict = predict.predict_for(hosts, preset, overrides, dataset, where, precision=precision, comm="auto")
        choice = verdict.choice
        if choice.update_freq > verdict.batch.update_freq:  # beyond the derived batch bench-step runs
            raise ClusterError(f"--comm auto at {rate} picks {choice.flag()}: bench-step measures --comm "
                               f"strategies only; measure that with fab train or fab bench-quality "
                               f"--comm update-freq:{choice.update_freq}")
        say(f"--comm auto at {rate}: {choice.comm} ({choice.prediction.efficiency:.0%} predicted)")
        picked.append(choice.comm)
    return list(dict.fromkeys(picked))


def run(hosts: list[Host], rates: str = "10mbit,100mbit,1gbit,none", preset: str = "tiny",
        set_text: str | None = None, dataset: str = "synthetic", updates: int | str = 8, cycles: int | str = 2,
        skip: int | str = 1, port: int | str = 29500, precision: str | None = None, comm: str = "sync",
        say=print) -> list[dict]:
    """`fab bench-step`: the sweep from the task's option values as given (`rates` and `comm` comma
    lists, `set_text` --set's `key=value,...`, numbers may come as text), one job per strategy, each
    one's summary said; with several, the side-by-side comparison and its plot. `precision` None:
    as `fab train` picks it. Returns the reports."""
    precision = precision or default_precision([h.gpus for h in hosts])
    try:
        rate_list = parse_rates(rates)
    except ValueError as err:
        raise ClusterError(str(err)) from err
    names = [x.strip().lower() for x in str(comm).split(",") if x.strip()]
    overrides = presets.parse_overrides(set_text)
    if "auto" in names:
        picked = auto_per_rate(hosts, rate_list, preset, overrides, dataset, precision, say)
        names = list(dict.fromkeys(n for name in names for n in (picked if name == "auto" else [name])))
    try:
        chosen = [str(strategies.parse(x)) for x in names]
    except CommError as err:
        raise ClusterError(str(err)) from None
    reports = []
    for strategy in chosen:
        report = bench_step(hosts, rate_list, preset=preset, overrides=overrides, dataset=dataset,
                            updates=int(updates), cycles=int(cycles), skip=int(skip), port=int(port),
                            precision=precision, comm=strategy, say=say)
        say(summary(report))
        reports.append(report)
    if len(reports) > 1:
        say(compare(reports))
        png = measurements.REPORT_DIR / f"step-compare-{reports[-1]['timestamp'].replace(':', '')}.png"
        plot_compare(reports, png, quality=measurements.latest("quality"))
        say(f"plot {png}")
    return reports
