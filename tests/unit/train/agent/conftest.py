"""Real processes standing in for a run's ranks, as the host-side agent finds them."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest


@pytest.fixture
def spawn():
    """spawn(argv) -> a started process, once its command line is readable in /proc (right after
    exec the kernel shows an empty one for a moment); every one is killed afterwards."""
    started: list[subprocess.Popen] = []

    def start(argv: list[str]) -> subprocess.Popen:
        proc = subprocess.Popen(argv)
        started.append(proc)
        deadline = time.monotonic() + 10
        while not Path(f"/proc/{proc.pid}/cmdline").read_bytes() and time.monotonic() < deadline:
            time.sleep(0.01)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
