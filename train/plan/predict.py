"""`fab predict` and `fab train`'s network check: the cost model fed with measured figures.

Inputs, each with where it came from (printed beside the numbers):
- gradient size: the preset's parameters (train.recipe.params.preset_params, the dataset's
  dictionary size read from the first host) × 4 bytes (fp32) or 2 (fp16/bf16);
- ranks: every rank of every host (train.cluster.Host.ranks: one per GPU, `cpu_ranks` on a CPU host);
- link: `measure` (iperf3 now, every ring link at once, 2 s), `bench` (the latest
  `fab bench-net`: its all_reduce bus bandwidth at the size nearest the gradient's, which is
  what a burst of that size gets; iperf3's slowest pair if it has no all_reduce rows), or a
  number in Mbit/s;
- the batch (max_tokens per rank x update_freq): the one `fab train` would run, decided by the same
  function (train.plan.batching.decide) for the GPUs' memory (nvidia-smi now; `fab train`'s check
  reads the run's own);
- compute-only s per batch: `compute_s`, else the latest `fab bench-step` of the same model on
  as many hosts (its compute_s: the uncapped step less its own communication), at that batch's
  max_tokens or scaled per token from the one it measured (said: "scaled from N tokens").

The verdict: network-bound when the exposed all-reduce is more than half of the step.
Without a compute figure the share cannot be known: then the check falls back to the
link against the inventory's `network_expected_mbps` (below `network_min_ratio`, 0.9 by
default, is a capped port, the field reports' 100 Mb/s case) and says how to measure compute.
`fab train` refuses to start in either case unless `--accept-slow-network`.

With a compute figure, every host subset × `--comm` is priced too (train.plan.compare: hours, and
dollars from the inventory's `hourly_usd`); `fab train` also refuses, under the same flag, a run
that fewer hosts would train the same updates faster, naming that run.
"""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import dataclass, field

from train.cluster import ClusterError, GroupResult, Host, run_all, world_size
from train.hosts.paths import DATA_ROOT
from train.plan import batching
from train.reachability import require_answered
from train.recipe import presets, strategies
from train.recipe.gpu_defaults import default_precision
from train.recipe.params import preset_params
from train.recipe.record import Run
from train.recipe.strategies import CommError

from . import compare, link, measurements, model, price
from .batch import Batch


@dataclass
class Verdict:
    params: int
    ranks: int
    link_mbps: float
    link_source: str
    compute_s: float | None
    compute_source: str
    expected_mbps: float | None
    min_ratio: float
    prediction: model.Prediction | None = None
    at_expected: model.Prediction | None = None
    comm_only: model.Prediction | None = None
    lines: list[str] = field(default_factory=list)
    port_mbps: float | None = None  # iperf3's figure, for the capped-port check (default: link_mbps)
    choice: model.Choice | None = None  # what `--comm auto` picked, or would pick for a network-bound run
    comm: str = "sync"
    comparison: compare.Comparison | None = None  # every host subset × strategy (needs the compute figure)
    batch: Batch | None = None  # the batch priced: max_tokens per rank x update_freq (train.plan.batching)

    @property
    def fewer_hosts_faster(self) -> compare.Option | None:
        """A run on fewer hosts that trains the same updates faster than this one (compare.Comparison)."""
        return self.comparison.fewer_hosts_faster if self.comparison else None

    def cost_line(self) -> str | None:
        """The run as asked: its predicted hours and, when every host has a price, dollars."""
        if self.comparison is None or self.comparison.asked.hours is None:
            return None
        asked = self.comparison.asked
        cost = (f", {price.dollars(asked.dollars)} at {price.dollars(asked.usd_per_hour)}/h"
                if asked.dollars is not None else
                f" (no {price.PRICE_VAR} for {', '.join(self.comparison.unpriced)}: dollars left out)")
        return f"predicted {model.duration(asked.hours * 3600)}{cost}"

    @property
    def slow_link(self) -> bool:
        port = self.port_mbps if self.port_mbps is not None else self.link_mbps
        return bool(self.expected_mbps) and port < self.min_ratio * float(self.expected_mbps)

    @property
    def network_bound(self) -> bool:
        if self.prediction is not None:
            return self.prediction.network_bound
        return self.slow_link  # no compute figure: a link well below what the inventory promises

    def as_dict(self) -> dict:
        return {"params": self.params, "ranks": self.ranks, "link_mbps": self.link_mbps,
                "link_source": self.link_source, "compute_s": self.compute_s, "compute_source": self.compute_source,
                "port_mbps": self.port_mbps, "expected_mbps": self.expected_mbps, "slow_link": self.slow_link,
                "network_bound": self.network_bound,
                "comm": self.comm, "choice": {"comm": self.choice.comm, "update_freq": self.choice.update_freq,
                                              "reached": self.choice.reached,
                                              "efficiency": self.choice.prediction.efficiency} if self.choice else None,
                "prediction": self.prediction.as_dict() if self.prediction else None,
                "comparison": self.comparison.as_dict() if self.comparison else None,
                "batch": {"max_tokens": self.batch.max_tokens, "update_freq": self.batch.update_freq,
                          "ranks": self.batch.ranks, "tokens_per_update": self.batch.tokens_per_update,
                          "line": self.batch.line()} if self.batch else None,
                "at_expected": self.at_expected.as_dict() if self.at_expected else None}


