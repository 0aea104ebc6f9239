"""benchmarks/on_gpu.sh on a lent GPU machine: a missing kit is said at once, before the session's minutes go."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

TOP = Path(__file__).resolve().parents[3]


def test_a_missing_kit_stops_the_script_first_naming_make_gpu_kit(tmp_path):
    env = {**os.environ, "KIT": str(tmp_path / "kit"), "OUT": str(tmp_path / "out"), "WORK": str(tmp_path / "work")}
    done = subprocess.run(["bash", "benchmarks/on_gpu.sh"], cwd=TOP, env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "make gpu-kit" in done.stderr
    assert "== the machine" not in done.stdout  # nothing ran


def test_pack_refuses_an_out_folder_that_already_holds_files(tmp_path):
    """PACK=1 empties OUT into one archive at the end: OUT=. would have emptied the checkout."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    (tmp_path / "kit").mkdir()
    (tmp_path / "kit" / "MANIFEST.json").write_text("{}")  # past the kit's check
    env = {**os.environ, "KIT": str(tmp_path / "kit"), "OUT": str(out), "WORK": str(tmp_path / "work"), "PACK": "1"}
    done = subprocess.run(["bash", "benchmarks/on_gpu.sh"], cwd=TOP, env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and "already holds files" in done.stderr, done.stdout + done.stderr
    assert (out / "keep.txt").read_text() == "mine" and [p.name for p in out.iterdir()] == ["keep.txt"]
