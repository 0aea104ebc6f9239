"""tandem's per-run jobs on the cluster. `fab -l` lists them, `fab --help TASK` explains one.

Hosts come from the Ansible inventory (fabric.yaml `inventory`, or FABRIC_INVENTORY=...);
`--hosts a,b` picks some of them, in that order (the first is rank 0), else the
inventory's `cluster` group. Each task: its options, a docstring, one call into train/ or
benchmarks/, its output.

Options are long only, and each value is checked before anything reaches a host (train.cli.options);
the exit status says how a task ended: 0 done, 1 failed, 2 bad input, 3 refused by a check that an
--accept-... option overrides (docs/cli.md).
"""

import sys

import fabric.main

from train import errors as exits
from train.agent.measure.nccl_sockets import option as nccl_sockets_option
from train.cli import options
from train.cli import version as tandem_version
from train.cli.executor import cluster_task, console, ends_as_documented, errors, known_hosts, task
from train.hosts.remote import venv_of
from train.run import logtail, offsite, pick, session, stopping
from train.run import status as run_status
from train.run.command import parse_signature
from train.run.evaluate import evaluate as evaluate_run

ends_as_documented(fabric.main.program)  # an unknown option exits 2, Ctrl-C 130, a closed pipe quietly

RUN_HELP = "run id (default: the run the hosts started last)"


@task
def version(c):
    """Say tandem's version and the checkout's commit (`fab --version` says Fabric's)."""
    print(tandem_version.line())


@task
@cluster_task
def info(c, hosts):
    """Show every host's name, kernel, CPUs and memory, asked of all hosts in parallel.

    Exit 1 naming a host that cannot be reached."""
    run_status.show_cluster(hosts, console)


@task(help={
    "name": "dataset name on the hosts (/data/tandem/datasets/NAME); default: synthetic, sample or wmt16",
    "source": "a directory here with {train,valid,test}.{en,de}: uploaded once, to rank 0's host",
    "wmt16": "download the WMT16 en-de corpora (resumable, checksummed)",
    "vocab_size": "joint sentencepiece vocabulary size (default 32000; the synthetic corpus uses 1000)",
    "lines": "synthetic corpus: training pairs (default 20000)",
})
@cluster_task(checks=[options.one_corpus], name=options.name, source=options.directory,
              vocab_size=options.whole(2), lines=options.whole(1))
def prepare_data(c, hosts, name=None, source=None, wmt16=False, vocab_size=None, lines=20000):
    """Prepare a corpus (clean, joint subwords, fairseq binaries) on rank 0's host, then copy it host to host."""
    from train.data.prepare import prepare_data as prepare  # numpy and the corpus code: only here

    prepare(hosts, console, name=name, source=source, wmt16=wmt16, vocab_size=vocab_size, lines=lines)


@task(help={
    "preset": options.PRESET.help + "; a resumed run keeps its own (another one: --new)",
    "dataset": options.DATASET.help + "; a resumed run keeps its own (another one: --new)",
    "run": "run id (default: the latest run, resumed from its last checkpoint)",
    "new": "start a new run even if the latest can be resumed",
    "update_freq": "gradient accumulation: updates every K batches (divides traffic per sample by K); default: "
                   "derived with max_tokens from the preset's tokens per update and the GPUs' memory",
    "dry_run": "print every host's command and check them, start nothing",
    "detach": "start and return without following",
    "accept_slow_network": "start even when the network would take most of each step, or fewer hosts would "
                           "train faster (see fab predict)",
    "elastic": "the hosts' keepers go on without a lost host and take it back when it returns (default); "
               "--no-elastic: they stop the run instead",
    "rejoin": "start the keeper of every host the run lost whose own does not run (a replaced VM): the run "
              "takes it back at its next checkpoint; a stopped run resumes on them; --hosts naming them does the same",
    "replace": "OLD=NEW: a new VM (NEW, in the inventory, provisioned, the dataset prepared) takes the place of "
               "the run's host OLD (a spot VM replaced): the keepers take the new start, from the newest checkpoint",
    "backup": "the controller's copy of rank 0's newest checkpoint while fab train follows (the last resort: the "
              "hosts hold each other's): every:MIN (at most every MIN minutes; default every:60), last (when the run "
              "ends), off; refused with --detach (nothing follows)",
    "resume_from": "URL of the store the run's hosts copied checkpoints to (s3://BUCKET/PREFIX, gs://..., a "
                   "directory, sftp://...): every VM gone, the run goes on on --hosts from its newest copy whose "
                   "sha256 matches (--run names it when the store holds several; URL/RUN/uN: that copy), its batch "
                   "derived again for them",
    "checkpoints_to": "copy checkpoints off the cluster, uploaded by rank 0's host: s3://BUCKET/PREFIX (or an "
                      "S3-compatible store: endpoint_url in the hosts' ~/.aws/config), gs://BUCKET/PREFIX, a directory "
                      "on every host (/mnt/share/runs), sftp://[user@]host[:port]/path; credentials from each host, "
                      "never in the URL; checked from every host first (exit 3 naming one that cannot write); "
                      "a resumed run keeps its own, off drops it",
    "checkpoints_every": "minutes between checkpoint_last's copies off the cluster (default 30; checkpoint_best "
                         "goes when it changes)",
})
@cluster_task(checks=[options.hosts_described, options.resumable_run, options.precision_fits_hosts],
              preset=options.PRESET, set=options.SET, dataset=options.DATASET, run=options.name,
              update_freq=options.whole(1), precision=options.PRECISION, port=options.PORT, comm=options.COMM,
              backup=options.backup, replace=options.replacement, checkpoints_to=options.checkpoints_to,
              checkpoints_every=options.minutes, resume_from=offsite.store_url)
