"""Progress of prepare-data's stages: counts and ETA, from the machine doing the work.

A stage runner reports through a `Progress`. `Lines` prints one machine-readable line per
update (at most one a second per stage), so that a controller that runs the pipeline on a host
over ssh can draw it (`render`); `Bars` draws it here with rich; `Silent` says nothing.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterable

from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.progress import Progress as RichProgress

PREFIX = "@@tandem-progress "


class Silent:
    """The interface: a stage starts (with its total when known), advances, finishes."""

    def start(self, stage: str, total: int | None = None, unit: str = "lines", done: int = 0) -> None:
        pass

    def advance(self, n: int) -> None:
        pass

    def finish(self) -> None:
        pass

    def close(self) -> None:
        pass


class Lines(Silent):
    """`@@tandem-progress {"stage": ..., "done": N, "total": T, "unit": ..., "state": ...}` lines."""

    def __init__(self, out=None, every_s: float = 1.0):
        self.out, self.every_s = out or sys.stdout, every_s
        self.stage, self.total, self.unit, self.done, self.said = "", None, "lines", 0, 0.0

    def start(self, stage, total=None, unit="lines", done=0):
        self.stage, self.total, self.unit, self.done = stage, total, unit, done
        self._say("run")

    def advance(self, n):
        self.done += n
        if time.monotonic() - self.said >= self.every_s:
            self._say("run")

    def finish(self):
        self._say("done")

    def _say(self, state: str) -> None:
        event = {"stage": self.stage, "done": self.done, "total": self.total, "unit": self.unit, "state": state}
        self.out.write(PREFIX + json.dumps(event) + "\n")
        self.out.flush()
        self.said = time.monotonic()


def parse(line: str) -> dict | None:
    """The event a progress line carries; None for any other line."""
    if not line.startswith(PREFIX):
        return None
    try:
        return json.loads(line[len(PREFIX):])
    except ValueError:
        return None


class Bars(Silent):
    """One rich bar per stage, with count, rate and ETA; `show` takes the events `Lines` prints."""

    def __init__(self, console=None, host: str = ""):
        self.host = f"{host}: " if host else ""
        self.bars = RichProgress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[unit]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                                 console=console, transient=False)
        self.tasks: dict[str, int] = {}
        self.current = ""
        self.bars.start()

    def show(self, event: dict) -> None:
        stage = event["stage"]
        if stage not in self.tasks:
            self.tasks[stage] = self.bars.add_task(self.host + stage, total=event.get("total"),
                                                   unit=event.get("unit", ""))
        task = self.tasks[stage]
        self.bars.update(task, completed=event["done"], total=event.get("total"))
        if event.get("state") == "done":
            self.bars.update(task, total=event["done"], completed=event["done"])

    def start(self, stage, total=None, unit="lines", done=0):
        self.current = stage
        self.done, self.total, self.unit = done, total, unit
        self.show({"stage": stage, "done": done, "total": total, "unit": unit})

    def advance(self, n):
        self.done += n
        self.show({"stage": self.current, "done": self.done, "total": self.total, "unit": self.unit})

    def finish(self):
        self.show({"stage": self.current, "done": self.done, "total": self.total, "unit": self.unit,
                   "state": "done"})

    def close(self):
        self.bars.stop()


def render(lines: Iterable[str], console, host: str = "") -> list[str]:
    """Draw the progress lines of a stage runner (e.g. its ssh stdout, line by line) as bars;
    the other lines are printed as they are and returned."""
    bars, other = Bars(console, host), []
    try:
        for line in lines:
            event = parse(line.rstrip("\n"))
            if event is None:
                other.append(line.rstrip("\n"))
                console.print(other[-1], markup=False, highlight=False)
            else:
                bars.show(event)
    finally:
        bars.close()
    return other
