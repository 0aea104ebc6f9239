"""Following a run from the controller: a live progress bar from rank 0's log.

Ctrl-C detaches (the training goes on). Every `backup_every` seconds the last and best
checkpoints are copied off the rank-0 host, so losing its disk loses no training. When a
rank stops, the others are stopped too: a half-dead job only holds GPUs and ports.
"""

from __future__ import annotations

import time

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from ..cluster import ClusterError, Host
from ..report import logparse
from ..tasks import console
from . import launch


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
           dead_grace_s: float = 30.0) -> list[launch.HostState]:
    """Show progress until every rank has stopped; returns the final states."""
    last_backup = time.monotonic()
    dead_since: float | None = None
    with Progress(TextColumn(f"[bold]{run.run_id}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[info]}"), console=console, transient=False) as bar:
        task = bar.add_task("train", total=run.max_update, info="starting")
        try:
            while True:
                states = launch.states(run, hosts)
                rank0 = states[0]
                if rank0.progress:
                    bar.update(task, completed=rank0.progress.update, info=describe(rank0.progress))
                running = [s for s in states if s.running]
                if not running:
                    break
                if len(running) < len(states):
                    # A rank is gone. The survivors usually fail on their own within seconds;
                    # if not, stop them so nothing hangs on a dead peer.
                    dead_since = dead_since or time.monotonic()
                    if time.monotonic() - dead_since > dead_grace_s:
                        gone = ", ".join(s.name for s in states if not s.running)
                        console.print(f"[red]rank on {gone} stopped; stopping the others[/]")
                        launch.stop(run, hosts)
                        break
                if time.monotonic() - last_backup > backup_every_s:
                    _backup(run, hosts)
                    last_backup = time.monotonic()
                time.sleep(poll_s)
        except KeyboardInterrupt:
            console.print(f"detached; {run.run_id} goes on. `fab status`, `fab logs`, `fab stop`.")
            return launch.states(run, hosts)
    _backup(run, hosts)
    return launch.states(run, hosts)


def _backup(run: launch.Run, hosts: list[Host]) -> None:
    try:
        launch.share_checkpoint(run, hosts)
    except ClusterError as err:
        console.print(f"[yellow]checkpoint copy failed (training goes on): {err}[/]")
