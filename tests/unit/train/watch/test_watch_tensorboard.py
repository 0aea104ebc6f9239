"""fab tensorboard's host-side lines run by a real shell: started detached on 127.0.0.1, ready once
it answers, a failed start reported at once (not after the whole wait), stopped with its group.
A stand-in `tensorboard` (Python's http.server) takes the real one's place: the controller's venv
has none; the lab test runs the real one."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from train.watch.tensorboard import free_port_command, ready_command, start_command, stop_command


def sh(command: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=timeout)


def venv_with(tmp_path: Path, tensorboard: str) -> Path:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    script = venv / "bin" / "tensorboard"
    script.write_text("#!/bin/bash\n" + tensorboard)
    script.chmod(0o755)
    return venv


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def test_started_on_loopback_ready_then_stopped(tmp_path):
    serve = ('echo "$@" > "$(dirname "$0")/args"; while [ "$1" != --port ]; do shift; done\n'
             'exec "$(dirname "$0")/python" -m http.server --bind 127.0.0.1 "$2"\n')
    venv, run = venv_with(tmp_path, serve), tmp_path / "run"
    python = f"{venv}/bin/python"
    port = int(sh(free_port_command(python)).stdout)
    assert sh(start_command(str(venv), str(run), port)).returncode == 0
    pid = int((run / "tensorboard.pid").read_text())
    try:
        started = time.monotonic()
        assert sh(ready_command(python, str(run), port, 20)).returncode == 0
        assert time.monotonic() - started < 20 and (run / "tensorboard").is_dir()
        args = (venv / "bin" / "args").read_text().split()
        assert args[args.index("--host") + 1] == "127.0.0.1"  # the host's loopback only
        assert args[args.index("--logdir") + 1] == f"{run}/tensorboard"
    finally:
        assert sh(stop_command(str(run))).returncode == 0
    deadline = time.monotonic() + 10
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(pid) and not (run / "tensorboard.pid").exists()


def test_a_tensorboard_that_cannot_start_is_reported_at_once(tmp_path):
    venv, run = venv_with(tmp_path, "echo 'No module named tensorboard' >&2; exit 1\n"), tmp_path / "run"
    python = f"{venv}/bin/python"
    assert sh(start_command(str(venv), str(run), 1)).returncode == 0
    started = time.monotonic()
    assert sh(ready_command(python, str(run), 1, 60)).returncode == 1
    assert time.monotonic() - started < 10
    assert "No module named tensorboard" in (run / "tensorboard.out").read_text()
    sh(stop_command(str(run)))
