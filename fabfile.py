"""tandem's per-run jobs on the cluster. `fab -l` lists them, `fab --help TASK` explains one.

Hosts come from the Ansible inventory (fabric.yaml `inventory`, or FABRIC_INVENTORY=...);
`--hosts a,b` picks some of them, in that order (the first is rank 0), else the
inventory's `cluster` group.
"""

import os
import sys
from pathlib import Path

from fabric import task
from rich.table import Table

from train.cluster import ClusterError, run_all
from train.data import corpus, distribute, download
from train.run import command, launch, presets
from train.run.follow import describe, follow
from train.tasks import cluster_task, console


@task
@cluster_task
def info(c, hosts):
    """Show every host's name, kernel, CPUs and memory, asked of all hosts in parallel."""
    results = run_all(hosts, "hostname; uname -r; nproc; free -m | awk '/Mem:/ {print $2}'")
    table = Table(title="cluster")
    for column in ("host", "address", "hostname", "kernel", "cpus", "memory (MiB)", "gpus"):
        table.add_column(column)
    for host in hosts:
        result = results[host.name]
        if isinstance(result, Exception):
            table.add_row(host.name, host.address, f"[red]unreachable: {result}[/]", "", "", "", "")
            continue
        if not result.ok or len(result.stdout.split()) != 4:
            table.add_row(host.name, host.address, f"[red]failed: {result.stderr.strip() or result.stdout.strip()}[/]",
                          "", "", "", "")
            continue
        hostname, kernel, cpus, memory = result.stdout.split()
        table.add_row(host.name, host.address, hostname, kernel, cpus, memory, str(host.gpus))
    console.print(table)


@task(help={
    "name": "dataset name on the hosts (/data/tandem/datasets/NAME); default: synthetic, sample or wmt16",
    "source": "a directory with {train,valid,test}.{en,de} instead of the synthetic corpus",
    "wmt16": "download the WMT16 en-de corpora (resumable, checksummed)",
    "vocab_size": "joint sentencepiece vocabulary size (default 32000; the synthetic corpus uses 1000)",
    "lines": "synthetic corpus: training pairs (default 20000)",
})
@cluster_task
def prepare_data(c, hosts, name=None, source=None, wmt16=False, vocab_size=None, lines=20000):
    """Prepare a corpus (clean, joint subwords, fairseq-preprocess) and put it on /data of every host."""
    name = name or ("wmt16" if wmt16 else Path(source).name if source else "synthetic")
    vocab = int(vocab_size or (32000 if (wmt16 or source) else 1000))
    work = Path(os.environ.get("TANDEM_CACHE", Path.home() / ".cache/tandem")) / "data"
    if wmt16:  # first, with a progress bar per archive: not under the spinner below
        try:
            corpus.download_wmt16(work / "downloads")
        except (corpus.DataError, download.DownloadError) as err:
            raise ClusterError(str(err)) from err
    with console.status(f"preparing {name}: clean, sentencepiece ({vocab}), fairseq-preprocess"):
        try:
            prepared = corpus.prepare(name, work, source=Path(source) if source else None, wmt16=wmt16,
                                      vocab_size=vocab, synthetic_train=int(lines))
        except (corpus.DataError, download.DownloadError) as err:
            raise ClusterError(str(err)) from err
    console.print(f"[green]✓[/] {name}: {prepared.train_lines:,} training pairs, {prepared.train_mb} MB of text, "
                  f"vocabulary {prepared.vocab_size}")
    with console.status(f"copying to {', '.join(h.name for h in hosts)} and checking checksums"):
        sums = distribute.upload(Path(prepared.bin_dir), name, hosts)
    console.print(f"[green]✓[/] identical on every host ({', '.join(sums)}): manifest "
                  f"{next(iter(sums.values()))[:12]}, at {launch.DATA_ROOT}/{name}")


def _pick_run(hosts, run_id, new, preset, overrides, dataset, port, update_freq, precision):
    """The run `fab train` acts on: the named one, else the latest (resumed), else a new one."""
    existing = None
    if not new:
        try:
            existing = launch.Run.load(run_id)
        except ClusterError:
            if run_id:
                raise  # a named run that does not exist; without a name: nothing to resume, start one
    if existing is not None:
        if existing.hosts != [h.name for h in hosts]:
            raise ClusterError(f"run {existing.run_id} ran on {', '.join(existing.hosts)}, not "
                               f"{', '.join(h.name for h in hosts)}: pass the same --hosts, or --new")
        extra = [o for o in (overrides or "").split(",") if o]
        if extra:  # e.g. a higher max_update to train on
            existing.overrides = [*existing.overrides, *extra]
            try:
                existing.resolved_preset()
            except presets.OverrideError as err:
                raise ClusterError(str(err)) from err
        return existing, True
    run_id = run_id or launch.new_run_id()
    overrides_list = [o for o in (overrides or "").split(",") if o]
    run = launch.Run(run_id=run_id, hosts=[h.name for h in hosts], preset=preset, overrides=overrides_list,
                     dataset=dataset, master_port=int(port), update_freq=int(update_freq), precision=precision)
    try:
        run.resolved_preset()  # rejects unknown or mistyped overrides now
    except presets.OverrideError as err:
        raise ClusterError(str(err)) from err
    return run, False


