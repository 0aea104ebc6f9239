"""Work on every core, in order: the data stages' batches of lines over forked processes."""

from __future__ import annotations

import multiprocessing
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def ordered_map(fn: Callable, jobs: Iterable, workers: int) -> Iterator:
    """fn over jobs on `workers` processes, results in order, at most 2 × workers jobs in flight
    (Pool.imap reads its whole input ahead: the corpus would end up in memory). Forked, not spawned:
    a spawned worker re-runs the caller's script when it has no __main__ guard."""
    if workers <= 1:
        yield from map(fn, jobs)
        return
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        pending: deque = deque()
        for job in jobs:
            pending.append(pool.apply_async(fn, (job,)))
            if len(pending) >= 2 * workers:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()