def train(c, hosts, preset=None, set=None, dataset=None, run=None, new=False, update_freq=None,
          precision=None, port=29500, dry_run=False, detach=False, accept_slow_network=False, elastic=True,
          comm=None, rejoin=False, backup=None, replace=None, resume_from=None, checkpoints_to=None,
          checkpoints_every=None):
    """Preflight every host, start fairseq on all of them at once (torchrun), follow it; again to resume.

    Exit 3 when the network check refuses (--accept-slow-network overrides it)."""
    request = session.TrainRequest(
        preset=preset, overrides=tuple(set or ()), dataset=dataset, run_id=run, new=new,
        update_freq=update_freq, precision=precision, port=port,
        dry_run=dry_run, detach=detach,
        accept_slow_network=accept_slow_network, elastic=elastic, comm=comm, rejoin=rejoin, backup=backup,
        replace=replace, resume_from=resume_from, checkpoints_to=checkpoints_to,
        checkpoints_every=checkpoints_every)
    if not (new or run or resume_from):  # the latest run to resume: the one the hosts started last
        pick.resumable(hosts, console.print)
    session.train(request, hosts, known_hosts(c), console)


@task(help={"run": RUN_HELP,
            "json": "print it as JSON: the run's state and update, per host its ranks, state, update, loss, "
                    "s/update, last log line and why it could not be reached"})
@cluster_task(run=options.name)
def status(c, hosts, run=None, json=False):
    """Per host: the ranks it runs, are they running, the last update, loss and s/update; why it stopped if it did.

    Exit 1 naming a host that cannot be reached."""
    run_status.show(pick.find(run, hosts, (errors if json else console).print), hosts, console, as_json=json)


@task(help={"run": RUN_HELP, "every": "seconds between refreshes (default 2)",
            "link_mbps": "the link's speed when the run measured none (default: the inventory's)",
            "once": "print one frame and return (no full screen)"})
@cluster_task(run=options.name, every=options.seconds, link_mbps=options.mbps)
def watch(c, hosts, run=None, every=2.0, link_mbps=None, once=False):
    """Live full-screen view of a run: per host GPUs, NIC against the link, CPU; loss, s/update, ETA, verdict."""
    from dataclasses import asdict

    from train.watch.live import watch as watch_run

    the_run = pick.find(run, hosts, console.print)
    chosen = the_run.hosts_of(hosts)
    expected = link_mbps or chosen[0].var("network_expected_mbps")
    watch_run(asdict(the_run), the_run.remote_dir, chosen, console, every_s=every,
              link_mbps=float(expected) if expected else None, once=bool(once))


@task(help={"run": RUN_HELP, "port": "the local port to open it on (default 6006)"})
@cluster_task(run=options.name, port=options.port)
def tensorboard(c, hosts, run=None, port=6006):
    """TensorBoard of a run on rank 0's host (127.0.0.1 there), forwarded over SSH to a local port; Ctrl-C stops it."""
    from train.watch import tensorboard as tb

    the_run = pick.find(run, hosts, console.print)
    host = the_run.hosts_of(hosts)[0]  # rank 0 writes the run's TensorBoard logs
    tb.serve(host, venv_of(host), the_run.remote_dir, port, lambda line: console.print(line, markup=False))


