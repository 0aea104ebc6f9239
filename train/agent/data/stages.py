"""prepare-data's stages: each is built under a temporary name and renamed when done, beside a
marker that records its inputs, so that a re-run continues from the last finished stage and a
re-run that changes nothing does nothing.

    ROOT/text/             ROOT/.text.done      {"key": ..., "info": ..., "seconds": ..., "peak_mb": ...}
    ROOT/text.partial/     (a stage under way, or killed: removed when the stage runs again)

A stage's key is the hash of what it was made from (its own settings and the previous stage's key):
a changed input, vocabulary size or filter makes that stage and the ones after it run again.
"""

from __future__ import annotations

import hashlib
import json
import resource
import shutil
import time
from collections.abc import Callable
from pathlib import Path


def key_of(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:32]


def peak_rss_mb() -> float:
    """The high-water mark of this process and of its largest finished child (Linux: KiB)."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return round(max(own, children) / 1024, 1)


class Stages:
    def __init__(self, root: Path):
        self.root = root
        self.ran: list[str] = []  # the stages this call built (the others were done already)

    def marker(self, name: str) -> Path:
        return self.root / f".{name}.done"

    def finished(self, name: str, key: str) -> dict | None:
        """The marker of `name` when it was made from `key` and its output is there."""
        try:
            record = json.loads(self.marker(name).read_text())
        except (OSError, ValueError):
            return None
        return record if record.get("key") == key and (self.root / name).exists() else None

    def any_finished(self) -> bool:
        return any(self.root.glob(".*.done"))

    def run(self, name: str, key: str, make: Callable[[Path], dict]) -> dict:
        """`make(dir)` fills a fresh directory and returns the figures to remember (JSON);
        skipped, returning them, when the stage was finished from the same key."""
        record = self.finished(name, key)
        if record is not None:
            return record["info"]
        partial, final = self.root / f"{name}.partial", self.root / name
        shutil.rmtree(partial, ignore_errors=True)
        self.marker(name).unlink(missing_ok=True)
        partial.mkdir(parents=True)
        started = time.monotonic()
        info = make(partial)
        shutil.rmtree(final, ignore_errors=True)
        partial.rename(final)
        record = {"key": key, "info": info, "seconds": round(time.monotonic() - started, 1), "peak_mb": peak_rss_mb()}
        temp = self.marker(name).with_suffix(".tmp")
        temp.write_text(json.dumps(record, indent=2))
        temp.rename(self.marker(name))
        self.ran.append(name)
        return info

    def timings(self) -> dict[str, dict]:
        """{stage: {"seconds", "peak_mb"}} of every finished stage (for the benchmark's table)."""
        out = {}
        for marker in sorted(self.root.glob(".*.done")):
            record = json.loads(marker.read_text())
            out[marker.name[1:-len(".done")]] = {"seconds": record["seconds"], "peak_mb": record["peak_mb"]}
        return out