# not the model: how long the run is, and its batch (C is scaled to the batch: measurements.compute_at)
NOT_THE_MODEL = ("max_update", "max_epoch", "max_tokens", "tokens_per_update")


def _model_options(overrides: list[str]) -> list[str]:
    """The overrides that change the step's cost per token."""
    return sorted(o for o in overrides if o.split("=")[0].strip() not in NOT_THE_MODEL)


def compute_from_bench(params: int, n_hosts: int, ranks: int, preset: str | None = None,
                       overrides: list[str] | None = None,
                       max_tokens: int | None = None) -> tuple[float | None, str]:
    """The latest bench-step's compute-only seconds for one batch of `max_tokens` per rank (measured
    at it, or scaled per token from the batch it measured), if it measured the same model on as many
    hosts; `max_tokens` None: the batch it measured."""
    report = measurements.latest("step")
    same_model = preset is None or (report and report.get("preset") == preset
                                    and _model_options(report.get("overrides", [])) == _model_options(overrides or []))
    if report and same_model and report.get("params") == params and report.get("ranks") == ranks \
            and report.get("n_hosts") == n_hosts and report.get("compute_s"):
        c = measurements.compute_at(report, max_tokens or measurements.batch_of(report)[0])
        if c is not None:
            return c.seconds, c.source
    return None, "unknown: run `fab bench-step --rates none` with the same model (or pass --compute-s)"


GPU_MEMORY = "nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits"


def gpu_memory(hosts: list[Host]) -> dict[str, float]:
    """Each GPU host's smallest GPU memory (GiB), asked from nvidia-smi now (as the probe's, MiB).
    Bounded: a wedged driver hangs nvidia-smi, and `fab predict` should say so, not wait forever."""
    gpu_hosts = [h for h in hosts if h.gpus > 0]
    if not gpu_hosts:
        return {}
    return gpu_memory_of(run_all(gpu_hosts, GPU_MEMORY, timeout=30), gpu_hosts)


def gpu_memory_of(results: GroupResult, hosts: list[Host]) -> dict[str, float]:
    """gpu_memory from nvidia-smi's answers; a host without one fails naming it and why: pricing
    the other hosts' GPUs would size a batch the silent host's smaller GPU may not hold."""
    require_answered(hosts, results)  # a silent host is unreachable, not a host with a broken driver
    answers, problems = {}, []
    for host in hosts:
        result = results[host.name]
        mib = [int(x) for x in result.stdout.split() if x.isdigit()] if result.ok else []
        if mib:
            answers[host.name] = {"gpus": [{"memory_mib": m} for m in mib]}
        else:
            why = result.why if not result.ok else f"no memory in its answer: {result.stdout.strip()[-200:]!r}"
            problems.append(f"{host.name} ({host.address}): nvidia-smi: {why}")
    if problems:
        raise ClusterError("the GPUs' memory (the batch's cap) could not be read:\n  " + "\n  ".join(problems)
                           + "\n  check the driver there (`nvidia-smi`), or leave the host out")
    return batching.gpu_gib_of(answers, hosts)