@task(help={"run": RUN_HELP, "lines": "lines per host (default 20)",
            "follow": "go on printing every host's new lines, each prefixed with its host, until Ctrl-C"})
@cluster_task(run=options.name, lines=options.whole(1))
def logs(c, hosts, run=None, lines=20, follow=False):
    """Tail every host's training log, or follow them all (--follow).

    Exit 1 naming a host that cannot be reached."""
    the_run = pick.find(run, hosts, console.print)
    if follow:
        logtail.follow(the_run, hosts, lines, console)
    else:
        run_status.show_logs(the_run, hosts, lines, console)


@task(help={"run": RUN_HELP})
@cluster_task(run=options.name)
def stop(c, hosts, run=None):
    """Stop every rank on every host and confirm none is left; say the run stopped and its hosts.

    Exit 1 naming a host that still trains: the run's ranks, or (without --run) another run's. With
    --checkpoints-to it says where the newest copy off the cluster is, or that the final one still uploads."""
    the_run = pick.find(run, hosts, console.print)
    stopping.stop(the_run, hosts, named=bool(run), say=lambda line: console.print(line, markup=False))
    if copied := offsite.after_stop(the_run, the_run.hosts_of(hosts)):
        console.print(copied, markup=False)


@task(help={"run": RUN_HELP, "checkpoint": "checkpoint file name (default checkpoint_best.pt)"})
@cluster_task(run=options.name, checkpoint=options.checkpoint)
def evaluate(c, hosts, run=None, checkpoint="checkpoint_best.pt"):
    """Translate the test set with the best checkpoint on the first host and print SacreBLEU."""
    the_run = pick.find(run, hosts, console.print)
    bleu = evaluate_run(the_run, hosts, checkpoint, console)
    signature = parse_signature((the_run.local_dir / "bleu.json").read_text())
    console.print(f"[bold]SacreBLEU {bleu:.2f}[/] ({the_run.run_id}, {checkpoint}, {the_run.dataset} test set; "
                  f"detokenized output against the raw reference)\n  signature: {signature or 'none given'}")


# ---- benchmarks (benchmarks/*.py, the cost model train/plan/predict.py; issue 5) ----


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
    "nccl_sockets": "NCCL's TCP sockets per peer for this run, e.g. 16 or 4x4 (threads x sockets), or none "
                    "(NCCL's defaults); default: what provisioning wrote from iperf3's stream count",
})
@cluster_task(checks=[options.sizes_in_order, options.hosts_answer], min_size=options.size, max_size=options.size,
              iters=options.whole(1), budget_s=options.seconds, iperf_seconds=options.seconds,
              threshold=options.fraction, port=options.port, nccl_sockets=nccl_sockets_option)
def bench_net(c, hosts, min_size="1M", max_size=None, iters=5, budget_s=20, iperf_seconds=3, threshold=None,
              port=29501, nccl_sockets=None):
    """iperf3 between every pair of hosts, then an all_reduce sweep (NCCL on GPU hosts, gloo on CPU ones).

    Prints an nccl-tests table with busbw / link, and NCCL's busbw beside iperf3's Gbit/s."""
    from benchmarks import net

    net.run(hosts, min_size=min_size, max_size=max_size, iters=iters, budget_s=budget_s, iperf_seconds=iperf_seconds,
            threshold=threshold, port=port, nccl_sockets=nccl_sockets, say=_say)


@task(help={
    "rates": "tc rates to cap the cluster link at, comma-separated (default 10mbit,100mbit,1gbit,none)",
    "updates": "updates measured per rate and cycle (default 8)",
    "cycles": "times the rates are gone through, interleaved in one run (default 2)",
    "skip": "updates after each cap change left out, to settle (default 1)",
    "comm": options.COMM_LIST.help + " (default sync), or auto (fab train's pick at each capped rate); several "
            "are compared side by side at the end",
})
@cluster_task(checks=[options.precision_fits_hosts, options.overrides_fit_preset, options.hosts_answer],
              rates=options.rates, preset=options.PRESET, set=options.SET_TEXT, dataset=options.DATASET,
              updates=options.whole(1), cycles=options.whole(1), skip=options.whole(0), port=options.PORT,
              precision=options.PRECISION, comm=options.COMM_LIST)
