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

from train.cluster import ClusterError, inventory_path, load_hosts, run_all, select
from train.data import corpus, distribute, download
from train.report import logparse
from train.run import command, launch, presets
from train.run import rejoin as rejoining
from train.run.follow import describe, follow, why_stopped_early
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
    if prepared.vocab_note:
        console.print(f"[yellow]note:[/] {prepared.vocab_note}")
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
        given = [h.name for h in hosts]
        grows = set(existing.hosts) < set(given) and set(given) - set(existing.hosts) <= set(
            rejoining.lost_hosts(existing.members, existing.hosts))  # hosts it lost, back: train grows to them
        if existing.hosts != given and not grows:
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
    "elastic": "when a host is lost, go on from the last checkpoint on the hosts left (default; --no-elastic stops)",
    "comm": "how ranks share updates: sync (default), fp16 (compressed gradients), local-sgd:H (average every H "
            "updates), auto (the least invasive that reaches 90% on the measured link; see fab predict)",
    "rejoin": "grow the run back to every host it lost (its first membership): at its next checkpoint if it is "
              "training, else resume on them; --hosts naming hosts it lost does the same",
})
@cluster_task
def train(c, hosts, preset="tiny", set=None, dataset="synthetic", run=None, new=False, update_freq=1,
          precision=None, port=29500, dry_run=False, detach=False, accept_slow_network=False, elastic=True,
          comm=None, rejoin=False):
    """Preflight every host, start fairseq on all of them at once (torchrun), follow it; again to resume."""
    known = load_hosts(inventory_path(c.config.get("inventory")))  # hosts a run lost can come back from
    if rejoin:
        hosts = _rejoin_hosts(known, run)
    precision = precision or command.default_precision([h.gpus for h in hosts])
    the_run, resuming = _pick_run(hosts, run, new, preset, set, dataset, port, update_freq, precision)
    joining = [h for h in hosts if h.name not in the_run.hosts] if resuming else []
    current = the_run.hosts_of(hosts) if joining else hosts
    if joining and not dry_run and any(s.running for s in launch.states(the_run, current)):
        _grow_running(the_run, current, joining, known, detach, elastic)
        return
    if joining:  # a stopped run, resumed on more hosts: the membership grows from its checkpoint
        names, the_run.update_freq = rejoining.membership_after(the_run, [h.name for h in joining])
        hosts = [next(h for h in hosts if h.name == n) for n in names]
    if comm and comm != "auto":
        _set_comm(the_run, comm, resuming)
    elif comm == "auto" and resuming:  # its strategy was chosen when it started: a resume keeps it
        console.print(f"{the_run.run_id} goes on with --comm {the_run.comm} (chosen when it started)")
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
    the_run.link_mbps = _network_check(the_run, hosts, accept_slow_network, auto=comm == "auto" and not resuming)
    if resuming:
        copy = launch.share_checkpoint(the_run, [*current, *joining])  # from its rank 0: a joiner's copy is stale
        if copy is not None:
            console.print(f"resuming {the_run.run_id} from update {launch.checkpoint_update(copy)} "
                          "(checkpoint copied to every host)")
        if joining:
            at = launch.checkpoint_update(copy) if copy else 0
            console.print(f"[cyan]{rejoining.record(the_run, [h.name for h in joining], at)}[/]")
    the_run.save()
    launch.start(the_run, hosts)
    from train.run import interval  # bounded loss: what a resume may redo

    every, step = interval.save_interval(the_run), interval.measured_step(the_run, hosts, resuming)
    console.print(f"[green]✓[/] {the_run.run_id} started on {len(hosts)} hosts "
                  f"({the_run.preset}; {interval.start_phrase(every, step)}; "
                  f"logs {the_run.remote_dir}/train.log on each)")
    if over := interval.over_bound(every, step):
        console.print(f"[yellow]{over}[/]")
    if not detach:
        _follow_to_the_end(the_run, hosts, elastic, known)


def _follow_to_the_end(the_run, hosts, elastic, known):
    why = why_stopped_early(_summarize(follow(the_run, hosts, elastic=elastic, known=known)))
    if why:
        console.print(f"[red]{why}[/]")
        sys.exit(1)


