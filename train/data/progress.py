"""prepare-data's progress on the controller: the `@@tandem-progress` lines of the host doing the
work (train/agent/data/progress.py), drawn as one rich bar per stage with count, rate and ETA."""

from __future__ import annotations

from collections.abc import Iterable

from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.progress import Progress as RichProgress

from ..agent.data.progress import PREFIX, Lines, Silent, parse  # noqa: F401 - the one definition


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


class CopyBars:
    """The host-to-host copy: one bar per receiver, the bytes of the dataset it holds so far against
    the dataset's size, with rate and ETA (a GB dataset over a slow cluster link is minutes)."""

    def __init__(self, console, source: str, receivers: list[str], total: int):
        self.total = total
        self.bars = RichProgress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                                 TransferSpeedColumn(), TimeElapsedColumn(), TimeRemainingColumn(),
                                 console=console, transient=False)
        self.tasks = {r: self.bars.add_task(f"copy {source} → {r}", total=total) for r in receivers}
        self.bars.start()

    def update(self, held: dict[str, int]) -> None:
        """`held`: {receiver: bytes of the dataset there now} (a receiver that did not answer: left as it was).
        Capped at the dataset's size: the files being replaced are counted until rsync renames."""
        for receiver, task in self.tasks.items():
            if receiver in held:
                self.bars.update(task, completed=min(held[receiver], self.total))

    def close(self, done: bool) -> None:
        if done:
            for task in self.tasks.values():
                self.bars.update(task, completed=self.total)
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
