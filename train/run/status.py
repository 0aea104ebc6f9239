"""A run's state as the user reads it: one line per rank, one line for the run, and why it
stopped early when it did (`fab status`, `fab train`'s end, `fab logs`)."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import asdict, dataclass

from rich.markup import escape
from rich.table import Table
from rich.text import Text

from ..cluster import Host, require_reachable, run_all
from ..plan import batching
from ..plan import mfu as flops
from ..recipe import logformat
from ..recipe.record import Run
from ..watch.render import plain
from . import idle, launch, offsite
from .launch import HostState


def describe(p: logformat.Progress | None, mfu: str = "") -> str:
    """Rank 0's progress in a few words: loss, s/update, words/s (and `mfu`, train.plan.mfu), ETA."""
    if p is None:
        return "starting"
    parts = []
    if p.loss is not None:
        parts.append(f"loss {p.loss:.3f}")
    if p.seconds_per_update is not None:
        parts.append(f"{p.seconds_per_update:.2f} s/upd")
    if p.wps is not None:
        parts.append(f"{p.wps:,.0f} wps" + (f" · {mfu}" if mfu else ""))
    parts.append(f"ETA {logformat.format_eta(p.eta_seconds)}")
    return " · ".join(parts)


def mfu_of(run: Run, hosts: list[Host], wps: float | None) -> str:
    """`MFU 24%` at `wps` words/s (all ranks) over `hosts`' GPUs, by the GPU's name as the probe recorded
    it (train.plan.mfu); `MFU: peak unknown (NAME)`; nothing on CPU hosts or before the first words/s."""
    gpus = sum(h.gpus for h in hosts)
    if not gpus or not wps:
        return ""
    return flops.beside_wps(run.resolved_preset().options, batching.VOCAB, wps, gpus, run.gpu_name)


def closing_mfu(run: Run, hosts: list[Host], states: list[HostState]) -> str:
    """What `fab train`'s last line adds on GPUs: rank 0's last logged words/s and their MFU over the
    run's GPUs now (its members, as the keepers left them); nothing on a CPU run."""
    p = states[0].progress if states else None
    members = [h for h in hosts if h.name in run.hosts]
    said = mfu_of(run, members, p.wps if p else None)
    return f"{p.wps:,.0f} words/s · {said}" if said and p else ""


def shared_failure(states: list[HostState]) -> str | None:
    """The error every host's ranks ended with, where all raised the same one (numbers aside) and
    none lost a peer first: a failure every rank shares (the data, an option, the code), no host's
    fault: a restart without one of them would fail the same, one host fewer each time. None else."""
    if len(states) < 2 or any(s.running or not s.reachable or s.stopped_by_user or not s.ended for s in states):
        return None
    if any(s.ended.peer_gone or not s.ended.error for s in states):
        return None
    errors = {re.sub(r"\d+", "N", s.ended.error) for s in states}
    return states[0].ended.error if len(errors) == 1 else None


def why_stopped_early(states: list[HostState]) -> str | None:
    """One line naming the culprit when the run ended before its last update; None while it runs
    or when it finished. The culprit is the first rank torchrun saw fail that did not lose a peer
    first (RankEnd.blame_order): the others fail after it, and say their peer went away."""
    rank0 = states[0].progress if states else None
    if not states or any(s.running for s in states) or (rank0 and rank0.finished):
        return None
    lost = [s.name for s in states if not s.reachable]
    if len(lost) == len(states):  # nothing is known of the run: only that this machine reaches no host
        return f"{', '.join(lost)}: unreachable from here; the run's state is not known"
    at = (f"at update {rank0.update:,}" if rank0 else "before its first update" if states[0].reachable
          else "at an update not known here (rank 0's host is unreachable)")
    if lost:
        return f"{', '.join(lost)}: unreachable; the run stopped {at}"
    if same := shared_failure(states):
        return (f"every host's ranks failed with the same error {at}: {plain(same)}; no host is to blame (fix it, "
                "then `fab train` resumes)")
    # a rank tandem stopped after the culprit died was not the culprit
    failed = sorted((s for s in states if s.ended and not s.stopped_by_user), key=lambda s: s.ended.blame_order())
    if not failed and any(s.stopped_by_user for s in states):
        return None  # `fab stop` ended it on purpose: not an early stop to fail on
    if failed:
        first = failed[0]
        who = f"rank {first.ended.rank}" if first.ended.rank is not None else "its rank"
        others = "; the others stopped" if len(states) > 1 else ""
        return f"{first.name}: {who} {plain(first.ended.how)} {at}{others}"
    return f"the run stopped {at} and no rank said why: `fab logs`"


def run_state_line(states: list[HostState], mfu: str = "") -> str:
    """The run in one line: running at update N, finished, stopped by fab stop, or why it ended early;
    then `mfu` (closing_mfu) where given."""
    line = run_state(states)
    return f"{line} · {mfu}" if mfu else line


