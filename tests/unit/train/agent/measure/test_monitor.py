"""The sampler beside the training: what it watches and what it refuses."""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import psutil

from train.agent.measure import monitor
from train.recipe import logformat


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
    end = logformat.rank_end([line, *TORCHRUN_REPORT.splitlines()])
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


def test_a_peer_silent_45_s_ends_this_hosts_ranks_and_says_why(tmp_path, spawn):
    """The peer answers, then stops: judged lost once silent `after_s` (not before, and not while
    it answers however long a collective takes); this host's ranks end, the cause in train.log."""
    said = {"10.0.0.2": True}
    watch = monitor.PeerWatch(["10.0.0.2"], after_s=45, every_s=5, answers=lambda peer: said[peer],
                              log_path=tmp_path / "train.log")
    assert watch.check(now=0.0) is None  # answers: armed
    said["10.0.0.2"] = False
    assert watch.check(now=10.0) is None and watch.check(now=50.0) is None
    assert watch.check(now=55.0) == "10.0.0.2"
    rank = spawn([sys.executable, "-c", "import time; time.sleep(60)"])
    watch.end_ranks([rank.pid], "10.0.0.2")  # psutil reaps it: gone is what counts
    assert not psutil.pid_exists(rank.pid) or psutil.Process(rank.pid).status() == psutil.STATUS_ZOMBIE
    line = (tmp_path / "train.log").read_text().strip()
    end = logformat.rank_end([line])
    assert end.how == "ended by tandem's watchdog: peer 10.0.0.2 silent 45 s" and end.peer_gone


def test_a_peer_that_never_answered_ends_nothing():
    """A firewall dropping the probe from the start is not a lost host."""
    watch = monitor.PeerWatch(["10.0.0.2"], after_s=45, every_s=5, answers=lambda peer: False)
    assert all(watch.check(now=float(t)) is None for t in range(0, 600, 5))


def test_a_host_that_refuses_the_port_is_up():
    assert monitor.tcp_answers("127.0.0.1", port=1, timeout_s=2)  # refused: the host is up


def test_a_monitor_ends_once_a_restart_wrote_another_pid(tmp_path, spawn):
    """An elastic restart starts a new world (its own monitor, the survivors as peers) in the same
    save dir: the old monitor must not judge it by the old peers."""
    save_dir = str(tmp_path / "checkpoints")
    rank = spawn([sys.executable, "-c", "import time; time.sleep(30)", "--save-dir", save_dir])
    pid_file = tmp_path / "train.pid"
    pid_file.write_text("1111\n")
    argv = ["--out", str(tmp_path / "s.jsonl"), "--nic", "lo", "--watch", save_dir, "--interval", "0.2",
            "--pid-file", str(pid_file)]
    import threading
    threading.Timer(1.0, lambda: pid_file.write_text("2222\n")).start()
    started = time.monotonic()
    assert monitor.main(argv) == 0
    assert time.monotonic() - started < 10 and rank.poll() is None  # ended itself, touched nothing
