"""Following a run from the controller: a live progress bar from rank 0's log.

Ctrl-C detaches (the training goes on). The loop asks three components on every poll: the
checkpoint `Backup` (rank 0's every checkpoint pushed to its peers host to host, the newest to
the controller per `--backup`: losing its disk loses no training), the `DeadRankGuard` (a rank
gone while the others hang on it: they are stopped, a half-dead job only holds GPUs and ports)
and, with `elastic`, the rejoin `Watch` (a lost host that answers again is grown back to). A run that
stops early goes on without the lost host (train.run.elastic).
"""

from __future__ import annotations

import time

from rich.progress import BarColumn, MofNCompleteColumn, TextColumn

from ..cluster import Host
from ..plan import mfu
from ..watch.compact import HostLines, ProgressWithHosts
from . import batching, checkpoints, launch
from .checkpoints import Backup, BackupPolicy
from .elastic import continue_without
from .launch import HostState
from .record import Run
from .rejoin import Watch
from .status import describe, why_stopped_early


class DeadRankGuard:
    """A rank gone while the others run: the survivors usually fail on their own within seconds;
    if they have not after `grace_s`, they are stopped, so nothing hangs on a dead peer."""

    def __init__(self, run: Run, grace_s: float = 30.0, say=print):
        self.run, self.grace_s, self.say = run, grace_s, say
        self._since: float | None = None

    def reset(self) -> None:
        self._since = None

    def stopped_the_rest(self, hosts: list[Host], states: list[HostState]) -> bool:
        """Called while some ranks run and some do not; True once it stopped the rest."""
        self._since = self._since or time.monotonic()
        if time.monotonic() - self._since <= self.grace_s:
            return False
        gone = ", ".join(s.name + (f" (ranks {s.ranks})" if "-" in s.ranks else "") for s in states if not s.running)
        self.say(f"[red]rank on {gone} stopped; stopping the others[/]")
        launch.stop(self.run, [h for h, s in zip(hosts, states, strict=True) if s.reachable])
        return True


class ProgressView:
    """The bar with each host's line below it; on a console that is no terminal (CI logs, | tee),
    whole lines every 10 s instead (rich would cut a bar to 80 columns)."""

    def __init__(self, run: Run, hosts: list[Host], console):
        self.run, self.console = run, console
        self.hosts_below = HostLines(run, hosts, run.link_mbps)  # `fab watch`'s per-host line
        self.gpus = sum(h.gpus for h in hosts)
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
        self.gpus = sum(h.gpus for h in hosts)

    def mfu(self, wps: float | None) -> str:
        """`MFU 21%` of the run's GPUs (train.plan.mfu); `MFU: peak unknown (NAME)`; on CPU hosts nothing."""
        if not self.gpus or not wps:
            return ""
        value = mfu.of_run(self.run.resolved_preset().options, batching.VOCAB, wps, self.gpus, self.run.gpu_name)
        return mfu.mfu_text(value, self.run.gpu_name)

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


def follow(run: Run, hosts: list[Host], console, poll_s: float = 2.0, backup: BackupPolicy | None = None,
           dead_grace_s: float = 30.0, elastic: bool = False, known: list[Host] | None = None
           ) -> list[HostState]:
    """Show progress until every rank has stopped; returns the final states. With `elastic`, a run
    that stops early goes on without the lost host (train.run.elastic), and grows back to a host it
    lost once that answers again (train.run.rejoin; `known`: the inventory's hosts, default `hosts`)."""
    def say(colour: str):
        return lambda text: console.print(f"[{colour}]{text}[/]")

    copies = Backup(run, backup, say=say("yellow"))
    guard = DeadRankGuard(run, dead_grace_s, say=console.print)
    rejoin = Watch(run, known or hosts, say=say("cyan")) if elastic else None
    last_update = 0  # rank 0's, as last seen: its host may be the one lost
    detached = False
    with ProgressView(run, hosts, console) as view:
        try:
            while True:
                states = launch.states(run, hosts)
                rank0 = states[0]
                view.show(rank0)
                if rank0.progress:
                    last_update = rank0.progress.update
                running = [s for s in states if s.running]
                if not running:
                    # no wait for the copies under way: a restart that needs the controller's copy
                    # waits for that one alone (checkpoints.CONTROLLER_COPY)
                    survivors = elastic and why_stopped_early(states) and continue_without(
                        run, hosts, states, say=say("yellow"), at=last_update)
                    if not survivors:
                        break
                    hosts = survivors
                    guard.reset()
                    view.follow(hosts)
                    continue
                if len(running) < len(states):
                    if guard.stopped_the_rest(hosts, states) and not elastic:
                        break
                elif rejoin is not None and (grown := rejoin.step(hosts, rank0.progress)):
                    hosts = grown
                    guard.reset()
                    view.follow(hosts)
                    continue
                copies.maybe_start(hosts, rank0.progress.saved if rank0.progress else None)
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
            copies.final(hosts)
    except KeyboardInterrupt:
        copies.leave()
        console.print("the checkpoint copy was left unfinished: the hosts keep theirs; its partial file is removed")
        detached = True
    if detached:
        return launch.states(run, hosts)
    moved = checkpoints.through_controller["bytes"]
    console.print(f"checkpoints through the controller: {moved / 1e6:,.0f} MB (--backup {copies.policy})",
                  markup=False)
    return launch.states(run, hosts)
