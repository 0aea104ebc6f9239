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

from train import data, distribute, launch, presets
from train.cluster import ClusterError, run_all
from train.follow import describe, follow
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
    with console.status(f"preparing {name}: clean, sentencepiece ({vocab}), fairseq-preprocess"):
        try:
            corpus = data.prepare(name, work, source=Path(source) if source else None, wmt16=wmt16,
                                  vocab_size=vocab, synthetic_train=int(lines))
        except data.DataError as err:
            raise ClusterError(str(err)) from err
    console.print(f"[green]✓[/] {name}: {corpus.train_lines:,} training pairs, {corpus.train_mb} MB of text, "
                  f"vocabulary {corpus.vocab_size}")
    with console.status(f"copying to {', '.join(h.name for h in hosts)} and checking checksums"):
        sums = distribute.upload(Path(corpus.bin_dir), name, hosts)
    console.print(f"[green]✓[/] identical on every host ({', '.join(sums)}): manifest "
                  f"{next(iter(sums.values()))[:12]}, at {launch.DATA_ROOT}/{name}")


def _pick_run(hosts, run_id, new, preset, overrides, dataset, port, update_freq, precision):
    """The run `fab train` acts on: the named one, else the latest (resumed), else a new one."""
    if not new:
        try:
            existing = launch.Run.load(run_id)
            if existing.hosts != [h.name for h in hosts]:
                raise ClusterError(f"run {existing.run_id} ran on {', '.join(existing.hosts)}, not "
                                   f"{', '.join(h.name for h in hosts)}: pass the same --hosts, or --new")
            extra = [o for o in (overrides or "").split(",") if o]
            if extra:  # e.g. a higher max_update to train on
                existing.overrides = [*existing.overrides, *extra]
                existing.resolved_preset()
            return existing, True
        except ClusterError:
            if run_id:
                raise
    if run_id is None or new:
        run_id = run_id if (run_id and new) else launch.new_run_id()
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
    "precision": "fp32, fp16 or bf16 (the last two on GPUs)",
    "port": "rendezvous port on the first host (default 29500)",
    "dry_run": "print every host's command and check them, start nothing",
    "detach": "start and return without following",
})
@cluster_task
def train(c, hosts, preset="tiny", set=None, dataset="synthetic", run=None, new=False, update_freq=1,
          precision="fp32", port=29500, dry_run=False, detach=False):
    """Preflight every host, start fairseq on all of them at once (torchrun), follow it; again to resume."""
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
    hosts = [h for h in hosts if h.name in the_run.hosts]
    states = _summarize(launch.states(the_run, hosts))
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
    results = run_all([h for h in hosts if h.name in the_run.hosts],
                      f"tail -n {int(lines)} {the_run.remote_dir}/train.log")
    for name, result in results.items():
        console.rule(name)
        console.print(result.stdout if not isinstance(result, Exception) else f"[red]unreachable: {result}[/]",
                      markup=False)


@task(help={"run": "run id (default: the latest)"})
@cluster_task
def stop(c, hosts, run=None):
    """Stop every rank on every host and confirm none is left (non-zero exit naming a host that won't stop)."""
    the_run = launch.Run.load(run)
    outcome = launch.stop(the_run, [h for h in hosts if h.name in the_run.hosts])
    said = {"stopped": "stopped", "killed": "killed (did not stop on SIGTERM)", "none": "was not running"}
    for name, what in outcome.items():
        console.print(f"{name}: {said.get(what, what)}; no training process left")


@task(help={"run": "run id (default: the latest)", "checkpoint": "checkpoint file name (default checkpoint_best.pt)"})
@cluster_task
def evaluate(c, hosts, run=None, checkpoint="checkpoint_best.pt"):
    """Translate the test set with the best checkpoint on the first host and print SacreBLEU."""
    from train import command

    the_run = launch.Run.load(run)
    host = hosts[0]
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