def bench_step(c, hosts, rates="10mbit,100mbit,1gbit,none", preset="tiny", set=None, dataset="synthetic",
               updates=8, cycles=2, skip=1, port=29500, precision=None, comm="sync"):
    """Train on all hosts while capping the link at each rate (tc): s/update, wps, bytes sent; table + plot."""
    from benchmarks import step

    step.run(hosts, rates=rates, preset=preset, set_text=set, dataset=dataset, updates=updates, cycles=cycles,
             skip=skip, port=port, precision=precision, comm=comm, say=_say)


@task(help={
    "dataset": "dataset whose dictionary sizes the embeddings (default synthetic)",
    "link": "measure (iperf3 now), bench (latest fab bench-net) or Mbit/s (default measure)",
    "compute_s": "compute-only s per batch of the derived max_tokens (default: the latest fab bench-step of the "
                 "same model, scaled per token to that batch)",
    "precision": "fp32, fp16 or bf16 (bytes per gradient element; default as fab train: fp16 on GPU hosts)",
    "update_freq": "gradient accumulation K (default: as fab train derives it: the preset's tokens per update, "
                   "max_tokens as the GPUs' memory holds)",
    "max_update": "updates of the whole run (default: the preset's)",
    "overlap": "fraction of compute the all-reduce hides behind (default: 0 for legacy_ddp, "
               "bench-step's fit for pytorch_ddp)",
    "json": "print the figures as JSON",
    "run": "price what is left of this run (its preset, options and strategy; from its newest known update, e.g. "
           "after --resume-from) on --hosts; the other model options are then its own",
})
@cluster_task(checks=[options.overrides_fit_preset, options.hosts_answer], preset=options.PRESET,
              set=options.SET_TEXT, dataset=options.name, link=options.link, compute_s=options.seconds,
              precision=options.precision, update_freq=options.whole(1), max_update=options.whole(1),
              overlap=options.fraction, comm=options.COMM, run=options.name)
def predict(c, hosts, preset="tiny", set=None, dataset="synthetic", link="measure", compute_s=None,
            precision=None, update_freq=None, max_update=None, overlap=None, json=False, comm="sync", run=None):
    """Predict s/update, hours and dollars of every host subset x --comm, and say the verdict.

    Exit 3 when the network would dominate, or when fewer hosts would be faster."""
    import json as json_module

    from train.plan import predict as plan

    model = {"preset": preset, "set_text": set, "dataset": dataset, "comm": comm, "max_update": max_update}
    if run:
        from train.run.moved import rest_of

        model, said = rest_of(run)
        console.print(said, markup=False)
    verdict = plan.for_options(hosts, link_source=link, compute_s=compute_s, precision=precision,
                               update_freq=update_freq, overlap=overlap, **model)
    if json:
        print(json_module.dumps(verdict.as_dict(), indent=1, default=str))
    else:
        console.print("\n".join(verdict.lines), markup=False)
        if verdict.comparison is not None:
            console.print(verdict.comparison.table())
    if verdict.network_bound or verdict.fewer_hosts_faster:
        sys.exit(exits.REFUSED)


@task(help={"run": RUN_HELP,
            "link_mbps": "the link's speed when no bench-net result exists (default: the inventory's)"})
@cluster_task(run=options.name, link_mbps=options.mbps)
def report(c, hosts, run=None, link_mbps=None):
    """Collect logs, samples, benchmarks and checkpoints from every host into reports/RUN/index.html."""
    from train.report.collect import report as make_report

    the_run = pick.find(run, hosts, console.print)
    copies, cost = run_status.for_report(the_run, hosts)
    make_report(the_run, hosts, link_mbps, console, offsite=copies, cost=cost)


def _quality_entries(text):
    """bench-quality's --comm, checked as it reads it (update-freq:K among the strategies)."""
    from benchmarks import quality

    quality.parse_entries(text)
    return text