@task(help={
    "preset": "tiny (lab, CPU), transformer_wmt_en_de (base), transformer_vaswani_wmt_en_de_big",
    "set": "fairseq option overrides, comma-separated: --set max_update=300000,lr=0.001",
    "dataset": "dataset on /data/tandem/datasets (default synthetic)",
    "run": "run id (default: the latest run, resumed from its last checkpoint)",
    "new": "start a new run even if the latest can be resumed",
    "update_freq": "gradient accumulation: updates every K batches (divides traffic per sample by K)",
    "precision": "fp32, fp16 or bf16 (the last two on GPUs); default fp16 on GPU hosts, fp32 on CPU hosts",
    "port": "rendezvous port on the first host (default 29500)",
    "dry_run": "print every host's command and check them, start nothing",
    "detach": "start and return without following",
    "accept_slow_network": "start even when the network would take most of each step (see fab predict)",
})
@cluster_task
def train(c, hosts, preset="tiny", set=None, dataset="synthetic", run=None, new=False, update_freq=1,
          precision=None, port=29500, dry_run=False, detach=False, accept_slow_network=False):
    """Preflight every host, start fairseq on all of them at once (torchrun), follow it; again to resume."""
    precision = precision or command.default_precision([h.gpus for h in hosts])
    the_run, resuming = _pick_run(hosts, run, new, preset, set, dataset, port, update_freq, precision)
    commands = launch.host_commands(the_run, hosts)
    if dry_run:
        for host in hosts:
            console.print(f"[bold]{host.name}[/]: {commands[host.name]}")
        return
    with console.status("preflight: versions, data, GPUs, disk, port on every host"):
        problems = launch.check(the_run, hosts, launch.probe(the_run, hosts))
    if problems:
        raise ClusterError("preflight failed, nothing started:\n  " + "\n  ".join(problems))
    console.print(f"[green]✓[/] preflight passed on {', '.join(h.name for h in hosts)}")
    the_run.link_mbps = _network_check(the_run, hosts, accept_slow_network)
    if resuming:
        copy = launch.share_checkpoint(the_run, hosts)
        if copy is not None:
            console.print(f"resuming {the_run.run_id} from update {launch.checkpoint_update(copy)} "
                          "(checkpoint copied to every host)")
    the_run.save()
    launch.start(the_run, hosts)
    console.print(f"[green]✓[/] {the_run.run_id} started on {len(hosts)} hosts "
                  f"({the_run.preset}; logs {the_run.remote_dir}/train.log on each)")
    if not detach:
        _summarize(follow(the_run, hosts))


def _network_check(the_run, hosts, accept):
    """The cost model on the measured link (benchmarks/predict.py): refuse a network-bound run unless accepted."""
    from benchmarks import predict as bench_predict

    try:
        with console.status("measuring the link (iperf3) and predicting the step time"):
            verdict = bench_predict.for_run(the_run, hosts)
    except ClusterError as err:
        console.print(f"[yellow]network check skipped:[/] {err}")
        return None
    if verdict is None:
        return None
    text = "\n  ".join(verdict.lines)
    if verdict.network_bound and not accept:
        raise ClusterError(f"the network would take most of each step, nothing started:\n  {text}\n"
                           "fix the link, or pass --accept-slow-network to train anyway")
    console.print("[yellow]network-bound, accepted (--accept-slow-network):[/]" if verdict.network_bound
                  else "[green]✓[/] network check:")
    console.print("  " + text, markup=False)
    return verdict.link_mbps


def _summarize(states):
    table = Table()
    for column in ("host", "rank", "state", "update", "loss", "s/update", "last log line"):
        table.add_column(column)
    for rank, s in enumerate(states):
        p = s.progress
        state = "[red]unreachable[/]" if not s.reachable else ("running" if s.running else "stopped")
        if s.reachable and not s.running and p is not None and not p.finished and rank == 0:
            state = "[red]stopped early[/]"
        table.add_row(s.name, str(rank), state, str(p.update) if p else "-",
                      f"{p.loss:.3f}" if p and p.loss is not None else "-",
                      f"{p.seconds_per_update:.2f}" if p and p.seconds_per_update else "-",
                      (s.tail[-1][-70:] if s.tail else s.error or "")[:70])
    console.print(table)
    return states


