"""A run's whole life as `fab train` drives it, in one place: pick the run (new, or the latest
resumed), grow it back to hosts it lost, choose how ranks communicate, preflight every host,
check the network against the cost model, share the checkpoint, start, follow to the end.

The fab task builds a `TrainRequest` from its options and calls `train` once.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace

from rich.markup import escape

from ..cluster import ClusterError, Host, placement, select
from ..errors import OptionError, Refused
from ..plan import batching, predict
from ..plan.link import PeerUnreachable
from ..reachability import require_answering
from ..recipe import presets, strategies
from ..recipe.record import Run, new_run_id
from ..recipe.strategies import CommError
from ..watch.render import plain
from . import checkpoints, command, keepers, launch, length, moved, offsite, pick, preflight, start
from . import rejoin as rejoining
from .follow import follow
from .status import closing_mfu, summarize, why_stopped_early


class StoppedEarly(ClusterError):
    """The run ended before its last update; the message names the culprit."""


@dataclass
class TrainRequest:
    """What `fab train` was asked (its options, parsed)."""

    preset: str | None = None  # None: tiny for a new run, its own for a resumed one
    overrides: tuple[str, ...] = ()
    dataset: str | None = None  # None: synthetic for a new run, its own for a resumed one
    run_id: str | None = None
    new: bool = False
    update_freq: int | None = None  # None: derived from the preset's tokens per update (train.plan.batching)
    precision: str | None = None  # None: fp16 on GPU hosts, fp32 on CPU hosts
    port: int = 29500
    dry_run: bool = False
    detach: bool = False
    accept_slow_network: bool = False
    elastic: bool = True
    comm: str | None = None  # a strategy, `auto`, or None: sync for a new run, its own for a resumed one
    rejoin: bool = False
    backup: str | None = None  # checkpoints.BackupPolicy: the controller's copy (None: DEFAULT_BACKUP)
    replace: str | None = None  # "OLD=NEW": a new VM takes a host's place in the run
    resume_from: str | None = None  # a store URL: the run moved to these hosts from its newest copy there
    checkpoints_to: str | None = None  # a URL off the cluster (train.run.offsite; None: a resumed run's own)
    checkpoints_every: float | None = None  # minutes between checkpoint_last's copies there


def train(request: TrainRequest, hosts: list[Host], known: list[Host], console) -> None:
    """`fab train`: start or resume a run on `hosts` (rank order) and follow it. `known`: every
    host of the inventory (a lost host can come back from there). Raises ClusterError naming host
    and cause for anything that stops it, StoppedEarly when the run ends before its last update."""
    backup_policy(request)  # a bad --backup is said before anything starts
    backup_while_detached(request, console)
    wandb_key_given(request.overrides, os.environ)
    if request.checkpoints_to and request.checkpoints_to.strip().lower() not in offsite.OFF:
        offsite.target_of(request.checkpoints_to)  # a malformed URL, or one with a secret: said before anything
    if request.rejoin:
        hosts = rejoin_hosts(known, request.run_id)
    if request.replace:
        hosts = replaced_hosts(known, request)
    if request.resume_from:
        request = moved_here(request, hosts, console)
    precision = request.precision or command.default_precision([h.gpus for h in hosts])
    run, resuming = pick_run(hosts, request, precision)
    offsite.choose(run, request.checkpoints_to, request.checkpoints_every)
    joining = [h for h in hosts if h.name not in run.hosts] if resuming else []
    current = run.hosts_of(hosts) if joining else hosts
    if joining and not request.replace and not request.dry_run and any(s.running for s in launch.states(run, current)):
        grow_running(run, current, joining, known, request, console)
        return
    if joining and not request.replace:  # a stopped run, resumed on more hosts: the membership grows
        names, run.update_freq = rejoining.membership_after(run, [h.name for h in joining], hosts[0].ranks)
        hosts = [next(h for h in hosts if h.name == n) for n in names]
    if request.comm and request.comm != "auto":
        set_comm(run, request.comm, resuming, console)
    elif request.comm == "auto" and resuming:  # its strategy was chosen when it started: a resume keeps it
        console.print(f"{run.run_id} goes on with --comm {run.comm} (chosen when it started)")
    if layout := preflight.layout_problems(hosts):  # before any command is built: it assumes equal hosts
        raise ClusterError("preflight failed, nothing started:\n  " + "\n  ".join(layout))
    if not any(h.gpus for h in hosts) and (ignored := command.switches_cpu_hosts_ignore(
            run.overrides, run.resolved_preset().options, [h.name for h in hosts])):
        console.print(f"[yellow]{ignored}[/]")
    rederive = not resuming or bool(request.resume_from)  # a moved run: the batch of its new world
    derived = batching.apply(run, hosts) if rederive else None  # GPU memory comes with the probe
    planned = start.resolve(run, hosts, derived, read_log=False)  # what can be known before the probe
    if request.dry_run:
        for host in hosts:
            console.print(f"[bold]{host.name}[/]: {escape(planned.commands[host.name])}")  # --set values: text
        console.print(f"{planned.said()}; ranks {placement(hosts)}")
        if planned.derived:
            console.print(f"batch derived: {planned.derived.line()}", markup=False)
        return
    with console.status("preflight: versions, data, GPUs, disk, port on every host"):
        answers = preflight.probe(run, hosts)
        run.gpu_name = next((g["name"] for g in answers.get(hosts[0].name, {}).get("gpus") or []), run.gpu_name)
        if rederive:
            derived = batching.apply(run, hosts, batching.gpu_gib_of(answers, hosts))
        run.data_manifest = answers.get(hosts[0].name, {}).get("data") or run.data_manifest
        problems = preflight.check(run, hosts, answers, adopting=bool(request.replace), need=planned.disk_need)
    if problems:
        raise ClusterError("preflight failed, nothing started:\n  " + "\n  ".join(problems))
    console.print(f"[green]✓[/] preflight passed on {', '.join(h.name for h in hosts)}")
    if run.checkpoints_to:
        with console.status(f"checking {run.checkpoints_to} from every host (a probe copy made, listed, fetched "
                            "back, deleted)"):
            rates = offsite.check(run, hosts)
        console.print(f"✓ {offsite.start_line(run)}", markup=False)
        if said := offsite.copy_time_line(rates, planned.disk_need.checkpoint_bytes if planned.disk_need else 0,
                                          run.checkpoints_every_min or offsite.DEFAULT_EVERY_MIN):
            console.print(f"  {said}", markup=False)
    verdict = network_check(run, hosts, request.accept_slow_network, console,
                            auto=request.comm == "auto" and not resuming)
    run.link_mbps = verdict.link_mbps if verdict else None
    if request.comm == "auto" and not resuming and (short := gpu_memory_after_choice(run, hosts, answers)):
        raise ClusterError("preflight failed after --comm auto's choice, nothing started:\n  " + "\n  ".join(short))
    cost = verdict.cost_line() if verdict else None
    if resuming:  # the keepers resolve the start from the newest whole checkpoint any host holds
        held = checkpoints.held(run, [*current, *joining])
        source = checkpoints.newest_holder([*current, *joining], held)
        finished_already(run, held[source.name] if source else
                         checkpoints.controller_update(run.local_dir / "checkpoints"))
        if source:
            console.print(f"resuming {run.run_id} from update {held[source.name]} (the newest checkpoint, on "
                          f"{source.name}; the hosts' keepers copy it to the others)")
        elif (backup := checkpoints.controller_update(run.local_dir / "checkpoints")) is not None:
            local = run.local_dir / "checkpoints"  # no host holds one: the controller's copy, to rank 0's host
            checkpoints.upload_checkpoints(hosts[:1], f"{run.remote_dir}/checkpoints", local, ["checkpoint_last.pt"],
                                           ["checkpoint_last.pt"])
            console.print(f"resuming {run.run_id} from update {backup} (no host holds a checkpoint: the "
                          f"controller's copy, uploaded to {hosts[0].name})")
        if joining and request.replace:
            console.print(f"[cyan]{replaced(run, request.replace, hosts, held[source.name] if source else 0)}[/]")
        elif joining:
            at = held[source.name] if source else 0
            console.print(f"[cyan]{rejoining.record(run, [h.name for h in joining], at, hosts[0].ranks)}[/]")
    run.ranks_per_host = hosts[0].ranks  # the report's rank layout (every host runs as many: layout_problems)
    run.order = [h.name for h in hosts]  # every host the keepers know, rank order
    resolved = start.resolve(run, hosts, derived, read_log=resuming)  # the batch, GPU and link are known now
    size, unread = length.tokens_of_probe(answers.get(hosts[0].name, {}), hosts[0]) \
        or length.read_dataset_tokens(hosts[0], run.data_dir)
    run.save()
    if unrecorded := pick.record_on_hosts(run, hosts):  # another controller finds the run there (train.run.pick)
        console.print(f"the run record is not on {'; '.join(unrecorded)}", style="yellow", markup=False)
    keepers.start(run, hosts, elastic=request.elastic, commands=resolved.commands)  # the hosts keep it, followed or not
    console.print(f"[green]✓[/] {run.run_id} started on {len(hosts)} hosts "
                  f"({run.preset}; {resolved.said(size, unread)}; " + (f"{cost}; " if cost else "")
                  + f"logs {run.remote_dir}/train.log on each)")
    if resolved.derived:
        console.print(f"batch derived: {resolved.derived.line()}", markup=False)
    if over := resolved.saves.warning():
        console.print(f"[yellow]{over}[/]")
    if not request.detach:
        follow_to_the_end(run, hosts, request, known, console)
    elif request.backup is None:
        console.print("detached: no checkpoint copy to this controller (--backup is taken while following); "
                      "the hosts copy each save to each other", markup=False)


def moved_here(request: TrainRequest, hosts: list[Host], console) -> TrainRequest:
    """`--resume-from URL`: the run's newest whole copy fetched onto rank 0's host, its record adopted
    here on `hosts`, its dataset on them; then the start is a resume (train.run.moved)."""
    if request.new or request.replace or request.rejoin:
        other = "--new" if request.new else "--replace" if request.replace else "--rejoin"
        raise OptionError("resume-from", f"resumes a run from its copy off the cluster; {other} does not go with it")
    if request.dry_run:
        raise OptionError("resume-from", "fetches a checkpoint onto the hosts: --dry-run does not go with it")
    asked = {"preset": request.preset, "dataset": request.dataset}  # a copy of another is refused by name
    run, _ = moved.adopt(request.resume_from, request.run_id, hosts, console, asked)
    moved.data_on(run, hosts, console)
    run.save()
    return replace(request, run_id=run.run_id)


def gpu_memory_after_choice(run: Run, hosts: list[Host], answers: dict[str, dict]) -> list[str]:
    """The GPU memory check again once --comm auto chose (local SGD keeps copies of the model beside
    it: the batch that fitted sync may not fit it)."""
    options = run.resolved_preset().options
    found = (preflight.memory_problem(run, h.name, answers.get(h.name, {}).get("gpus") or [], options=options)
             for h in hosts if h.gpus > 0)
    return [problem for problem in found if problem]


def wandb_key_given(overrides: tuple[str, ...], environ) -> None:
    """W&B needs its key from here (the hosts never store it: train.agent.trainer.tracker), or offline logging."""
    if presets.overridden(overrides, "wandb_project") and not environ.get("WANDB_API_KEY") \
            and not environ.get("WANDB_MODE"):
        raise OptionError("set", "wandb_project needs WANDB_API_KEY in this shell's environment (the hosts' "
                          "keepers get it in memory only), or WANDB_MODE=offline to log on the hosts alone")


def backup_while_detached(request: TrainRequest, console) -> None:
    """The controller's copy is taken by `fab train` while it follows: with --detach nothing follows.
    An asked-for --backup is refused then (never silently off); the default is said to be off once the
    run started (train's last line)."""
    if not request.detach or request.dry_run:
        return
    if request.backup is not None and request.backup.strip().lower() != "off":
        raise OptionError("backup", f"{request.backup} copies checkpoints to this controller while fab train "
                          "follows the run, and --detach returns at once: drop --detach to follow it, or pass "
                          "--backup off (the hosts copy each save to each other either way)")


def backup_policy(request: TrainRequest) -> checkpoints.BackupPolicy:
    try:
        return checkpoints.BackupPolicy.parse(request.backup or checkpoints.DEFAULT_BACKUP)
    except ValueError as err:
        raise OptionError("backup", err) from None


def follow_to_the_end(run: Run, hosts: list[Host], request: TrainRequest, known: list[Host], console) -> None:
    """Follow the run until every rank stopped, then the table; StoppedEarly if it ended early."""
    states = follow(run, hosts, console, backup=backup_policy(request), known=known)
    summarize(states, console, closing_mfu(run, known or hosts, states))
    ended = keepers.keeper_ended(states) or ""
    if ended.startswith("stopped:"):  # the keepers stopped it (--no-elastic, restarts exhausted): say why
        raise StoppedEarly(why_stopped_early(states)
                           or f"the hosts' keepers stopped the run: {ended.removeprefix('stopped:').strip()}")
    why = why_stopped_early(states) if ended != "finished" and not ended.startswith("stopped") else None
    if why and ended:
        raise StoppedEarly(why)


def pick_run(hosts: list[Host], request: TrainRequest, precision: str) -> tuple[Run, bool]:
    """The run `fab train` acts on, and whether it resumes: the named one, else the latest, else
    a new one. A resumed run must be asked for on its own hosts (or with hosts it lost, back)."""
    existing = None
    if not request.new:
        try:
            existing = Run.load(request.run_id)
        except ClusterError:
            if request.run_id:
                raise  # a named run that does not exist; without a name: nothing to resume, start one
    if existing is not None:
        given = [h.name for h in hosts]
        grows = set(existing.hosts) < set(given) and set(given) - set(existing.hosts) <= set(
            rejoining.lost_hosts(existing.members, existing.hosts))  # hosts it lost, back: train grows to them
        if request.replace and given == swapped(existing.hosts, request.replace):
            grows = True  # a new VM in a host's place: the keepers take the new start (train.run.keepers)
        if existing.hosts != given and not grows:
            raise OptionError("hosts", f"run {existing.run_id} ran on {', '.join(existing.hosts)}, not "
                                       f"{', '.join(given)}: pass the same --hosts, or --new")
        other_model_or_data(existing, request)
        if request.overrides:  # e.g. a higher max_update to train on
            existing.overrides = [*existing.overrides, *request.overrides]
            _check_overrides(existing)
        return existing, True
    run = Run(run_id=request.run_id or new_run_id(), hosts=[h.name for h in hosts], preset=request.preset or "tiny",
              overrides=list(request.overrides), dataset=request.dataset or "synthetic", master_port=int(request.port),
              update_freq=int(request.update_freq or 1), update_freq_given=request.update_freq is not None,
              precision=precision)
    _check_overrides(run)  # unknown or mistyped overrides now, not on the hosts
    return run, False


def finished_already(run: Run, newest: int | None) -> None:
    """Refuse to resume a run whose newest checkpoint is at its last update: fairseq would load it,
    train one update past max_update and stop, and the report would count a restart."""
    if newest is not None and run.max_update and newest >= run.max_update:
        raise ClusterError(f"{run.run_id} has finished: its newest checkpoint is at update {newest:,} of "
                           f"max_update {run.max_update:,}; --set max_update=N trains it on, --new starts another run")


def other_model_or_data(existing: Run, request: TrainRequest) -> None:
    """A resumed run trains its own preset on its own dataset: asking for others is asking for a new
    run (resuming would go on with tiny's checkpoint where the user asked for big)."""
    asked = {"--preset": (request.preset, existing.preset), "--dataset": (request.dataset, existing.dataset)}
    differ = [f"{option} {given} (it trains {own})" for option, (given, own) in asked.items() if given and given != own]
    if differ:
        which = f"run {existing.run_id}" if request.run_id else f"the latest run, {existing.run_id},"
        option = "preset" if differ[0].startswith("--preset") else "dataset"
        raise OptionError(option, f"{which} is {existing.preset} on {existing.dataset}; resuming it cannot take "
                                  f"{' and '.join(differ)}: --new starts a run with them; without them it resumes")


def _check_overrides(run: Run) -> None:
    try:
        run.resolved_preset()
    except presets.OverrideError as err:  # the run's preset types them: a resumed run's may not be --preset
        raise OptionError("set", err) from None


def swapped(names: list[str], replace: str) -> list[str]:
    old, new = replace.split("=")
    return [new if n == old else n for n in names]


def replaced_hosts(known: list[Host], request: TrainRequest) -> list[Host]:
    """`--replace OLD=NEW`: the run's hosts in their order, NEW in OLD's place (a resume, not a new run)."""
    if request.new:
        raise OptionError("replace", "replaces a host of a run that exists: without --new")
    run = Run.load(request.run_id)
    old, new = request.replace.split("=")
    if old not in run.hosts:
        raise OptionError("replace", f"{old} is not one of {run.run_id}'s hosts ({', '.join(run.hosts)})")
    if new in run.hosts:
        raise OptionError("replace", f"{new} already trains in {run.run_id}")
    if new not in {h.name for h in known}:
        raise OptionError("replace", f"{new} is not in the inventory: add it (fab init), provision it "
                          f"(ansible-playbook provision.yml --limit {new}) and prepare its data (fab prepare-data)")
    return select(known, swapped(run.hosts, request.replace))


def replaced(run: Run, replace: str, hosts: list[Host], at: int) -> str:
    """The run record's membership entry for a replaced VM (train.report.members reads it as a join)."""
    old, new = replace.split("=")
    run.hosts = [h.name for h in hosts]
    run.members = [*run.members, {"hosts": [h.name for h in hosts], "from_update": at, "time": time.time(),
                                  "why": f"{new} replaced {old} at update {at}", "joined": [new], "lost": [old]}]
    return f"{new} takes {old}'s place in {run.run_id} from update {at}; the running keepers take the new start"


def rejoin_hosts(known: list[Host], run_id: str | None) -> list[Host]:
    """`--rejoin`: the run's hosts and every host it lost that the inventory has, in the order they
    first trained in (train.run.rejoin)."""
    run = Run.load(run_id)
    lost = [n for n in rejoining.lost_hosts(run.members, run.hosts) if n in {h.name for h in known}]
    if not lost:  # the record may be behind the hosts (a detached run): the hosts say whose keeper runs
        lost = keeperless_hosts(run, select(known, [n for n in run.hosts if n in {h.name for h in known}]))
    if not lost:
        raise ClusterError(f"{run.run_id} trains on {', '.join(run.hosts)} and lost no host the inventory "
                           "has: nothing to rejoin")
    return select(known, rejoining.grown_hosts(run.members, run.hosts, lost))


def keeperless_hosts(run: Run, hosts: list[Host]) -> list[str]:
    """The run's hosts whose keeper no longer runs while another's does (a host cut off that gave up alone,
    its restarts spent) and that the hosts keeping the run lost: the record is brought up to those hosts'
    timeline first (a detached run's record never heard of the split), so they take the others back."""
    def keeps(keeper: dict) -> bool:  # alive, and not ending (an ended keeper lingers a few seconds)
        return bool(keeper.get("keeper")) and not keeper.get("ended")

    require_answering(hosts)  # a silent host is unreachable, said so: its silence is no keeper that stopped
    states = [s for s in launch.states(run, hosts) if s.reachable]
    keeping = [s for s in states if keeps(s.keeper or {})]
    idle = [s.name for s in states if not keeps(s.keeper or {})]
    if not keeping or not idle:
        return []
    keepers.sync(run, keeping)
    return [n for n in rejoining.lost_hosts(run.members, run.hosts) if n in idle]


def grow_running(run: Run, current: list[Host], joining: list[Host], known: list[Host], request: TrainRequest,
                 console) -> None:
    """A run training on fewer hosts than asked: the joining hosts' keepers started (where theirs does
    not run), and the current ones take them back at rank 0's next checkpoint; then following as usual."""
    names = ", ".join(h.name for h in joining)
    console.print(f"{run.run_id} is training on {', '.join(h.name for h in current)}; "
                  f"{names} rejoin{'s' if len(joining) == 1 else ''} at its next checkpoint")
    keepers.add(run, current, joining)  # the hosts' keepers take them back; following only watches
    if not request.detach:
        follow_to_the_end(run, current, request, known, console)


def set_comm(run: Run, comm: str, resuming: bool, console) -> None:
    """The run's communication strategy; a resumed run keeps its own unless told otherwise."""
    try:
        chosen = str(strategies.parse(comm))
    except CommError as err:
        raise OptionError("comm", err) from None
    if resuming and chosen != run.comm:
        console.print(f"[yellow]{run.run_id} trained with --comm {run.comm}; it goes on with {chosen}[/]")
    run.comm = chosen


def network_check(run: Run, hosts: list[Host], accept: bool, console,
                  auto: bool = False) -> predict.Verdict | None:
    """The cost model on the measured link (train.plan.predict): refuse a network-bound run, or one
    that fewer hosts would train faster, unless accepted; with `auto`, pick the communication
    strategy from it (model.choose) and say why. Returns the verdict (None when nothing was measured)."""
    try:
        with console.status("measuring the link (iperf3) and predicting the step time"):
            verdict = predict.for_run(run, hosts, comm="auto" if auto else None)
    except PeerUnreachable:
        raise  # the rendezvous would hang: not a check to skip
    except ClusterError as err:
        if auto:
            raise  # no figures to choose from: say how to get them rather than train sync
        console.print(f"[yellow]network check skipped:[/] {escape(plain(str(err)))}")  # the hosts' words
        return None
    if verdict is None:
        return None
    if auto and verdict.choice:
        run.comm = verdict.choice.comm
        batching.choose_update_freq(run, verdict.choice.update_freq)
        console.print(f"[green]--comm auto[/] chose {verdict.choice.flag()}")
    text = "\n  ".join(verdict.lines)
    fewer = verdict.fewer_hosts_faster
    if fewer is not None and not accept:
        n = len(fewer.hosts)
        raise Refused(f"{n} host{'s' if n > 1 else ''} would train the same updates faster than "
                           f"{len(hosts)} on this link, nothing started:\n  {text}\n"
                           f"run `fab train {fewer.flags()}` instead ({fewer.speed()} against "
                           f"{verdict.comparison.asked.speed()}), fix the link, or pass --accept-slow-network "
                           "to train on every host anyway")
    if verdict.network_bound and not accept:
        better = (f"\n{verdict.choice.flag()} would reach {verdict.choice.prediction.efficiency:.0%} "
                  "(or --comm auto)" if verdict.choice and not auto else "")
        raise Refused(f"the network would take most of each step, nothing started:\n  {text}{better}\n"
                           "fix the link, choose a --comm strategy, or pass --accept-slow-network to train anyway")
    slow = verdict.network_bound or fewer is not None
    console.print("[yellow]network-bound or fewer hosts faster, accepted (--accept-slow-network):[/]" if slow
                  else "[green]✓[/] network check:")
    console.print("  " + text, markup=False)
    return verdict
