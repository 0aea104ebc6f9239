"""fab train refuses an inventory that does not say a host's GPUs, or leaves it outside the `cluster` group
(train.cli.options.hosts_described): read as they stand, a GPU VM would be planned as a CPU host (gloo, fp32)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TOP = Path(__file__).resolve().parents[4]
FAB = str(Path(sys.executable).parent / "fab")


def train_dry_run(tmp_path: Path, inventory: str) -> subprocess.CompletedProcess:
    path = tmp_path / "hosts.yml"
    path.write_text(inventory)
    env = {**os.environ, "FABRIC_INVENTORY": str(path), "COLUMNS": "200"}
    return subprocess.run([FAB, "train", "--dry-run", "--new"], cwd=TOP, capture_output=True, text=True, timeout=120,
                          env=env)


@pytest.mark.parametrize(("inventory", "said"), [
    ("""all:
  children:
    cluster:
      hosts:
        gpu1: {ansible_host: 203.0.113.10, gpus: 1}
        gpu2: {ansible_host: 203.0.113.11}
""", "error: gpu2: the inventory gives no `gpus`: set how many GPUs the VM has (gpus: 0 for a CPU host); "
     "`fab init --check` shows what each host has"),
    ("""all:
  hosts:
    gpu1: {ansible_host: 203.0.113.10, gpus: 1}
    gpu2: {ansible_host: 203.0.113.11, gpus: 1}
""", "error: gpu1, gpu2: not in the inventory's `cluster` group: list the hosts that train under "
     "all.children.cluster.hosts, rank 0's first (as fab init writes)"),
])
def test_a_host_the_inventory_does_not_describe_is_refused_in_one_line_exit_2(tmp_path, inventory, said):
    proc = train_dry_run(tmp_path, inventory)
    assert (proc.returncode, proc.stderr.strip(), proc.stdout) == (2, said, "")  # no CPU/gloo plan printed