@task(help={"run": "run id (default: the latest)"})
@cluster_task
def status(c, hosts, run=None):
    """Per host: is its rank running, the last update, loss and s/update; why it stopped if it did."""
    the_run = launch.Run.load(run)
    states = _summarize(launch.states(the_run, the_run.hosts_of(hosts)))
    rank0 = states[0].progress
    if rank0:
        console.print(f"{the_run.run_id}: update {rank0.update}/{rank0.max_update}, {describe(rank0)}")
    finished = bool(rank0 and rank0.finished)  # only rank 0 logs "done training"
    for s in states:
        if s.reachable and not s.running and s.tail and not finished:
            console.print(f"[red]{s.name} stopped[/]; its last log lines:")
            for line in s.tail:
                console.print(f"  {line}")
    if any(not s.reachable for s in states):
        sys.exit(1)


@task(help={"run": "run id (default: the latest)", "lines": "lines per host (default 20)"})
@cluster_task
def logs(c, hosts, run=None, lines=20):
    """Tail every host's training log."""
    the_run = launch.Run.load(run)
    results = run_all(the_run.hosts_of(hosts), f"tail -n {int(lines)} {the_run.remote_dir}/train.log")
    for name, result in results.items():
        console.rule(name)
        if isinstance(result, Exception):
            console.print(f"[red]unreachable: {result}[/]")
        elif not result.ok:
            console.print(f"[red]no log: {result.stderr.strip()}[/]")
        else:
            console.print(result.stdout, markup=False)


@task(help={"run": "run id (default: the latest)"})
@cluster_task
def stop(c, hosts, run=None):
    """Stop every rank on every host and confirm none is left (non-zero exit naming a host that won't stop)."""
    the_run = launch.Run.load(run)
    outcome = launch.stop(the_run, the_run.hosts_of(hosts))
    said = {"stopped": "stopped", "killed": "killed (did not stop on SIGTERM)", "none": "was not running"}
    for name, what in outcome.items():
        console.print(f"{name}: {said.get(what, what)}; no training process left")


@task(help={"run": "run id (default: the latest)", "checkpoint": "checkpoint file name (default checkpoint_best.pt)"})
@cluster_task
def evaluate(c, hosts, run=None, checkpoint="checkpoint_best.pt"):
    """Translate the test set with the best checkpoint on the first host and print SacreBLEU."""
    from train.run import command

    the_run = launch.Run.load(run)
    host = the_run.hosts_of(hosts)[0]  # rank 0's host: it holds the checkpoints
    cmd = command.evaluation_command(
        data_dir=the_run.data_dir, checkpoint=f"{the_run.remote_dir}/checkpoints/{checkpoint}",
        reference=f"{the_run.data_dir}/test.ref.de", out_dir=f"{the_run.remote_dir}/eval",
        venv=launch.venv_of(host), cpu=host.gpus == 0)
    with console.status(f"translating the test set on {host.name}"):
        result = run_all([host], cmd)[host.name]
    if isinstance(result, Exception) or not result.ok:
        raise ClusterError(f"{host.name}: evaluation failed: {getattr(result, 'stderr', result)}")
    bleu = command.parse_bleu(result.stdout)
    the_run.local_dir.mkdir(parents=True, exist_ok=True)
    (the_run.local_dir / "bleu.json").write_text(result.stdout)
    console.print(f"[bold]SacreBLEU {bleu:.2f}[/] ({the_run.run_id}, {checkpoint}, {the_run.dataset} test set)")


# ---- benchmarks (benchmarks/*.py; issue 5) ----


def _say(message):
    console.print(message, markup=False)  # "[none]", "[10mbit]" are not rich markup


@task(help={
    "min_size": "smallest all_reduce buffer (default 1M)",
    "max_size": "largest buffer, powers of two in between (default 1G on GPU hosts, 256M on CPU hosts)",
    "iters": "iterations per size (fewer for slow sizes, see budget_s; default 5)",
    "budget_s": "seconds each size may take (default 20)",
    "iperf_seconds": "seconds iperf3 measures each ordered pair (default 3)",
    "threshold": "fail (exit 1) when busbw / link at 256 MB and above is below this fraction, e.g. 0.85",
    "port": "the all_reduce's rendezvous port on the first host (default 29501)",
})
@cluster_task
def bench_net(c, hosts, min_size="1M", max_size=None, iters=5, budget_s=20, iperf_seconds=3, threshold=None,
              port=29501):
    """iperf3 between every pair of hosts, then an all_reduce sweep: nccl-tests table + busbw / link."""
    from benchmarks import net

    report = net.bench_net(hosts, min_size=min_size, max_size=max_size, iters=int(iters), budget_s=float(budget_s),
                           iperf_seconds=float(iperf_seconds), port=int(port),
                           threshold=float(threshold) if threshold is not None else None, say=_say)
    console.print(f"JSON {report['path']}")
    if not report["ok"]:
        raise ClusterError("below the threshold:\n  " + "\n  ".join(report["problems"]))


