"""`fab watch`: the full-screen view, refreshed every `every_s` seconds until Ctrl-C.

Ctrl-C leaves the view only: the training goes on, nothing on the hosts is touched.
"""

from __future__ import annotations

import time

from rich.console import Console
from rich.live import Live

from ..cluster import Host, require_reachable
from . import render, screen
from .feed import CONNECT_S, Feed


def watch(run: dict, run_dir: str, hosts: list[Host], console: Console, every_s: float = 2.0,
          link_mbps: float | None = None, timeout_s: float | None = None, once: bool = False) -> screen.Screen | None:
    """Show the run until Ctrl-C (or one frame, printed, with `once`); returns the last screen. With
    `once`, no host answering raises ClusterError naming them (no frame)."""
    # a host that has not answered by the next refresh is shown unreachable in it
    # one frame waits for the connections; live frames don't wait past 3/4 of a refresh
    feed = Feed(run_dir, hosts, timeout_s=timeout_s or (CONNECT_S if once else every_s * 0.75))
    shown = None
    try:
        if once:
            readings = feed.poll()
            if not any(r.reachable for r in readings):  # a frame of nothing but "unreachable": not drawn
                require_reachable({r.name: r.error or "no answer" for r in readings})
            shown = screen.build(run, readings, time.time(), link_mbps)
            console.print(render.render(shown, console.size.width, console.size.height, every_s=None))
            return shown
        with Live(console=console, screen=True, auto_refresh=False, transient=True) as live:
            try:
                while True:
                    started = time.monotonic()
                    shown = screen.build(run, feed.poll(), time.time(), link_mbps)
                    live.update(render.render(shown, console.size.width, console.size.height, every_s),
                                refresh=True)
                    time.sleep(max(every_s - (time.monotonic() - started), 0.1))
            except KeyboardInterrupt:
                return shown
    finally:
        feed.close()