@task(help={
    "comm": options.COMM_LIST.help + ", update-freq:K; sync always runs first, the reference (default "
            "sync,fp16,local-sgd:16)",
    "set": options.SET.help + " (not max_update: --updates sets it)",
    "updates": "updates of every run, rounded up to a multiple of each H and K (update-freq:K runs N/K; default 300)",
    "bleu": "also translate the test set with each final model (SacreBLEU, as fab evaluate); --no-bleu: loss only",
    "timeout": "seconds each run may take (default 3600)",
})
@cluster_task(checks=[options.precision_fits_hosts, options.overrides_fit_preset], comm=_quality_entries,
              preset=options.PRESET, set=options.SET_TEXT, dataset=options.DATASET, updates=options.whole(1),
              port=options.PORT, precision=options.PRECISION, timeout=options.seconds)
def bench_quality(c, hosts, comm="sync,fp16,local-sgd:16", preset="tiny", set=None, dataset="synthetic",
                  updates=300, port=29500, precision=None, bleu=True, timeout=3600):
    """Train once per strategy for the same samples: final valid loss (and BLEU) against sync's; table + JSON."""
    from benchmarks import quality

    quality.run(hosts, comm=comm, preset=preset, set_text=set, dataset=dataset, updates=updates, port=port,
                precision=precision, bleu=bleu, timeout=timeout, say=_say)


# ---- a newcomer's own hosts (train/onboard/init.py, train/onboard/check.py; issue 35) ----


@task(help={
    "hosts_at": "the hosts' addresses (as SSH reaches them), comma-separated, rank 0's first; ADDRESS:PORT for "
                "a host's own SSH port",
    "port": "every host's SSH port (default 22) but those --hosts-at gives with theirs",
    "user": "the login user, with passwordless sudo (ubuntu on Ubuntu images, debian on Debian)",
    "key": "the SSH private key file (default: ssh's own keys and agent)",
    "names": "the hosts' names in tandem, comma-separated (default gpu1,gpu2,...)",
    "gpus": "GPUs each host has (default: as many as each shows, nvidia-smi's or its PCI bus's; 0: CPU hosts)",
    "cluster_at": "where the hosts reach each other (private addresses), comma-separated, as --hosts-at "
                  "(default: found on each host, the source of its route toward its peers' private addresses)",
    "data_device": "the attached volume for /data on every host (e.g. /dev/nvme1n1), or none (default: /data on "
                   "the root disk)",
    "hourly_usd": "what one host costs per hour, US dollars (fab predict and fab status show dollars with it)",
    "known_hosts": "a known_hosts file with the hosts' keys (default ~/.ssh/known_hosts): fab and Ansible check them",
    "vars": "any other of tandem's host variables (docs/inventory.md), comma-separated: "
            "--vars network_expected_mbps=25000,data_volume_min_free_gb=50",
    "out": "the inventory file to write, in a directory that exists (default inventory/mine.yml, the one fab "
           "reads when FABRIC_INVENTORY is not set)",
    "force": "overwrite --out when it exists",
    "check": "write nothing: check the inventory fab reads (FABRIC_INVENTORY, else fabric.yaml's inventory/mine.yml)",
    "from_": "another laptop's: rebuild the inventory and the cluster key from one provisioned host (ADDRESS or "
             "ADDRESS:PORT; with --user, --key): its /etc/tandem/cluster.json",
})
def init(c, hosts_at=None, user=None, key=None, names=None, gpus=None, cluster_at=None, data_device=None,
         hourly_usd=None, known_hosts=None, vars=None, out=None, force=False, check=False, port=None, from_=None):
    """Write an inventory for your hosts (or --check yours), then check each: SSH, sudo, OS, Python, GPUs, NIC, disk.

    One table, each problem with its fix under it. Exit 0 when every host passes, 1 when one fails,
    2 for bad input (an address, a missing key file, an existing --out without --force)."""
    from train.cli.executor import say_error
    from train.cluster import ClusterError
    from train.errors import BAD_INPUT, FAILED, OptionError
    from train.onboard import init as inventory_init

    try:
        code = inventory_init.init(console, c.config.get("inventory"), check=check, out=out, force=force,
                                   from_host=from_, hosts_at=hosts_at, user=user, key=key, names=names,
                                   cluster_at=cluster_at, gpus=gpus, data_device=data_device, hourly_usd=hourly_usd,
                                   known_hosts=known_hosts, vars=vars, port=port)
    except OptionError as err:
        say_error(err)
        code = BAD_INPUT
    except ClusterError as err:  # an inventory tandem cannot read: a value of the wrong type, no hosts
        say_error(err, console)
        code = FAILED
    sys.exit(code)