def _rejoin_hosts(known, run_id):
    """`--rejoin`: the run's hosts and every host it lost that the inventory has, in the order they
    first trained in (train.run.rejoin)."""
    the_run = launch.Run.load(run_id)
    lost = [n for n in rejoining.lost_hosts(the_run.members, the_run.hosts) if n in {h.name for h in known}]
    if not lost:
        raise ClusterError(f"{the_run.run_id} trains on {', '.join(the_run.hosts)} and lost no host the inventory "
                           "has: nothing to rejoin")
    return select(known, rejoining.grown_hosts(the_run.members, the_run.hosts, lost))


def _grow_running(the_run, current, joining, known, detach, elastic):
    """A run training on fewer hosts than asked: the joining hosts' preflight, then it grows at rank
    0's next checkpoint (train.run.rejoin.grow_once), then following as usual."""
    names = ", ".join(h.name for h in joining)
    console.print(f"{the_run.run_id} is training on {', '.join(h.name for h in current)}; "
                  f"{names} rejoin{'s' if len(joining) == 1 else ''} at its next checkpoint")
    grown = rejoining.grow_once(the_run, current, joining, say=lambda text: console.print(f"[cyan]{text}[/]"))
    if grown is None:
        console.print(f"{the_run.run_id} stopped before its next checkpoint; `fab train` resumes it on "
                      f"{', '.join(h.name for h in [*current, *joining])}")
        return
    if not detach:
        _follow_to_the_end(the_run, grown, elastic, known)


def _set_comm(the_run, comm, resuming):
    """The run's communication strategy; a resumed run keeps its own unless told otherwise."""
    from train.run.comm import CommError, Strategy

    try:
        chosen = str(Strategy.parse(comm))
    except CommError as err:
        raise ClusterError(str(err)) from None
    if resuming and chosen != the_run.comm:
        console.print(f"[yellow]{the_run.run_id} trained with --comm {the_run.comm}; it goes on with {chosen}[/]")
    the_run.comm = chosen


def _network_check(the_run, hosts, accept, auto=False):
    """The cost model on the measured link (benchmarks/predict.py): refuse a network-bound run unless
    accepted; with `auto`, pick the communication strategy from it (model.choose) and say why."""
    from benchmarks import predict as bench_predict
    from benchmarks.link import PeerUnreachable

    try:
        with console.status("measuring the link (iperf3) and predicting the step time"):
            verdict = bench_predict.for_run(the_run, hosts, comm="auto" if auto else None)
    except PeerUnreachable:
        raise  # the rendezvous would hang: not a check to skip
    except ClusterError as err:
        if auto:
            raise  # no figures to choose from: say how to get them rather than train sync
        console.print(f"[yellow]network check skipped:[/] {err}")
        return None
    if verdict is None:
        return None
    if auto and verdict.choice:
        the_run.comm, the_run.update_freq = verdict.choice.comm, verdict.choice.update_freq
        console.print(f"[green]--comm auto[/] chose {verdict.choice.flag()}")
    text = "\n  ".join(verdict.lines)
    if verdict.network_bound and not accept:
        better = (f"\n{verdict.choice.flag()} would reach {verdict.choice.prediction.efficiency:.0%} "
                  "(or --comm auto)" if verdict.choice and not auto else "")
        raise ClusterError(f"the network would take most of each step, nothing started:\n  {text}{better}\n"
                           "fix the link, choose a --comm strategy, or pass --accept-slow-network to train anyway")
    console.print("[yellow]network-bound, accepted (--accept-slow-network):[/]" if verdict.network_bound
                  else "[green]✓[/] network check:")
    console.print("  " + text, markup=False)
    return verdict.link_mbps


def _summarize(states):
    """Each rank's real state and last meaningful log line, then the run's state in one line."""
    rank0 = states[0].progress if states else None
    finished = bool(rank0 and rank0.finished)  # only rank 0 logs "done training"
    table = Table()
    for column in ("host", "rank", "state", "update", "loss", "s/update"):
        table.add_column(column)
    table.add_column("last log line", overflow="fold")  # folded, never cut with an ellipsis
    for rank, s in enumerate(states):
        p = s.progress if rank == 0 else None  # only rank 0 logs updates
        state = s.describe(finished)
        colour = {"running": "", "finished": "green", "stopped by fab stop": "yellow"}.get(state, "red")
        table.add_row(s.name, str(rank), f"[{colour}]{state}[/]" if colour else state, str(p.update) if p else "-",
                      f"{p.loss:.3f}" if p and p.loss is not None else "-",
                      f"{p.seconds_per_update:.2f}" if p and p.seconds_per_update else "-",
                      logparse.message(s.tail[-1])[:70] if s.tail else (s.error or "")[:70])
    console.print(table)
    console.print(run_state_line(states))
    return states