def batch_for(hosts: list[Host], preset: str, overrides: list[str], dataset: str, precision: str,
              comm: str = "sync", update_freq: int | None = None) -> Batch:
    """The batch `fab train` would run this preset with on these hosts (train.plan.batching.decide, the
    GPUs' memory from nvidia-smi); `update_freq`: the user's --update-freq (max_tokens follows)."""
    run = Run(run_id="predict", hosts=[h.name for h in hosts], preset=preset, overrides=list(overrides),
              dataset=dataset, precision=precision, comm=comm if comm != "auto" else "sync",
              update_freq=update_freq or 1, update_freq_given=update_freq is not None)
    return batching.decide(run, hosts, gpu_memory(hosts))


def overlap_for(backend: str, hosts: list[Host]) -> tuple[float, str]:
    """The overlap of `backend` on these hosts: 0 for legacy_ddp (the all-reduce starts after the
    backward pass), else the newest bench-step's fit for that backend, else 0 said as unmeasured."""
    if backend not in model.OVERLAPPING_BACKENDS:
        return 0.0, f"{backend}: the all-reduce starts after the backward pass"
    names = sorted(h.name for h in hosts)
    for path in sorted(measurements.REPORT_DIR.glob("step-2*.json"), reverse=True):
        report = json.loads(path.read_text())
        if report.get("ddp_backend") == backend and sorted(report.get("hosts", [])) == names:
            return float(report.get("overlap", 0.0)), f"{backend}, fitted by fab bench-step of {report['timestamp']}"
    return 0.0, f"{backend}: not measured on these hosts, 0 assumed (`fab bench-step --set ddp_backend={backend}`)"


def allreduce_rate_at(report: dict, size_bytes: float) -> tuple[float, int] | None:
    """bench-net's busbw (Mbit/s) for the all_reduce size nearest the gradient's (log scale) and
    that size: small buffers are latency-bound, so a 1 MB gradient does not get iperf3's rate."""
    rows = [r for r in report.get("allreduce", {}).get("results", []) if r.get("busbw")]
    if not rows:
        return None
    nearest = min(rows, key=lambda r: abs(math.log(r["size"] / size_bytes)))
    return nearest["busbw"] * 8e3, int(nearest["size"])  # busbw is in GB/s


def link_figure(hosts: list[Host], source: str,
                gradient_bytes: float | None = None) -> tuple[float, str, float]:
    """The rate the model uses, where it came from, and iperf3's (steady-state) figure: a small
    all_reduce is latency-bound on any port, so the capped-port check looks at the latter."""
    if source in ("measure", "quick"):
        # quick: fab train's check before every start, 1 s a pair (a capped port is 10x off, not 10%)
        pairs, _ = link.iperf(hosts, "ring", seconds=1, omit=0) if source == "quick" else \
            link.iperf(hosts, "ring", seconds=2)
        link.require_reachable(pairs, hosts)
        mbps = link.link_mbps(pairs)
        if not mbps:
            raise ClusterError("iperf3 measured nothing: " + "; ".join(p.error or "" for p in pairs))
        return mbps, "iperf3 now, slowest of " + ", ".join(f"{p.src}->{p.dst} {p.mbps:.0f}" for p in pairs), mbps
    if source == "bench":
        report = measurements.latest("net")
        if not report or sorted(report["hosts"]) != sorted(h.name for h in hosts):
            raise ClusterError("no `fab bench-net` of these hosts to take the link from: run it, or --link measure")
        port = float(report["link_mbps"])
        at = allreduce_rate_at(report, gradient_bytes) if gradient_bytes else None
        if at:
            return at[0], (f"fab bench-net of {report['timestamp']}: all_reduce busbw at {at[1] / 2**20:g} MiB, "
                           f"the size nearest the gradient's {gradient_bytes / 2**20:.1f} MiB; iperf3 "
                           f"{port:.0f}"), port
        return port, f"fab bench-net of {report['timestamp']}, iperf3", port
    try:
        return float(source), "given", float(source)
    except ValueError:
        raise ClusterError(f"--link is measure, bench or Mbit/s, not {source!r}") from None


