"""The per-host lines under `fab train`'s progress bar: `fab watch`'s host rows in one line each
(GPU %, NIC Mbit/s against the link, CPU, s/update), read through the same feed and screen."""

from __future__ import annotations

import time
from dataclasses import asdict

from rich.progress import Progress
from rich.text import Text

from ..cluster import Host
from . import render, screen
from .feed import Feed


class HostLines:
    def __init__(self, run, hosts: list[Host], link_mbps: float | None = None):
        self.run, self.link_mbps, self.remote_dir = asdict(run), link_mbps, run.remote_dir
        self.feed = Feed(run.remote_dir, hosts)
        self.lines: list[Text] = []

    def refresh(self) -> None:
        try:
            shown = screen.build(self.run, self.feed.poll(), time.time(), self.link_mbps)
        except Exception as err:  # the lines are a view: they must never stop the following
            self.lines = [Text(f"  (host lines unavailable: {err})", style="dim")]
            return
        self.lines = [render.compact_line(row, shown) for row in shown.hosts]

    def follow(self, hosts: list[Host]) -> None:
        """The run's members changed (an elastic restart, a host grown back): show those now."""
        if [h.name for h in hosts] != [f.host.name for f in self.feed.hosts]:
            self.feed.close()
            self.feed = Feed(self.remote_dir, hosts)

    def close(self) -> None:
        self.feed.close()


class ProgressWithHosts(Progress):
    """rich's Progress, with the host lines below its bar."""

    def __init__(self, host_lines: HostLines, *columns, **kwargs):
        self.host_lines = host_lines  # before Progress's own init, which renders once
        super().__init__(*columns, **kwargs)

    def get_renderables(self):
        yield from super().get_renderables()
        yield from self.host_lines.lines
