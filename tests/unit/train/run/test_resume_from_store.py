"""`fab train --resume-from URL`: which run and which copy (train.run.moved with
train.agent.offsite.copies). The store is a directory; rank 0's new host is this machine (its commands
run here, as a host runs them). Never another run than asked: several runs and no --run is refused
listing each; a copy of another preset is refused by name; a corrupt newest copy is said and the next
whole one taken; a copy's folder picks that copy."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pytest
from rich.console import Console

from train.agent.offsite import copies
from train.agent.offsite.target import parse
from train.cluster import ClusterError, Host, HostResult
from train.errors import OptionError
from train.hosts import paths
from train.recipe import record
from train.recipe.record import Run
from train.run import moved

NEW = [Host(name="new0", address="127.0.0.1", vars={"gpus": 1, "train_env_venv": sys.prefix})]


def here(hosts, command, timeout=None):
    """run_all with every host this machine: the command run by bash, as SSH runs it."""
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=timeout)
    return {h.name: HostResult(h.name, stdout=done.stdout, stderr=done.stderr, exited=done.returncode) for h in hosts}


@pytest.fixture
def world(tmp_path, monkeypatch):
    monkeypatch.setattr(moved, "run_all", here)
    monkeypatch.setattr(paths, "RUNS_ROOT", str(tmp_path / "hosts-runs"))
    monkeypatch.setattr(record, "REPORTS", tmp_path / "reports")
    (tmp_path / "share").mkdir()
    return tmp_path


def copy_of(tmp_path: Path, run_id: str, update: int, preset: str = "tiny", age_s: float = 0) -> None:
    """A whole copy of `run_id` at `update` in the share, made `age_s` ago by its hosts v100a, v100b."""
    src = tmp_path / "src" / run_id / str(update)
    src.mkdir(parents=True)
    (src / "checkpoint_last.pt").write_bytes(f"{run_id} {update} ".encode() * 500)
    run = Run(run_id=run_id, hosts=["v100a", "v100b"], preset=preset, overrides=[], dataset="synthetic")
    (src / "run.json").write_text(json.dumps(asdict(run)))
    made = copies.upload(parse(str(tmp_path / "share")), run_id, "last", update,
                         {n: src / n for n in ("checkpoint_last.pt", "run.json")},
                         facts={"preset": preset, "dataset": "synthetic", "hosts": ["v100a", "v100b"]})
    manifest = Path(made["where"]) / "manifest.json"
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "time": time.time() - age_s}))


def flip_a_byte(tmp_path: Path, run_id: str, update: int) -> None:
    stored = tmp_path / "share" / run_id / f"u{update}" / "checkpoint_last.pt"
    data = bytearray(stored.read_bytes())
    data[10] ^= 1
    stored.write_bytes(bytes(data))  # same size: a whole copy by its listing, not by its sha256


def console() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=200), out


def fetched(tmp_path: Path, run_id: str) -> Path:
    return tmp_path / "hosts-runs" / run_id / "checkpoints" / "checkpoint_last.pt"


def test_a_store_holding_several_runs_is_refused_without_run_listing_each(world):
    copy_of(world, "r-lost", 1200, age_s=120)
    copy_of(world, "exp-last-week", 50000, preset="transformer_wmt_en_de", age_s=7 * 86400)
    shown, out = console()
    with pytest.raises(OptionError) as refused:
        moved.adopt(str(world / "share"), None, NEW, shown)
    said = str(refused.value)
    assert refused.value.option == "--resume-from" and "holds copies of 2 runs" in said and "--run" in said
    assert "r-lost: update 1,200, 2 min old, tiny, synthetic, hosts v100a,v100b" in said
    assert "exp-last-week: update 50,000, 168.0 h old, transformer_wmt_en_de" in said
    assert not fetched(world, "r-lost").exists() and not fetched(world, "exp-last-week").exists()


def test_the_only_run_in_a_store_is_taken_and_a_copy_of_another_preset_refused_by_name(world):
    copy_of(world, "r-lost", 1200)
    shown, out = console()
    with pytest.raises(OptionError) as refused:
        moved.adopt(str(world / "share"), None, NEW, shown, {"preset": "transformer_wmt_en_de", "dataset": None})
    assert refused.value.option == "--preset"
    assert "transformer_wmt_en_de asked" in str(refused.value) and "r-lost" in str(refused.value)
    assert "tiny" in str(refused.value)
    run, copy = moved.adopt(str(world / "share"), None, NEW, shown, {"preset": "tiny", "dataset": "synthetic"})
    assert (run.run_id, copy["update"], run.hosts) == ("r-lost", 1200, ["new0"])
    assert fetched(world, "r-lost").read_bytes() == b"r-lost 1200 " * 500


def test_run_names_the_run_among_several_and_one_not_there_is_refused_listing_those_there(world):
    copy_of(world, "r-lost", 1200)
    copy_of(world, "exp-last-week", 50000)
    shown, _ = console()
    run, copy = moved.adopt(str(world / "share"), "r-lost", NEW, shown)
    assert (run.run_id, copy["update"]) == ("r-lost", 1200)
    with pytest.raises(ClusterError, match="(?s)holds no whole copy of r-gone; it holds:.*exp-last-week"):
        moved.adopt(str(world / "share"), "r-gone", NEW, shown)


def test_a_corrupt_newest_copy_is_said_and_the_next_whole_one_resumes(world):
    copy_of(world, "r-lost", 1100)
    copy_of(world, "r-lost", 1200)
    flip_a_byte(world, "r-lost", 1200)
    shown, out = console()
    run, copy = moved.adopt(str(world / "share"), "r-lost", NEW, shown)
    assert copy["update"] == 1100 and run.members[-1]["from_update"] == 1100
    assert fetched(world, "r-lost").read_bytes() == b"r-lost 1100 " * 500
    said = out.getvalue()
    assert "refused, not whole:" in said and "u1200/checkpoint_last.pt" in said and "sha256" in said
    assert "r-lost resumes from its next whole copy: update 1,100" in said


def test_a_copys_folder_resumes_that_copy_though_a_newer_one_is_there(world):
    copy_of(world, "r-lost", 1100)
    copy_of(world, "r-lost", 1200)
    shown, _ = console()
    run, copy = moved.adopt(str(world / "share" / "r-lost" / "u1100"), None, NEW, shown)
    assert (run.run_id, copy["update"]) == ("r-lost", 1100)
    assert fetched(world, "r-lost").read_bytes() == b"r-lost 1100 " * 500


def test_no_whole_copy_at_all_is_refused(world):
    copy_of(world, "r-lost", 1200)
    flip_a_byte(world, "r-lost", 1200)
    shown, _ = console()
    with pytest.raises(ClusterError, match="no whole copy of r-lost .*u1200"):
        moved.adopt(str(world / "share"), None, NEW, shown)
    assert not fetched(world, "r-lost").exists()