def assess(hosts: list[Host], params: int, *, link_mbps: float, link_source: str, compute_s: float | None,
           compute_source: str, port_mbps: float | None = None, precision: str = "fp32", update_freq: int = 1,
           max_update: int | None = None, overlap: float = 0.0, overlap_source: str = "given",
           comm: str = "sync", overlaps: dict[str, float] | None = None,
           overlap_sources: dict[str, str] | None = None, sync_updates: int | dict[str, int] = 0,
           tokens_per_batch: int | None = None) -> Verdict:
    """Pure: figures in, verdict and the lines explaining it out. `comm`: a strategy, or `auto`
    (model.choose, with `overlaps` per strategy); a network-bound sync run is told which `--comm`
    would reach 90%. `sync_updates`: each strategy's synchronous start (strategies.starts)."""
    ranks = world_size(hosts)
    expected = hosts[0].var("network_expected_mbps")
    ratio = hosts[0].var("network_min_ratio")
    v = Verdict(params, ranks, link_mbps, link_source, compute_s, compute_source,
                float(expected) if expected else None, ratio, port_mbps=port_mbps)
    overlaps = dict(overlaps or dict.fromkeys(strategies.overlapping(), overlap))
    if comm == "auto" and compute_s is not None:
        v.choice = model.choose(params, ranks, model.mbit_to_bytes_per_s(link_mbps), compute_s, overlaps=overlaps,
                                hosts=len(hosts), precision=precision, max_update=max_update, update_freq=update_freq,
                                sync_updates=sync_updates)
        comm, update_freq = v.choice.comm, v.choice.update_freq
    elif comm == "auto":
        raise ClusterError("--comm auto needs the compute-only time per update: run `fab bench-step --rates none` "
                           "with the same model first (or pass --compute-s), or name a strategy: "
                           f"--comm {strategies.syntax()}")
    v.comm = comm
    strategy = strategies.parse(comm)
    overlap = overlaps.get(strategy.name, overlap) if strategy.overlaps else 0.0
    overlap_source = (overlap_sources or {}).get(strategy.name, overlap_source) if strategy.overlaps else \
        strategy.why_no_overlap
    kw = {"hosts": len(hosts), "precision": precision, "update_freq": update_freq, "max_update": max_update,
          "overlap": overlap, "comm": comm, "sync_updates": sync_updates}
    v.lines.append(f"link {link_mbps:.0f} Mbit/s ({link_source})"
                   + (f"; the inventory expects {v.expected_mbps:.0f} Mbit/s" if v.expected_mbps else ""))
    if compute_s is not None:
        v.prediction = model.predict(params, ranks, model.mbit_to_bytes_per_s(link_mbps), compute_s, **kw)
        v.lines.append(f"compute-only {compute_s:.3f} s a batch ({compute_source}); overlap {overlap:.2f} "
                       f"({overlap_source})")
        if v.choice:
            v.lines += v.choice.lines()
        v.lines += model.explain(v.prediction).splitlines()
        if v.prediction.efficiency < 0.9 and not v.choice:
            better = model.choose(params, ranks, model.mbit_to_bytes_per_s(link_mbps), compute_s, overlaps=overlaps,
                                  hosts=len(hosts), precision=precision, max_update=max_update, update_freq=update_freq,
                                  sync_updates=sync_updates)
            if better.comm != comm or better.update_freq != update_freq:
                v.choice = better
                p = better.prediction
                v.lines.append(f"{better.flag()} would {'reach' if better.reached else 'get'} "
                               f"{p.efficiency:.0%} of the compute speed: {p.step_s:.3f} s/update"
                               + (f" ({p.update_freq} batches)" if p.update_freq > 1 else "")
                               + (f", {model.duration(p.run_hours * 3600)}" if p.run_hours is not None else "")
                               + " (`--comm auto` picks it; `fab bench-quality` measures what it costs)")
        if v.expected_mbps:
            v.at_expected = model.predict(params, ranks, model.mbit_to_bytes_per_s(v.expected_mbps), compute_s, **kw)
            hours = v.at_expected.run_hours
            v.lines.append(f"at the expected {v.expected_mbps:.0f} Mbit/s: {v.at_expected.step_s:.2f} s/update"
                           + (f", {model.duration(hours * 3600)}" if hours is not None else ""))
        v.comparison = compare.compare(hosts, params, link_mbps=link_mbps, compute_s=compute_s, precision=precision,
                                       overlaps=overlaps, comm=comm, update_freq=update_freq, max_update=max_update,
                                       tokens_per_batch=tokens_per_batch, sync_updates=sync_updates)
        if cost := v.cost_line():
            v.lines.append(cost)
        v.lines += v.comparison.verdict()
    else:
        v.comm_only = model.predict(params, ranks, model.mbit_to_bytes_per_s(link_mbps), 1e-9, **kw)
        v.lines.append(f"all-reduce alone: {v.comm_only.comm_s:.2f} s per update "
                       f"({v.comm_only.gradient_bytes / 1e6:.1f} MB of gradients); compute-only time {compute_source}")
    if v.slow_link:
        port = port_mbps if port_mbps is not None else link_mbps
        v.lines.append(f"the link (iperf3) is {port / v.expected_mbps:.0%} of the expected "
                       f"{v.expected_mbps:.0f} Mbit/s (a capped port?)")
    v.lines.append("verdict: NETWORK-BOUND" if v.network_bound else "verdict: the network is not the bottleneck")
    if fewer := v.fewer_hosts_faster:
        v.lines.append(f"verdict: FEWER HOSTS ARE FASTER: {fewer.flags()}")
    return v