def run_state(states: list[HostState]) -> str:
    rank0 = states[0].progress if states else None
    last = f"{rank0.max_update:,}" if rank0 and rank0.max_update else "?"
    at = f"update {rank0.update:,}/{last}" if rank0 else "no update yet"
    if states and not any(s.reachable for s in states):
        return f"[red]{escape(str(why_stopped_early(states)))}[/]"
    if any(s.running for s in states):
        return f"running, {at}"
    if rank0 and rank0.finished:
        return f"[green]finished[/], {at}"
    died = [s for s in states if (s.ended and not s.stopped_by_user) or not s.reachable]
    if not died and any(s.stopped_by_user for s in states):
        return f"[yellow]stopped by fab stop[/] at {at}; `fab train` resumes it"
    return f"[red]ended early[/]: {escape(str(why_stopped_early(states)))}"  # a rank's words: never markup


@dataclass(frozen=True)
class HostRow:
    """One host as `fab status` shows it, in its table and its JSON."""

    host: str
    ranks: str
    state: str
    running: bool
    reachable: bool
    update: int | None
    loss: float | None
    s_per_update: float | None
    last_line: str
    error: str | None


def doing(rank: int, s: HostState, states: list[HostState], finished: bool) -> str:
    """What a host is doing, in a few words. Rank 0's host: its log's last meaningful line (it logs
    the updates). A host after it logs no update: its last line is a PyTorch warning's fragment or
    `initialized host v100b as rank 1`, so while its ranks run it says it trains in step with rank 0."""
    own = logformat.message(s.tail[-1]) if s.tail else (s.error or "")
    if rank == 0 or not s.reachable:
        return own
    if s.running:
        return "training, in step with rank 0" if states[0].running else "its ranks run; rank 0's do not"
    if finished and not s.ended:
        return "finished with rank 0"
    return own


def rows(states: list[HostState]) -> list[HostRow]:
    """Each host's row, rank 0's host first. Only rank 0 logs updates: a host training in step with
    it (or finished with it) shows rank 0's update."""
    rank0 = states[0].progress if states else None
    finished = bool(rank0 and rank0.finished)  # only rank 0 logs "done training"
    out = []
    for rank, s in enumerate(states):
        p = s.progress if rank == 0 else None
        in_step = rank > 0 and rank0 is not None and (s.running or (finished and not s.ended)) and s.reachable
        update = p.update if p else (rank0.update if in_step else None)
        out.append(HostRow(s.name, s.ranks or str(rank), s.describe(finished), s.running, s.reachable, update,
                           p.loss if p else None, p.seconds_per_update if p else None,
                           doing(rank, s, states, finished), s.error))
    return out


def table(states: list[HostState]) -> Table:
    """Each host's real state, the ranks it runs (rank 0's host first: only it logs updates) and
    what it is doing (its last meaningful log line)."""
    out = Table()
    for column in ("host", "ranks", "state", "update", "loss", "s/update"):
        out.add_column(column)
    out.add_column("last log line", overflow="fold")  # folded, never cut with an ellipsis
    for row in rows(states):
        colour = {"running": "", "finished": "green", "stopped by fab stop": "yellow"}.get(row.state, "red")
        out.add_row(row.host, row.ranks, Text(plain(row.state), style=colour),  # a rank's end in its words
                    str(row.update) if row.update is not None else "-",
                    f"{row.loss:.3f}" if row.loss is not None else "-",
                    f"{row.s_per_update:.2f}" if row.s_per_update else "-",
                    Text(plain(row.last_line)[:70]))
    return out


def status_json(run: Run, states: list[HostState]) -> str:
    """`fab status --json`: the run and every host, as the table says them; the newest copy off the cluster
    (train.run.offsite.summary: update, time, age_s, where; null without --checkpoints-to)."""
    rank0 = states[0].progress if states else None
    return json.dumps({
        "run": run.run_id,
        "state": Text.from_markup(run_state_line(states)).plain,
        "update": rank0.update if rank0 else None,
        "max_update": rank0.max_update if rank0 else run.max_update,
        "hosts": [asdict(row) for row in rows(states)],
        "offsite": offsite.summary(run, states),
    }, indent=1)


def summarize(states: list[HostState], console, mfu: str = "") -> list[HostState]:
    """The table, then the run's state in one line (with `mfu`: closing_mfu); returns the states."""
    console.print(table(states))
    console.print(run_state_line(states, mfu))
    return states


