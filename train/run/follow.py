"""Following a run from the controller: a live progress bar from rank 0's log.

Ctrl-C detaches (the training goes on). As soon as rank 0 saved its first checkpoint, then every
`backup_every` seconds, the last and best checkpoints are copied off the rank-0 host (host to
host, and one copy to the controller), so losing its disk loses no training. The copy runs in
the background: a multi-GB checkpoint must not hold up noticing a dead rank. When a rank stops,
the others are stopped too: a half-dead job only holds GPUs and ports. With `elastic`, a run
that stops early goes on without the lost host (train.run.elastic), and grows back to it when
it answers again (train.run.rejoin.Watch).
"""

from __future__ import annotations

import threading
import time

from rich.progress import BarColumn, MofNCompleteColumn, TextColumn

from ..cluster import Host
from ..report import logparse
from ..tasks import console
from ..watch.compact import HostLines, ProgressWithHosts
from . import launch
from .elastic import continue_without
from .rejoin import Watch


def describe(p: logparse.Progress | None) -> str:
    if p is None:
        return "starting"
    parts = []
    if p.loss is not None:
        parts.append(f"loss {p.loss:.3f}")
    if p.seconds_per_update is not None:
        parts.append(f"{p.seconds_per_update:.2f} s/upd")
    if p.wps is not None:
        parts.append(f"{p.wps:,.0f} wps")
    parts.append(f"ETA {logparse.format_eta(p.eta_seconds)}")
    return " · ".join(parts)


def follow(run: launch.Run, hosts: list[Host], poll_s: float = 2.0, backup_every_s: float = 30.0,
           dead_grace_s: float = 30.0, elastic: bool = False, known: list[Host] | None = None
           ) -> list[launch.HostState]:
    """Show progress until every rank has stopped; returns the final states. With `elastic`, a run
    that stops early goes on without the lost host (train.run.elastic), and grows back to a host it
    lost once that answers again (train.run.rejoin; `known`: the inventory's hosts, default `hosts`)."""
    last_backup = time.monotonic()
    backup: threading.Thread | None = None
    backed_up: int | None = None  # the update of rank 0's checkpoint when the last copy began
    dead_since: float | None = None
    last_update = 0  # rank 0's, as last seen: its host may be the one lost
    hosts_below = HostLines(run, hosts, run.link_mbps)  # the per-host line of `fab watch`, under the bar
    rejoin = Watch(run, known or hosts, say=lambda text: console.print(f"[cyan]{text}[/]")) if elastic else None
    # Not a terminal (CI logs, | tee): no bar, which rich would cut to 80 columns, but whole lines.
    plain, said, said_at = not console.is_terminal, "", 0.0
    with ProgressWithHosts(hosts_below, TextColumn(f"[bold]{run.run_id}"), BarColumn(), MofNCompleteColumn(),
                           TextColumn("{task.fields[info]}"), console=console, transient=False,
                           disable=plain) as bar:
        task = bar.add_task("train", total=run.max_update, info="starting")
        try:
            while True:
                states = launch.states(run, hosts)
                rank0 = states[0]
                hosts_below.refresh()
                if rank0.progress:
                    last_update = rank0.progress.update
                    bar.update(task, completed=rank0.progress.update, info=describe(rank0.progress))
                    line = f"{run.run_id} {rank0.progress.update}/{run.max_update or '?'} · {describe(rank0.progress)}"
                    if plain and line != said and (time.monotonic() - said_at > 10 or not rank0.running):
                        console.print(line, markup=False, soft_wrap=True)
                        for host_line in hosts_below.lines:  # what the bar would show below it
                            console.print(host_line.plain, markup=False, soft_wrap=True)
                        said, said_at = line, time.monotonic()
                running = [s for s in states if s.running]
                if not running:
                    survivors = elastic and why_stopped_early(states) and continue_without(
                        run, hosts, states, say=lambda text: console.print(f"[yellow]{text}[/]"), at=last_update)
                    if not survivors:
                        break
                    hosts, dead_since = survivors, None
                    hosts_below.follow(hosts)
                    continue
                if len(running) < len(states):
                    # A rank is gone. The survivors usually fail on their own within seconds;
                    # if not, stop them so nothing hangs on a dead peer.
                    dead_since = dead_since or time.monotonic()
                    if time.monotonic() - dead_since > dead_grace_s:
                        gone = ", ".join(s.name for s in states if not s.running)
                        console.print(f"[red]rank on {gone} stopped; stopping the others[/]")
                        launch.stop(run, [h for h, s in zip(hosts, states, strict=True) if s.reachable])
                        if not elastic:
                            break
                elif rejoin is not None:
                    if rejoin.ready and backup:
                        backup.join()  # one copy of the checkpoint at a time
                    if grown := rejoin.step(hosts, rank0.progress):
                        hosts, dead_since = grown, None
                        hosts_below.follow(hosts)
                        continue
                saved = rank0.progress.saved if rank0.progress else None
                # the first checkpoint is copied at once: a host lost early must not cost the whole run
                first = saved is not None and backed_up is None
                if (first or time.monotonic() - last_backup > backup_every_s) and not (backup and backup.is_alive()):
                    backup = threading.Thread(target=_backup, args=(run, hosts), daemon=True, name="backup")
                    backup.start()
                    last_backup, backed_up = time.monotonic(), saved
                time.sleep(poll_s)
        except KeyboardInterrupt:
            console.print(f"detached; {run.run_id} goes on. `fab status`, `fab logs`, `fab stop`.")
            return launch.states(run, hosts)
        finally:
            hosts_below.close()
            if backup:
                backup.join()  # a copy under way finishes (a daemon thread would be cut off at exit)
    _backup(run, hosts)
    return launch.states(run, hosts)


def why_stopped_early(states: list[launch.HostState]) -> str | None:
    """One line naming the culprit when the run ended before its last update; None while it runs
    or when it finished. The culprit is the first rank torchrun saw fail that did not lose a peer
    first (RankEnd.blame_order): the others fail after it, and say their peer went away."""
    rank0 = states[0].progress if states else None
    if not states or any(s.running for s in states) or (rank0 and rank0.finished):
        return None
    at = f"at update {rank0.update:,}" if rank0 else "before its first update"
    lost = [s.name for s in states if not s.reachable]
    if lost:
        return f"{', '.join(lost)}: unreachable; the run stopped {at}"
    # a rank tandem stopped after the culprit died was not the culprit
    failed = sorted((s for s in states if s.ended and not s.stopped_by_user), key=lambda s: s.ended.blame_order())
    if not failed and any(s.stopped_by_user for s in states):
        return None  # `fab stop` ended it on purpose: not an early stop to fail on
    if failed:
        first = failed[0]
        who = f"rank {first.ended.rank}" if first.ended.rank is not None else "its rank"
        others = "; the others stopped" if len(states) > 1 else ""
        return f"{first.name}: {who} {first.ended.how} {at}{others}"
    return f"the run stopped {at} and no rank said why: `fab logs`"


def _backup(run: launch.Run, hosts: list[Host]) -> None:
    try:
        launch.share_checkpoint(run, hosts)
    except Exception as err:  # a host gone mid-copy (timeout, closed socket): the run goes on, and says so
        console.print(f"[yellow]checkpoint copy failed (training goes on): {type(err).__name__}: {err}[/]")