@task(help={
    "rates": "tc rates to cap the cluster link at, comma-separated (default 10mbit,100mbit,1gbit,none)",
    "preset": "the model (default tiny)",
    "set": "fairseq option overrides, comma-separated, e.g. encoder_embed_dim=256",
    "dataset": "dataset on /data/tandem/datasets (default synthetic)",
    "updates": "updates measured per rate and cycle (default 8)",
    "cycles": "times the rates are gone through, interleaved in one run (default 2)",
    "skip": "updates after each cap change left out, to settle (default 1)",
    "port": "rendezvous port (default 29500)",
    "precision": "fp32, fp16 or bf16 (the last two on GPU hosts): what the ranks train and all-reduce in; "
                 "default fp16 on GPU hosts, fp32 on CPU hosts",
})
@cluster_task
def bench_step(c, hosts, rates="10mbit,100mbit,1gbit,none", preset="tiny", set=None, dataset="synthetic",
               updates=8, cycles=2, skip=1, port=29500, precision=None):
    """Train on all hosts while capping the link at each rate (tc): s/update, wps, bytes sent; table + plot."""
    from benchmarks import step

    precision = precision or command.default_precision([h.gpus for h in hosts])  # as fab train

    try:
        rate_list = step.parse_rates(rates)
    except ValueError as err:
        raise ClusterError(str(err)) from err
    report = step.bench_step(hosts, rate_list, preset=preset, overrides=[o for o in (set or "").split(",") if o],
                             dataset=dataset, updates=int(updates), cycles=int(cycles), skip=int(skip), port=int(port),
                             precision=precision, say=_say)
    console.print(step.summary(report), markup=False)


@task(help={
    "preset": "the model (default tiny)",
    "set": "fairseq option overrides, comma-separated",
    "dataset": "dataset whose dictionary sizes the embeddings (default synthetic)",
    "link": "measure (iperf3 now), bench (latest fab bench-net) or Mbit/s (default measure)",
    "compute_s": "compute-only s/update (default: the latest fab bench-step of the same model)",
    "precision": "fp32, fp16 or bf16 (bytes per gradient element; default as fab train: fp16 on GPU hosts)",
    "update_freq": "gradient accumulation K",
    "max_update": "updates of the whole run (default: the preset's)",
    "overlap": "fraction of compute the all-reduce hides behind (default: 0 for legacy_ddp, "
               "bench-step's fit for pytorch_ddp)",
    "json": "print the figures as JSON",
})
@cluster_task
def predict(c, hosts, preset="tiny", set=None, dataset="synthetic", link="measure", compute_s=None,
            precision=None, update_freq=1, max_update=None, overlap=None, json=False):
    """Predict s/update, the run's hours, network-bound or not, the update-freq for 90% (exit 3 if network-bound)."""
    precision = precision or command.default_precision([h.gpus for h in hosts])  # as fab train
    import json as json_module

    from benchmarks import predict as bench_predict

    verdict = bench_predict.predict_for(
        hosts, preset, [o for o in (set or "").split(",") if o], dataset, str(link),
        compute_s=float(compute_s) if compute_s is not None else None, precision=precision,
        update_freq=int(update_freq), max_update=int(max_update) if max_update else None,
        overlap=float(overlap) if overlap is not None else None)
    if json:
        print(json_module.dumps(verdict.as_dict(), indent=1, default=str))
    else:
        console.print("\n".join(verdict.lines), markup=False)
    if verdict.network_bound:
        sys.exit(3)


@task(help={"run": "run id (default: the latest)",
            "link_mbps": "the link's speed when no bench-net result exists (default: the inventory's)"})
@cluster_task
def report(c, hosts, run=None, link_mbps=None):
    """Collect logs, samples, benchmarks and checkpoints from every host into reports/RUN/index.html."""
    from train.report import collect
    from train.report import page as report_page

    the_run = launch.Run.load(run)
    with console.status(f"collecting {the_run.run_id} from {', '.join(the_run.hosts)}"):
        problems = collect.collect(the_run, hosts)
    for name, problem in problems.items():
        console.print(f"[yellow]{name}: {problem}[/]")
    expected = link_mbps or hosts[0].vars.get("network_expected_mbps")
    with console.status("plots and answers"):
        page, lines = report_page.build_report(the_run.local_dir, float(expected) if expected else None)
    for line in lines:
        console.print(line)
    console.print(f"[bold]report:[/] {page}")