def show(run: Run, hosts: list[Host], console, as_json: bool = False) -> None:
    """`fab status`: the table, rank 0's progress, the last lines of a rank that died (or all of it as
    JSON). Raises naming the hosts that could not be reached."""
    from . import keepers  # keepers builds on launch, as this module does

    states = launch.states(run, run.known_of(hosts))
    keepers.sync(run, states)
    states = keepers.rank_order(run, states)
    lost = {s.name: s.error or "no answer" for s in states if not s.reachable}
    if as_json:
        print(status_json(run, states))
        require_reachable(lost)
        return
    summarize(states, console)
    if changes := keepers.timeline(states):
        console.print("membership (the hosts' keepers' record):")
        for entry in changes:
            console.print(f"  {keepers.change_line(entry)}", markup=False)
    for line in keepers.no_room_lines(states):  # host text: escapes stripped
        console.print(f"  {plain(line)}", markup=False)
    if aside := keepers.set_aside_lines(states):
        console.print("set aside by the keepers (kept whole, not trained on):")
        for line in aside:
            console.print(f"  {line}", markup=False)
    if copied := offsite.status_line(run, states):  # the hosts' uploads off the cluster (--checkpoints-to)
        console.print(copied, markup=False)
    rank0 = states[0].progress
    if rank0:
        members = [h for h in hosts if h.name in run.hosts]
        console.print(f"{run.run_id}: update {rank0.update}/{rank0.max_update}, "
                      f"{describe(rank0, mfu_of(run, members, rank0.wps))}")
    finished = bool(rank0 and rank0.finished)  # only rank 0 logs "done training"
    for s in states:
        if s.reachable and not s.running and s.tail and not finished and not s.stopped_by_user:
            console.print(f"[red]{s.name} {escape(plain(s.describe(finished)))}[/]; its last log lines:")
            for line in s.tail:  # the host's text, as text
                console.print(f"  {plain(line)}", markup=False)
    for line in idle.cost(run, hosts, running=any(s.running for s in states)).lines():
        console.print(line, markup=False)
    require_reachable(lost)


def for_report(run: Run, hosts: list[Host]) -> tuple[dict | None, dict]:
    """`fab report`'s question to every host, before it collects their files: the run record brought up to
    the keepers' membership (the hosts it collects from), then the newest copy off the cluster
    (train.run.offsite.summary; None for a run that copies nothing off it) and the run's cost with the
    idle cluster's (train.run.idle.cost; running: a rank of the run's hosts runs), as JSON objects. No host
    answering raises ClusterError naming them, before anything is written (a report of nothing)."""
    from . import keepers  # keepers builds on launch, as this module does

    states = launch.states(run, run.known_of(hosts))
    if not any(s.reachable for s in states):
        require_reachable({s.name: s.error or "no answer" for s in states})
    keepers.sync(run, states)  # the hosts' membership record
    running = any(s.running for s in states if s.name in run.hosts)
    return offsite.summary(run, states), idle.cost(run, hosts, running).as_dict()


def show_logs(run: Run, hosts: list[Host], lines: int, console) -> None:
    """`fab logs`: the last lines of every host's training log, a rule between hosts. Raises naming
    the hosts that could not be reached."""
    results = run_all(run.hosts_of(hosts), f"tail -n {int(lines)} {shlex.quote(run.remote_dir + '/train.log')}")
    for name, result in results.items():
        console.rule(name)
        if not result.reachable:
            console.print(Text(f"unreachable: {plain(str(result.error))}", style="red"))
        elif not result.ok:
            console.print(Text(f"no log: {plain(result.stderr.strip())}", style="red"))
        else:
            console.print(plain(result.stdout), markup=False)
    require_reachable({name: str(r.error) for name, r in results.unreachable.items()})


def show_cluster(hosts: list[Host], console) -> None:
    """`fab info`: the table of every host; raises naming the hosts that could not be reached."""
    results = run_all(hosts, "hostname; uname -r; nproc; free -m | awk '/Mem:/ {print $2}'")
    console.print(cluster_table(hosts, results))
    require_reachable({name: str(r.error) for name, r in results.unreachable.items()})


def cluster_table(hosts: list[Host], results) -> Table:
    """Every host's name, kernel, CPUs and memory, from their answers (train.cluster.GroupResult)."""
    out = Table(title="cluster")
    for column in ("host", "address", "hostname", "kernel", "cpus", "memory (MiB)", "gpus"):
        out.add_column(column)
    for host in hosts:
        result = results[host.name]
        if not result.reachable:
            out.add_row(host.name, host.address, Text(f"unreachable: {result.error}", "red"), "", "", "", "")
        elif not result.ok or len(result.stdout.split()) != 4:
            out.add_row(host.name, host.address, Text(f"failed: {result.why}", "red"), "", "", "", "")
        else:
            hostname, kernel, cpus, memory = result.stdout.split()
            out.add_row(host.name, host.address, hostname, kernel, cpus, memory, str(host.gpus))
    return out