def run_state_line(states) -> str:
    """The run in one line: running at update N, finished, stopped by fab stop, or why it ended early."""
    rank0 = states[0].progress if states else None
    last = f"{rank0.max_update:,}" if rank0 and rank0.max_update else "?"
    at = f"update {rank0.update:,}/{last}" if rank0 else "no update yet"
    if any(s.running for s in states):
        return f"running, {at}"
    if rank0 and rank0.finished:
        return f"[green]finished[/], {at}"
    died = [s for s in states if (s.ended and not s.stopped_by_user) or not s.reachable]
    if not died and any(s.stopped_by_user for s in states):
        return f"[yellow]stopped by fab stop[/] at {at}; `fab train` resumes it"
    return f"[red]ended early[/]: {why_stopped_early(states)}"


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
        if s.reachable and not s.running and s.tail and not finished and not s.stopped_by_user:
            console.print(f"[red]{s.name} {s.describe(finished)}[/]; its last log lines:")
            for line in s.tail:
                console.print(f"  {line}")
    if any(not s.reachable for s in states):
        sys.exit(1)


@task(help={"run": "run id (default: the latest)", "every": "seconds between refreshes (default 2)",
            "link_mbps": "the link's speed when the run measured none (default: the inventory's)",
            "once": "print one frame and return (no full screen)"})
@cluster_task
def watch(c, hosts, run=None, every=2.0, link_mbps=None, once=False):
    """Live full-screen view of a run: per host GPUs, NIC against the link, CPU; loss, s/update, ETA, verdict."""
    from dataclasses import asdict

    from train.watch.live import watch as watch_run

    the_run = launch.Run.load(run)
    chosen = the_run.hosts_of(hosts)
    expected = link_mbps or chosen[0].vars.get("network_expected_mbps")
    watch_run(asdict(the_run), the_run.remote_dir, chosen, console, every_s=float(every),
              link_mbps=float(expected) if expected else None, once=bool(once))


@task(help={"run": "run id (default: the latest)", "port": "the local port to open it on (default 6006)"})
@cluster_task
def tensorboard(c, hosts, run=None, port=6006):
    """TensorBoard of a run on rank 0's host (127.0.0.1 there), forwarded over SSH to a local port; Ctrl-C stops it."""
    from train.watch import tensorboard as tb

    the_run = launch.Run.load(run)
    host = the_run.hosts_of(hosts)[0]  # rank 0 writes the run's TensorBoard logs
    tb.serve(host, launch.venv_of(host), the_run.remote_dir, int(port), lambda line: console.print(line, markup=False))


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
    "comm": "communication strategies, comma-separated, one training job each: sync (default), fp16, "
            "local-sgd:H, auto (fab train's pick at each capped rate); several are compared side by side at the end",
})
@cluster_task
def bench_step(c, hosts, rates="10mbit,100mbit,1gbit,none", preset="tiny", set=None, dataset="synthetic",
               updates=8, cycles=2, skip=1, port=29500, precision=None, comm="sync"):
    """Train on all hosts while capping the link at each rate (tc): s/update, wps, bytes sent; table + plot."""
    from benchmarks import net as bench_net
    from benchmarks import step

    precision = precision or command.default_precision([h.gpus for h in hosts])  # as fab train

    try:
        rate_list = step.parse_rates(rates)
    except ValueError as err:
        raise ClusterError(str(err)) from err
    from train.run.comm import CommError, Strategy

    names = [x.strip().lower() for x in str(comm).split(",") if x.strip()]
    overrides = [o for o in (set or "").split(",") if o]
    if "auto" in names:
        picked = _auto_per_rate(hosts, rate_list, preset, overrides, dataset, precision)
        names = list(dict.fromkeys(n for name in names for n in (picked if name == "auto" else [name])))
    try:
        strategies = [str(Strategy.parse(x)) for x in names]
    except CommError as err:
        raise ClusterError(str(err)) from None
    reports = []
    for strategy in strategies:
        report = step.bench_step(hosts, rate_list, preset=preset, overrides=overrides,
                                 dataset=dataset, updates=int(updates), cycles=int(cycles), skip=int(skip),
                                 port=int(port), precision=precision, comm=strategy, say=_say)
        console.print(step.summary(report), markup=False)
        reports.append(report)
    if len(reports) > 1:
        console.print(step.compare(reports), markup=False)
        png = step.REPORT_DIR / f"step-compare-{reports[-1]['timestamp'].replace(':', '')}.png"
        step.plot_compare(reports, png, quality=bench_net.latest("quality"))
        console.print(f"plot {png}", markup=False)