def dataset_vocab(host: Host, dataset: str) -> int:
    """fairseq's dictionary size: the lines of dict.en.txt plus its 4 special symbols."""
    path = f"{DATA_ROOT}/{dataset}/dict.en.txt"
    results = run_all([host], f"wc -l < {shlex.quote(path)}")
    require_answered([host], results)  # a silent host is unreachable, not one without the file
    result = results[host.name]
    if not result.ok and "No such file" in result.why:
        raise ClusterError(f"{host.name}: no dictionary at {path}: run `fab prepare-data`")
    if not result.ok:
        raise ClusterError(f"{host.name}: could not read {path}: {result.why}")
    return int(result.stdout.strip()) + 4


def model_params(hosts: list[Host], preset: str, overrides: list[str], dataset: str) -> int:
    return preset_params(presets.resolve(preset, overrides).options, dataset_vocab(hosts[0], dataset))


def predict_for(hosts: list[Host], preset: str, overrides: list[str], dataset: str, link_source: str = "measure",
                compute_s: float | None = None, precision: str = "fp32", batch: Batch | None = None,
                max_update: int | None = None, overlap: float | None = None, comm: str = "sync") -> Verdict:
    """The verdict for this preset on these hosts at `batch` (None: the one `fab train` would run,
    batch_for); `compute_s`: seconds for one batch of its max_tokens (None: bench-step's, scaled to
    it). `overlap` None: the measured one for the DDP backend the run uses (overlap_for). `comm`: a
    strategy or `auto` (the least invasive one that reaches 90% scaling efficiency)."""
    if len(hosts) < 2:
        raise ClusterError("a prediction of the network's cost needs at least two hosts")
    if comm != "auto":
        try:
            strategies.parse(comm)
        except CommError as err:
            raise ClusterError(str(err)) from None
    params = model_params(hosts, preset, overrides, dataset)
    ranks = world_size(hosts)
    if batch is None:
        batch = batch_for(hosts, preset, overrides, dataset, precision, comm)
    source = "given"
    if compute_s is None:
        compute_s, source = compute_from_bench(params, len(hosts), ranks, preset, overrides, batch.max_tokens)
    mbps, where, port = link_figure(hosts, link_source, model.gradient_bytes(params, precision))
    options = presets.resolve(preset, overrides).options
    if max_update is None:
        max_update = options.get("max_update")
    default_backend = model.ddp_backend(options, cpu=any(h.gpus == 0 for h in hosts))
    if overlap is None:
        measured = {name: overlap_for(strategies.parse(name).ddp_backend(default_backend), hosts)
                    for name in strategies.overlapping()}
        overlaps = {k: v[0] for k, v in measured.items()}
        sources = {k: v[1] for k, v in measured.items()}
        overlap, overlap_source = measured["sync"]
    else:
        overlaps, sources, overlap_source = dict.fromkeys(strategies.overlapping(), overlap), {}, "given"
    verdict = assess(hosts, params, link_mbps=mbps, link_source=where, port_mbps=port, compute_s=compute_s,
                     compute_source=source, precision=precision, update_freq=batch.update_freq,
                     max_update=max_update, overlap=overlap, overlap_source=overlap_source, comm=comm,
                     overlaps=overlaps, overlap_sources=sources, sync_updates=strategies.starts(options),
                     tokens_per_batch=batch.max_tokens)
    verdict.batch = batch
    verdict.lines.insert(0, f"batch: {batch.line()}")
    verdict.lines += slow_link_lines(params, ranks, mbps, options, verdict.choice.comm if verdict.choice and
                                     comm == "auto" else comm)
    return verdict


