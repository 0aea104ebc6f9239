"""Following a run from the controller: a live progress bar from rank 0's log, and the keepers'
membership changes as they happen.

Following changes nothing on the hosts: their keepers (train.agent.keeper.loop) replicate checkpoints,
go on without a lost host and take it back. Ctrl-C detaches (the training goes on). The one thing
following adds is the controller's own copy of the newest checkpoint (`--backup`), read-only.
"""

from __future__ import annotations

import time

from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn

from ..cluster import Host
from ..recipe.record import Run
from ..watch.compact import HostLines, ProgressWithHosts
from ..watch.render import plain
from . import checkpoints, keepers, launch
from .checkpoints import Backup, BackupPolicy
from .launch import HostState
from .status import describe, mfu_of


class ProgressView:
    """The bar with each host's line below it; on a console that is no terminal (CI logs, | tee),
    whole lines every 10 s instead (rich would cut a bar to 80 columns)."""

    def __init__(self, run: Run, hosts: list[Host], console):
        self.run, self.console = run, console
        self.hosts_below = HostLines(run, hosts, run.link_mbps)  # `fab watch`'s per-host line
        self.members = hosts
        self.plain, self._said, self._said_at = not console.is_terminal, "", 0.0
        self.bar = ProgressWithHosts(self.hosts_below, TextColumn(f"[bold]{run.run_id}"), BarColumn(),
                                     MofNCompleteColumn(), TextColumn("{task.fields[info]}"), console=console,
                                     transient=False, disable=self.plain)

    def __enter__(self) -> ProgressView:
        self.bar.__enter__()
        self.task = self.bar.add_task("train", total=self.run.max_update, info="starting")
        return self

    def __exit__(self, *exc) -> None:
        self.hosts_below.close()
        self.bar.__exit__(*exc)

    def follow(self, hosts: list[Host]) -> None:
        self.hosts_below.follow(hosts)
        self.members = hosts

    def mfu(self, wps: float | None) -> str:
        """`MFU 21%` of the run's GPUs (train.plan.mfu); `MFU: peak unknown (NAME)`; on CPU hosts nothing."""
        return mfu_of(self.run, self.members, wps)

    def show(self, rank0: HostState) -> None:
        self.hosts_below.refresh()
        if not rank0.progress:
            return
        p = rank0.progress
        info = describe(p, self.mfu(p.wps))
        self.bar.update(self.task, completed=p.update, info=info)
        line = f"{self.run.run_id} {p.update}/{self.run.max_update or '?'} · {info}"
        if self.plain and line != self._said and (time.monotonic() - self._said_at > 10 or not rank0.running):
            self.console.print(line, markup=False, soft_wrap=True)
            for host_line in self.hosts_below.lines:  # what the bar would show below it
                self.console.print(host_line.plain, markup=False, soft_wrap=True)
            self._said, self._said_at = line, time.monotonic()


class Reconnecting:
    """The laptop lost the hosts (asleep, offline, another Wi-Fi): said once, asked again with back-off
    (2 s doubling to `most_s`), said again when they answer. Never a reason to act on the run."""

    def __init__(self, say, first_s: float = 2.0, most_s: float = 30.0):
        self.say, self.first_s, self.most_s = say, first_s, most_s
        self.wait_s, self.since = first_s, None

    def lost(self) -> float:
        """Every host unreachable from here: how long to wait before asking again."""
        if self.since is None:
            self.since = time.monotonic()
            self.say("cannot reach any host from here (this machine offline or asleep?); the hosts keep the "
                     "run by themselves. Asking again with back-off")
        wait, self.wait_s = self.wait_s, min(self.most_s, self.wait_s * 2)
        return wait

    def answered(self) -> None:
        if self.since is not None:
            self.say(f"the hosts answer again after {time.monotonic() - self.since:.0f} s; following")
        self.since, self.wait_s = None, self.first_s


def follow(run: Run, hosts: list[Host], console, poll_s: float = 2.0, backup: BackupPolicy | None = None,
           known: list[Host] | None = None, **_) -> list[HostState]:
    """Show progress until the run's keepers end (finished, stopped, or given up); returns the final
    states. Following only reads: the hosts' keepers lose, restart and take back hosts by themselves
    (train.agent.keeper.loop); each membership change they record is said as it appears. A host this
    machine cannot reach is only shown as such; every host unreachable is this machine's network."""
    def say(colour: str):
        return lambda text: console.print(f"[{colour}]{text}[/]")

    pool = {h.name: h for h in (known or hosts)}
    everyone = [pool[n] for n in (run.order or run.hosts) if n in pool] or hosts
    copies = Backup(run, backup, say=say("yellow"))
    away = Reconnecting(say("yellow"))
    said = {(e.get("generation"), tuple(e.get("hosts") or ())) for e in run.members}  # changes said once
    detached = False
    states: list[HostState] = []
    with ProgressView(run, hosts, console) as view:
        try:
            while True:
                states = launch.states(run, everyone)
                if not any(s.reachable for s in states):
                    time.sleep(away.lost())
                    continue
                away.answered()
                for entry in keepers.sync(run, states, said):
                    if len(run.members) > 1 or entry.get("generation", 1) > 1:
                        console.print(f"[cyan]{escape(plain(keepers.change_line(entry)))}[/]", markup=True)
                states = keepers.rank_order(run, states)
                current = [h for n in run.hosts for h in everyone if h.name == n]
                if current:
                    view.follow(current)  # a no-op unless the keepers changed the membership
                rank0 = states[0]
                view.show(rank0)
                if keepers.keeper_ended(states) and not any(s.running for s in states if s.reachable):
                    break
                if rank0.reachable and current:  # the controller's own copy: read-only
                    copies.maybe_start(current[:1], rank0.progress.saved if rank0.progress else None)
                time.sleep(poll_s)
        except KeyboardInterrupt:
            console.print(f"detached; {run.run_id} goes on. `fab status`, `fab logs`, `fab stop`.")
            detached = True
        except BaseException:
            copies.wait()  # a copy under way finishes (a daemon thread would be cut off at exit)
            raise
    try:  # a copy under way finishes, said; a second Ctrl-C leaves it
        copies.wait(say=say("yellow"))
        if not detached:
            copies.final([h for n in run.hosts for h in everyone if h.name == n][:1])
    except KeyboardInterrupt:
        copies.leave()
        console.print("the checkpoint copy was left unfinished: the hosts keep theirs; its partial file is removed")
        detached = True
    if detached:
        return states
    moved = checkpoints.through_controller["bytes"]
    console.print(f"checkpoints through the controller: {moved / 1e6:,.0f} MB (--backup {copies.policy})",
                  markup=False)
    return keepers.rank_order(run, launch.states(run, everyone))
