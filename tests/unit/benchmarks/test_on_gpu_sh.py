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
