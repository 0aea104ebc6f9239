"""`fab stop` (train.run.stopping) never ends well while a host still trains, and names what it stopped: each
host is asked what still trains there in the stop's own SSH round (the listing run in a real shell against
real processes here); no lab."""

from __future__ import annotations

import subprocess
import sys

import pytest

from train.cluster import ClusterError, GroupResult, Host, HostResult
from train.hosts import paths
from train.recipe.record import Run
from train.run import launch, stopping

HOSTS = [Host("v100a", "10.0.0.1"), Host("v100b", "10.0.0.2")]
OLD = Run(run_id="run-20261125-090000", hosts=["v100a", "v100b"], preset="tiny", overrides=[], dataset="synthetic")


def rank(pid: int, run_id: str) -> str:
    """A line of `pgrep -af` for one of a run's ranks."""
    return (f"{pid} /opt/tandem/venv/bin/python -u -m fairseq_cli.train /data/tandem/datasets/wmt16/bin "
            f"--save-dir {paths.RUNS_ROOT}/{run_id}/checkpoints --max-tokens 4096\n")


def hosts_answer(monkeypatch, word: str, left: dict[str, str]) -> list[str]:
    """Each host stops with `word`, then lists `left[host]` as still training; the commands sent."""
    sent = []

    def run_all(hosts, command, timeout=None):
        sent.append(command)
        return GroupResult((h.name, HostResult(h.name, stdout=f"{word}\n{launch.LEFT_MARK}\n{left.get(h.name, '')}",
                                               exited=0)) for h in hosts)

    monkeypatch.setattr(launch, "run_all", run_all)
    return sent


def test_it_names_the_run_it_stopped_and_its_hosts_in_one_ssh_round(monkeypatch):
    sent = hosts_answer(monkeypatch, "stopped", {})
    said = []
    stopping.stop(OLD, HOSTS, named=False, say=said.append)
    assert said == ["v100a: stopped; no training process left", "v100b: stopped; no training process left",
                    "stopped run-20261125-090000 on v100a, v100b"]
    [command] = sent
    assert "keeper.loop stop --run /data/tandem/runs/run-20261125-090000" in command and "pgrep -af" in command


def test_another_run_still_training_fails_a_stop_that_named_no_run(monkeypatch):
    """The issue's case: the stale run "was not running", exit 0, while the hosts trained the real one."""
    hosts_answer(monkeypatch, "none", {"v100a": rank(41, "run-20261126-080102") + rank(42, "run-20261126-080102"),
                                       "v100b": rank(7, "run-20261126-080102")})
    said = []
    with pytest.raises(ClusterError) as err:
        stopping.stop(OLD, HOSTS, named=False, say=said.append)
    assert str(err.value) == ("stopped run-20261125-090000 on v100a, v100b, but run-20261126-080102 still trains on "
                              "v100a (pids 41, 42), v100b (pids 7): `fab stop --run run-20261126-080102` stops it")
    assert said[0] == "v100a: was not running; run-20261126-080102 still trains here (pids 41, 42)"


def test_with_run_named_another_runs_ranks_are_said_not_failed(monkeypatch):
    hosts_answer(monkeypatch, "stopped", {"v100b": rank(7, "bench-20261126")})
    said = []
    stopping.stop(OLD, HOSTS, named=True, say=said.append)
    assert said == ["v100a: stopped; no training process left", "v100b: stopped; bench-20261126 still trains here "
                    "(pids 7)", "stopped run-20261125-090000 on v100a, v100b"]


def test_the_runs_own_ranks_left_after_the_stop_fail_it_naming_the_host(monkeypatch):
    hosts_answer(monkeypatch, "stopped", {"v100b": rank(9, OLD.run_id)})
    said = []
    with pytest.raises(ClusterError, match=r"^run-20261125-090000 still trains on v100b \(pids 9\) after the stop"):
        stopping.stop(OLD, HOSTS, named=True, say=said.append)
    assert said[1] == "v100b: stopped; run-20261125-090000 still trains here (pids 9)"


def test_the_listing_finds_real_ranks_and_not_itself(tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "RUNS_ROOT", str(tmp_path / "runs"))
    save_dir = f"{tmp_path}/runs/run-x/checkpoints"
    ranks = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "--save-dir", save_dir])
             for _ in range(2)]
    try:
        listed = subprocess.run(["sh", "-c", launch.still_training()], capture_output=True, text=True, check=True)
        assert launch.left_runs(listed.stdout) == {"run-x": sorted(p.pid for p in ranks)}
    finally:
        for p in ranks:
            p.kill()
            p.wait()
    nothing = subprocess.run(["sh", "-c", launch.still_training()], capture_output=True, text=True, check=True)
    assert launch.left_runs(nothing.stdout) == {}


def test_a_host_the_run_lost_that_does_not_answer_is_named_apart(monkeypatch):
    run = Run(**{**OLD.__dict__, "hosts": ["v100a"], "order": ["v100a", "v100b"]})

    def run_all(hosts, command, timeout=None):
        return GroupResult({"v100a": HostResult("v100a", stdout=f"stopped\n{launch.LEFT_MARK}\n", exited=0),
                            "v100b": HostResult("v100b", error=TimeoutError("timed out"))})

    monkeypatch.setattr(launch, "run_all", run_all)
    said = []
    stopping.stop(run, HOSTS, named=False, say=said.append)
    assert said[-1] == "stopped run-20261125-090000 on v100a (v100b unreachable)"