def slow_link_lines(params: int, ranks: int, link_mbps: float, options: dict, comm: str) -> list[str]:
    """The collective timeout the run gets on this link (presets.failure_timeout_s) and, for local
    SGD, the GPU memory it needs beyond sync's."""
    timeout = presets.failure_timeout_s(options, ranks=ranks, link_mbps=link_mbps)
    lines = [f"collective timeout (heartbeat, process group): {timeout} s for a "
             f"{params * presets.FP32_BYTES / 1e6:.0f} MB all-reduce over {ranks} ranks at {link_mbps:.0f} Mbit/s"]
    extra = strategies.parse(comm).extra_bytes_per_param(options) if comm != "auto" else 0
    if extra:
        lines.append(f"{comm} needs {params * extra / 1e9:.2f} GB more memory per GPU than sync "
                     f"({extra} B a parameter)")
    return lines


def for_run(run, hosts: list[Host], comm: str | None = None, link_source: str = "quick") -> Verdict | None:
    """`fab train`'s check for a launch.Run at the batch it will train with (batching.of_run: what
    batching.decide gave it); `comm`: auto to choose, default the run's. None (with nothing refused)
    when it cannot be made."""
    if len(hosts) < 2:
        return None
    return predict_for(hosts, run.preset, list(run.overrides), run.dataset, link_source,
                       precision=run.precision, batch=batching.of_run(run, hosts), max_update=run.max_update,
                       comm=comm if comm is not None else run.comm)


def for_options(hosts: list[Host], preset: str = "tiny", set_text: str | None = None, dataset: str = "synthetic",
                link_source: str = "measure", compute_s: float | str | None = None, precision: str | None = None,
                update_freq: int | str | None = None, max_update: int | str | None = None,
                overlap: float | str | None = None, comm: str = "sync") -> Verdict:
    """`fab predict`: the verdict from the task's option values as given (`set_text`: --set's
    `key=value,...`; numbers may come as text). `precision` None: as `fab train` picks it (fp16
    on GPU hosts, fp32 where any host has none). The batch: as `fab train` derives it for these
    hosts' GPUs (batch_for); `update_freq` given: as `fab train --update-freq`."""
    overrides = presets.parse_overrides(set_text)
    precision = precision or default_precision([h.gpus for h in hosts])
    chosen = batch_for(hosts, preset, overrides, dataset, precision, str(comm),
                       int(update_freq) if update_freq is not None else None)
    return predict_for(hosts, preset, overrides, dataset, str(link_source),
                       compute_s=float(compute_s) if compute_s is not None else None,
                       precision=precision, batch=chosen, max_update=int(max_update) if max_update else None,
                       overlap=float(overlap) if overlap is not None else None, comm=str(comm))
