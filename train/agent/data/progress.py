"""Progress of prepare-data's stages, from the host doing the work: `Lines` prints one
machine-readable line per update (at most one a second per stage), which the controller draws
(train/data/progress.py: bars with counts and ETA); `Silent` says nothing.
"""

from __future__ import annotations

import json
import sys
import time

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
