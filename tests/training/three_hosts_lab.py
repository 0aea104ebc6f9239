"""Helpers of the tests on the lab of three hosts (tests/training/conftest.py's `three_hosts`)."""

from __future__ import annotations

import json
import time

from labtools import fab, ssh
from test_train import QUICK_HEARTBEAT, RUNS


def start_on_three(three_hosts, name: str, settings: str = "") -> str:
    """A detached run of the three hosts (the dataset prepared on each), saving every 25 updates;
    `settings`: more of `--set`'s."""
    run_id = time.strftime(f"run-{name}-%Y%m%d-%H%M%S")
    assert "identical on every host" in fab(three_hosts, "prepare-data").stdout
    fab(three_hosts, "train", "--new", "--detach", "--run", run_id, "--set",
        f"max_update=100000,save_interval_updates=25,{QUICK_HEARTBEAT}" + (f",{settings}" if settings else ""))
    return run_id


def keeper_timeline(cfg, host: str, run_id: str) -> list[dict]:
    out = ssh(cfg, host, f"cat {RUNS}/{run_id}/keeper/timeline.jsonl").stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]
