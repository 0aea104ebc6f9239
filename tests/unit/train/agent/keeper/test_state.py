"""A run's processes on a host, found by the save directory on their command lines; stopping them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from train.agent.keeper import state, stop


def rank(spawn, run_dir, code: str = "import time; time.sleep(60)") -> subprocess.Popen:
    """A stand-in for a rank: a real process naming the run's save dir on its command line."""
    return spawn([sys.executable, "-c", code, "--save-dir", f"{run_dir}/checkpoints"])


@pytest.fixture
def run_dir(tmp_path):
    d = tmp_path / "runs" / "run-1"
    d.mkdir(parents=True)
    return d


def agent(module: str, *args: str) -> subprocess.CompletedProcess:
    """The module as fab runs it on a host: `python -m train.agent.X`."""
    return subprocess.run([sys.executable, "-m", f"train.agent.{module}", *map(str, args)],
                          capture_output=True, text=True, timeout=60)


def test_state_names_the_runs_processes_its_last_update_and_log_tail(run_dir, spawn):
    lines = [f'2026-11-22 08:16:{i:02d} | INFO | train_inner | {{"num_updates": "{i}", "loss": "5.1"}}'
             for i in range(1, 31)]
    (run_dir / "train.log").write_text("\n".join(lines) + "\ndone training\n")
    mine = rank(spawn, run_dir)
    other = rank(spawn, f"{run_dir}-2")  # another run whose directory shares the prefix
    answer = json.loads(agent("keeper.state", "--run", run_dir, "--tail", "5").stdout)
    assert answer["running"] and answer["pids"] == [mine.pid]
    assert answer["update"] == 30
    assert answer["tail"] == [*lines[-4:], "done training"]
    mine.kill()
    mine.wait()
    assert json.loads(agent("keeper.state", "--run", run_dir).stdout)["running"] is False
    assert other.poll() is None


def test_state_of_a_run_without_a_log_yet():
    answer = state.state("/nonexistent/run", lines=10)
    assert answer == {"running": False, "pids": [], "update": None, "tail": [], "stopped_by_user": False}


def test_a_worker_started_through_bash_c_is_found(run_dir, spawn):
    """torchrun with several GPUs runs each worker as `bash -c 'exec fairseq-train ... --save-dir X'`."""
    worker = spawn(["bash", "-c", f"sleep 60; : --save-dir {run_dir}/checkpoints --other"])
    # bash forks `sleep`: until the child has exec'd it still carries bash's command line (a busy
    # machine shows that moment), so the answer is read once the child is sleep
    deadline = time.monotonic() + 10
    while (found := state.run_pids(str(run_dir))) != [worker.pid] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert found == [worker.pid]


def test_stop_ends_the_run_with_sigterm(run_dir, spawn):
    ranks = [rank(spawn, run_dir), rank(spawn, run_dir)]
    out = agent("keeper.stop", "--run", run_dir, "--wait", "10")
    assert (out.returncode, out.stdout.strip()) == (0, "stopped")
    assert all(r.wait(timeout=5) is not None for r in ranks)
    assert state.run_pids(str(run_dir)) == []
    # `fab status` tells a run stopped on purpose from one that died
    assert state.state(str(run_dir))["stopped_by_user"] is True


def test_a_run_that_died_is_not_stopped_by_the_user(run_dir, spawn):
    victim = rank(spawn, run_dir)
    victim.kill()
    victim.wait()
    assert stop.stop(str(run_dir)) == "none" and state.state(str(run_dir))["stopped_by_user"] is False


def test_stop_kills_a_rank_that_ignores_sigterm(run_dir, spawn):
    stubborn = rank(spawn, run_dir, "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                              "print('ready', flush=True); time.sleep(60)")
    time.sleep(0.5)  # its handler is set
    started = time.monotonic()
    out = agent("keeper.stop", "--run", run_dir, "--wait", "1")
    assert (out.returncode, out.stdout.strip()) == (0, "killed")
    assert stubborn.wait(timeout=5) == -9 and time.monotonic() - started < 10


def test_stop_with_nothing_running_says_so(run_dir):
    assert stop.stop(str(run_dir)) == "none"


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("runuser"), reason="needs root, to be another user too")
def test_stop_as_a_login_user_names_a_run_another_user_started_and_signals_nothing(run_dir, spawn):
    """A cloud image's login user may signal only its own processes: a rank root (or a colleague) started
    is named with its owner and what to do, instead of a PermissionError's traceback."""
    os.chmod(run_dir, 0o777)
    other = rank(spawn, run_dir)
    top = Path(__file__).resolve().parents[5]
    out = subprocess.run(["runuser", "-u", "nobody", "--", "env", f"PYTHONPATH={top}", "/usr/bin/python3", "-m",
                          "train.agent.keeper.stop", "--run", str(run_dir), "--wait", "1"],
                         capture_output=True, text=True, timeout=60, cwd="/")
    assert out.returncode == 1, out.stderr
    assert out.stdout.strip() == (f"another user's processes: pid {other.pid} (root); nobody may not signal them: "
                                  f"stop the run as root, or `sudo kill -- {other.pid}`")
    assert other.poll() is None and not (run_dir / stop.STOPPED_MARK).exists()


def test_fab_stop_ends_the_runs_sampler_with_its_ranks_and_no_one_elses(tmp_path):
    """A sampler (train.agent.measure.monitor) whose ranks were stopped before it first saw them would wait out
    its start grace: `fab stop` ends it with the ranks; another run's sampler keeps going."""
    def sampler(run):
        return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "-m",
                                 "train.agent.measure.monitor",
                                 "--watch", f"{run}/checkpoints"])

    ours, theirs = sampler(tmp_path / "r1"), sampler(tmp_path / "r2")
    try:
        assert stop.stop(str(tmp_path / "r1")) == "none"
        assert ours.wait(timeout=10) != 0  # ended by SIGTERM
        assert theirs.poll() is None
    finally:
        for proc in (ours, theirs):
            proc.kill()
            proc.wait()
