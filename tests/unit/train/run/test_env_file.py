"""Every job tandem starts on a host reads /etc/tandem/env first: where the inventory names no
cluster_nic, the NIC provisioning detected (an `ens5` VM) reaches NCCL, gloo and the monitor."""

from __future__ import annotations

import json
import shlex
import stat
import subprocess
import sys
import time
from pathlib import Path

from train.recipe.presets import resolve
from train.run.command import Launch, evaluation_command, monitor_command, reading_env_file, training_command

ENV = """# BEGIN network (roles/network)
NCCL_SOCKET_IFNAME=lo
GLOO_SOCKET_IFNAME=lo
TANDEM_CLUSTER_NIC=lo
# END network (roles/network)
"""


def _launch(tmp_path: Path, venv: Path, nic: str = "") -> Launch:
    env_file = tmp_path / "env"
    env_file.write_text(ENV)
    return Launch("r1", 1, 2, 0, "127.0.0.1", 29500, "/data/bin", str(tmp_path / "run/ckpt"),
                  str(tmp_path / "run/train.log"), nic, str(venv), env_file=str(env_file))


def _venv_with_recording_torchrun(tmp_path: Path) -> tuple[Path, Path]:
    """A venv whose torchrun records the environment it was given; its python is this one."""
    venv, record = tmp_path / "venv", tmp_path / "env.txt"
    (venv / "bin").mkdir(parents=True)
    torchrun = venv / "bin" / "torchrun"
    torchrun.write_text(f"#!/bin/bash\necho \"$NCCL_SOCKET_IFNAME $GLOO_SOCKET_IFNAME\" > {record}\n")
    python = venv / "bin" / "python"
    python.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} \"$@\"\n")
    for f in (torchrun, python):
        f.chmod(f.stat().st_mode | stat.S_IEXEC)
    return venv, record


def _wait_for(path: Path, seconds: float = 10) -> str:
    started = time.monotonic()
    while not (path.exists() and path.read_text()) and time.monotonic() - started < seconds:
        time.sleep(0.05)
    return path.read_text() if path.exists() else ""


def test_training_takes_the_nic_provisioning_detected(tmp_path):
    venv, record = _venv_with_recording_torchrun(tmp_path)
    launch = _launch(tmp_path, venv)
    subprocess.run(["bash", "-c", training_command(resolve("tiny"), launch)], check=True, timeout=10)
    assert _wait_for(record).split() == ["lo", "lo"]


def test_the_inventorys_cluster_nic_wins_over_the_file(tmp_path):
    venv, record = _venv_with_recording_torchrun(tmp_path)
    launch = _launch(tmp_path, venv, nic="ens5")
    subprocess.run(["bash", "-c", training_command(resolve("tiny"), launch)], check=True, timeout=10)
    assert _wait_for(record).split() == ["ens5", "ens5"]


def test_the_monitor_samples_the_nic_provisioning_detected_not_eth0(tmp_path):
    """The real monitor, started as training_command starts it, with no cluster_nic in the inventory."""
    venv, _ = _venv_with_recording_torchrun(tmp_path)
    launch = _launch(tmp_path, venv)
    (tmp_path / "run").mkdir()
    argv = [*monitor_command(launch), "--interval", "0.2", "--start-grace", "1"]
    done = subprocess.run(["bash", "-c", reading_env_file(launch.env_file) + shlex.join(argv)],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    samples = [json.loads(line) for line in (tmp_path / "run/samples.jsonl").read_text().splitlines()]
    assert samples and {s["nic"] for s in samples} == {"lo"}


def test_without_a_nic_anywhere_the_monitor_says_so_instead_of_guessing(tmp_path):
    done = subprocess.run([sys.executable, "-m", "train.agent.measure.monitor", "--out", str(tmp_path / "s.jsonl"),
                           "--watch", str(tmp_path)], capture_output=True, text=True, timeout=30,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(__file__).resolve().parents[4])})
    assert done.returncode == 2 and "cluster_nic" in done.stderr


def test_evaluation_reads_the_file_too():
    line = evaluation_command(data_dir="/d", checkpoint="/c.pt", reference="/r", out_dir="/o", venv="/v")
    assert line.startswith(reading_env_file("/etc/tandem/env"))
