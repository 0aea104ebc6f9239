"""The sampler beside the training: what it watches and what it refuses."""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import psutil

from train.agent import monitor
from train.report import logparse


def test_it_follows_the_run_by_its_save_dir_and_writes_samples(tmp_path, spawn):
    save_dir = str(tmp_path / "checkpoints")
    spawn([sys.executable, "-c", "import time; time.sleep(3)", "--save-dir", save_dir])
    assert monitor.save_dir_pids(save_dir) and not monitor.save_dir_pids(save_dir + "-other")
    out = tmp_path / "samples.jsonl"
    assert monitor.main(["--out", str(out), "--nic", "lo", "--watch", save_dir, "--interval", "0.5"]) == 0
    samples = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(samples) >= 2 and all(s["nic"] == "lo" and s["tx_Bps"] >= 0 for s in samples)
    assert samples[0]["gpus"] is None  # no NVML here: absent, not 0


def test_a_nic_the_host_lacks_is_named_not_sampled_silently(tmp_path, capsys):
    code = monitor.main(["--out", str(tmp_path / "s.jsonl"), "--nic", "ens99", "--watch", str(tmp_path)])
    assert code == 2 and "no NIC ens99 to sample" in capsys.readouterr().err
    assert not (tmp_path / "s.jsonl").exists()


def test_a_process_of_the_run_left_stopped_is_killed_and_the_kill_written_to_the_log(tmp_path, spawn):
    """A frozen rank (SIGSTOP) is killed once it has been stopped `after_s`, not before; a running
    one is never touched. The line in train.log is what `fab status` reads."""
    frozen = spawn([sys.executable, "-c", "import time; time.sleep(60)"])
    running = spawn([sys.executable, "-c", "import time; time.sleep(60)"])
    os.kill(frozen.pid, signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while psutil.Process(frozen.pid).status() != psutil.STATUS_STOPPED and time.monotonic() < deadline:
        time.sleep(0.05)
    log = tmp_path / "train.log"
    watch = monitor.FrozenWatch(after_s=60, log_path=log)
    assert watch.check([frozen.pid, running.pid], now=1000.0) == []
    assert watch.check([frozen.pid, running.pid], now=1059.0) == []
    assert watch.check([frozen.pid, running.pid], now=1060.0) == [frozen.pid]
    assert frozen.wait(timeout=10) == -signal.SIGKILL
    assert running.poll() is None
    line = log.read_text().strip()
    assert f"process {frozen.pid} of the run was stopped (frozen) for 60 s; killed it" in line
    end = logparse.rank_end([line, *TORCHRUN_REPORT.splitlines()])
    assert end.how == "frozen (stopped 60 s), killed by tandem's watchdog"


TORCHRUN_REPORT = """\
Root Cause (first observed failure):
[0]:
  time      : 2026-11-23_09:30:00
  host      : v100b
  rank      : 1 (local_rank: 0)
  exitcode  : -9 (pid: 123)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 123"""
