"""`fab --hosts a,b TASK`: one call of TASK with the hosts in the order given (train.tasks)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

TOP = Path(__file__).resolve().parents[3]
FAB = str(Path(sys.executable).parent / "fab")


def fab(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "FABRIC_INVENTORY": "inventory/hosts.yml", "COLUMNS": "400"}
    return subprocess.run([FAB, *args], cwd=TOP, capture_output=True, text=True, timeout=120, env=env)


def test_hosts_given_to_fab_make_one_run_in_their_order():
    out = fab("--hosts", "v100b,v100a", "train", "--new", "--dry-run").stdout
    lines = [line for line in out.splitlines() if re.match(r"^v100[ab]: ", line)]
    assert [line[:5] for line in lines] == ["v100b", "v100a"]  # once each: one call, not one per host
    assert len({re.search(r"runs/(run-[0-9-]+)", line).group(1) for line in lines}) == 1
    assert "--node_rank 0 --master_addr 203.0.113.11" in lines[0]  # v100b is rank 0, the rendezvous


def test_without_hosts_every_inventory_host_takes_part_and_a_stranger_is_named():
    out = fab("train", "--new", "--dry-run").stdout  # --new: whatever the latest run in reports/ was
    assert [line[:5] for line in out.splitlines() if line[:5] in ("v100a", "v100b")] == ["v100a", "v100b"]
    proc = fab("train", "--hosts", "v100c", "--new", "--dry-run")
    assert proc.returncode == 1 and "unknown host v100c: the inventory has v100a, v100b" in proc.stdout
