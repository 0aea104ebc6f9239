"""`fab --hosts a,b TASK`: one call of TASK with the hosts in the order given (train.cli.executor)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

TOP = Path(__file__).resolve().parents[4]
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
    assert proc.returncode == 2 and "--hosts: unknown host v100c: the inventory has v100a, v100b" in proc.stderr


def test_prepare_data_from_a_misaligned_source_says_which_file_before_touching_a_host(tmp_path):
    """inventory/hosts.yml's hosts do not exist: the corpus must be refused before any is reached."""
    src = tmp_path / "corpus"
    src.mkdir()
    for split in ("train", "valid"):
        (src / f"{split}.en").write_text("a house\nthe car\none more\n")
        (src / f"{split}.de").write_text("ein Haus\ndas Auto\n")
    env = {**os.environ, "FABRIC_INVENTORY": "inventory/hosts.yml", "COLUMNS": "400",
           "TANDEM_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run([FAB, "prepare-data", "--source", str(src)], cwd=TOP, capture_output=True, text=True,
                          timeout=120, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert f"error: {src}/train.en: 3 lines but {src}/train.de has 2: the two sides of train must be line-aligned" \
        in out
    assert "Traceback" not in out and "uploading" not in out