def _auto_per_rate(hosts, rates, preset, overrides, dataset, precision) -> list[str]:
    """bench-step's `--comm auto`: what fab train --comm auto would pick at each capped rate (the
    predict model; C from the latest bench-step of this model), one job per distinct pick."""
    from benchmarks import link as bench_link
    from benchmarks import predict as bench_predict

    capped = [r for r in rates if bench_link.rate_bits(r)] or ["measure"]
    picked = []
    for rate in capped:
        where = "measure" if rate == "measure" else f"{bench_link.rate_bits(rate) / 1e6:g}"
        # without a compute-only time predict_for says how to get one (benchmarks.predict.assess)
        choice = bench_predict.predict_for(hosts, preset, overrides, dataset, where, precision=precision,
                                           comm="auto").choice
        if choice.update_freq > 1:
            raise ClusterError(f"--comm auto at {rate} picks {choice.flag()}: bench-step measures --comm "
                               f"strategies only; measure that with fab train or fab bench-quality "
                               f"--comm update-freq:{choice.update_freq}")
        console.print(f"--comm auto at {rate}: {choice.comm} ({choice.prediction.efficiency:.0%} predicted)",
                      markup=False)
        picked.append(choice.comm)
    return list(dict.fromkeys(picked))


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
    "comm": "sync (default), fp16, local-sgd:H, or auto: the least invasive that reaches 90% scaling efficiency",
})
@cluster_task
def predict(c, hosts, preset="tiny", set=None, dataset="synthetic", link="measure", compute_s=None,
            precision=None, update_freq=1, max_update=None, overlap=None, json=False, comm="sync"):
    """Predict s/update, the run's hours, network-bound or not, the update-freq for 90% (exit 3 if network-bound)."""
    precision = precision or command.default_precision([h.gpus for h in hosts])  # as fab train
    import json as json_module

    from benchmarks import predict as bench_predict

    verdict = bench_predict.predict_for(
        hosts, preset, [o for o in (set or "").split(",") if o], dataset, str(link),
        compute_s=float(compute_s) if compute_s is not None else None, precision=precision,
        update_freq=int(update_freq), max_update=int(max_update) if max_update else None,
        overlap=float(overlap) if overlap is not None else None, comm=str(comm))
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


@task(help={
    "comm": "strategies, comma-separated, one fresh training run each: sync (always run: the reference), fp16, "
            "local-sgd:H, update-freq:K (default sync,fp16,local-sgd:16)",
    "preset": "the model (default tiny)",
    "set": "fairseq option overrides, comma-separated (not max_update: --updates sets it)",
    "dataset": "dataset on /data/tandem/datasets (default synthetic)",
    "updates": "updates of every run, rounded up to a multiple of each H and K (update-freq:K runs N/K; default 300)",
    "port": "rendezvous port (default 29500)",
    "precision": "fp32, fp16 or bf16 (the last two on GPU hosts); default as fab train",
    "bleu": "also translate the test set with each final model (SacreBLEU, as fab evaluate); --no-bleu: loss only",
    "timeout": "seconds each run may take (default 3600)",
})
@cluster_task
def bench_quality(c, hosts, comm="sync,fp16,local-sgd:16", preset="tiny", set=None, dataset="synthetic",
                  updates=300, port=29500, precision=None, bleu=True, timeout=3600):
    """Train once per strategy for the same samples: final valid loss (and BLEU) against sync's; table + JSON."""
    from benchmarks import quality

    precision = precision or command.default_precision([h.gpus for h in hosts])  # as fab train
    try:
        entries = quality.parse_entries(comm)
        quality.common_updates(int(updates), entries)
    except ValueError as err:
        raise ClusterError(str(err)) from err
    report = quality.bench_quality(hosts, entries, updates=int(updates), preset=preset,
                                   overrides=[o for o in (set or "").split(",") if o], dataset=dataset,
                                   port=int(port), precision=precision, bleu=bool(bleu), timeout=float(timeout),
                                   say=_say)
    console.print(quality.summary(report), markup=False)
