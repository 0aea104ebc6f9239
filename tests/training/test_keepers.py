"""The hosts keep a run alive by themselves (train.agent.keeper.loop), on the real lab: a laptop that loses
a host or its own network changes nothing; a detached run goes on without a host whose cables are
pulled and takes it back when they are plugged in; rank 0's host rebooted comes back by itself.
Each scenario prints its measured times (docs/training.md, "What happens when...")."""

from __future__ import annotations

import os
import re
import subprocess
import time

import pytest
from labtools import TOP, fab, set_links, ssh

FAB = str(TOP / ".venv/bin/fab")


def ranks(cfg, host: str, run_id: str) -> set[str]:
    """The pids of the run's ranks on `host` (torchrun and its workers, each naming the run's save dir): not
    a copy that reads the checkpoints (the follower's backup, a peer's fetch), which comes and goes (CI, 29 Nov)."""
    pattern = f"(torchrun|torch[.]distributed[.]run|fairseq_train).*runs/{run_id}/checkpoint[s]"  # [s]: not itself
    out = ssh(cfg, host, f"pgrep -f '{pattern}' || true").stdout
    return set(out.split())


def timeline(cfg, host: str, run_id: str) -> list[dict]:
    import json
    out = ssh(cfg, host, f"cat /data/tandem/runs/{run_id}/keeper/timeline.jsonl 2>/dev/null || true").stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def ranks_started(cfg, host: str, run_id: str, generation: int) -> bool:
    """`host`'s keeper started its ranks for that generation (its own log says so)."""
    log = ssh(cfg, host, f"cat /data/tandem/runs/{run_id}/keeper/keeper.log 2>/dev/null || true").stdout
    return f"ranks of generation {generation} started" in log


def wait_for(what, timeout: float, every: float = 2.0):
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if what():
            return time.monotonic() - started
        time.sleep(every)
    raise AssertionError(f"not within {timeout:.0f} s: {what.__doc__}")


def update(cfg, run_id: str, host: str = "v100a") -> int:
    out = ssh(cfg, host, f"grep -o '\"num_updates\": \"[0-9]*' /data/tandem/runs/{run_id}/train.log | tail -1").stdout
    found = re.findall(r"\d+", out)
    return int(found[-1]) if found else 0


def follow_through(data_ready, run_id: str, outages: list[tuple[list[str], float]]) -> str:
    """`fab train` following a new run while the controller loses its management link to `hosts` for
    `seconds`, one outage after the other (the cluster network untouched); asserts the training
    processes are the same before and after and the follower still follows. Returns what it said."""
    cfg = data_ready.cfg
    env = {**os.environ, "FABRIC_INVENTORY": str(data_ready.inventory), "COLUMNS": "200"}
    follower = subprocess.Popen([FAB, "train", "--new", "--run", run_id, "--set", "max_update=100000"], cwd=TOP,
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: update(cfg, run_id) >= 30, 120)
        before = {h: ranks(cfg, h, run_id) for h in cfg.names}
        assert all(before.values()), before
        for hosts, seconds in outages:
            for h in hosts:
                subprocess.run(["ip", "link", "set", cfg.veth(h), "down"], check=True)
            time.sleep(seconds)
            for h in hosts:
                subprocess.run(["ip", "link", "set", cfg.veth(h), "up"], check=True)
        at = update(cfg, run_id)
        wait_for(lambda: update(cfg, run_id) > at + 20, 60)
        after = {h: ranks(cfg, h, run_id) for h in cfg.names}
        assert after == before, "a rank was restarted"
        assert follower.poll() is None, "the follower ended"
        assert [e["generation"] for e in timeline(cfg, "v100a", run_id)] == [1]
    finally:
        for h in cfg.names:
            subprocess.run(["ip", "link", "set", cfg.veth(h), "up"], check=False)
        fab(data_ready, "stop", "--run", run_id, check=False)
        out, _ = follower.communicate(timeout=120)
    assert "cannot reach any host from here" in out and "the hosts answer again after" in out, out[-3000:]
    return out


def test_a_laptop_that_loses_a_host_then_its_own_network_while_following_touches_nothing(data_ready):
    """(a) one host unreachable from the controller for 35 s, then the controller offline for 35 s (past the
    follower's back-off of 2+4+8+16 s: it asks again while offline; five minutes: the sweep below)."""
    run_id = time.strftime("run-laptop-%Y%m%d-%H%M%S")
    follow_through(data_ready, run_id, [(["v100b"], 35), (data_ready.cfg.names, 35)])
    print(f"followed {run_id} through 35 s without v100b's management link and 35 s offline: same ranks")


@pytest.mark.sweep
def test_a_following_laptop_offline_for_five_minutes_reconnects_and_the_run_was_never_touched(data_ready):
    """(d) ~6 min: a sweep (`make bench-targets`), not `make test`; the same path as (a)'s minute."""
    run_id = time.strftime("run-offline-%Y%m%d-%H%M%S")
    out = follow_through(data_ready, run_id, [(data_ready.cfg.names, 300)])
    back = re.search(r"the hosts answer again after (\d+) s", out)
    print(f"followed {run_id} through 300 s offline: same ranks; it said so, and reconnected "
          f"({back.group(0) if back else '?'})")


@pytest.mark.extra(covered_by="test_agreement_lab.py: the split (a host lost, both sides on, the reunion), the "
                              "corrupt copy (rank 0's host rebooted)")
def test_a_detached_run_goes_on_without_a_lost_host_takes_it_back_and_survives_rank_0s_reboot(data_ready):
    cfg = data_ready.cfg
    run_id = time.strftime("run-keepers-%Y%m%d-%H%M%S")
    fab(data_ready, "train", "--new", "--detach", "--run", run_id, "--set", "max_update=100000")
    try:
        wait_for(lambda: update(cfg, run_id) >= 60, 120)  # a checkpoint (every 50) made and replicated
        set_links(cfg, "v100b", "down")
        alone = wait_for(lambda: any(e["hosts"] == ["v100a"] for e in timeline(cfg, "v100a", run_id))
                         and ranks(cfg, "v100a", run_id), 180)
        at = update(cfg, run_id)
        wait_for(lambda: update(cfg, run_id) > at, 60)  # training again, alone
        asked = time.monotonic()  # fab status names the host it cannot reach, without waiting out SSH
        status = fab(data_ready, "status", "--run", run_id, check=False)
        assert status.returncode != 0 and re.search(r"v100b\s*│[^│]*│\s*unreachable", status.stdout), status.stdout
        assert time.monotonic() - asked < 30, f"fab status took {time.monotonic() - asked:.0f} s"
        set_links(cfg, "v100b", "up")
        back = wait_for(lambda: any(e["hosts"] == ["v100a", "v100b"] and e["generation"] > 1
                                    for e in timeline(cfg, "v100a", run_id)), 300)
        joined = timeline(cfg, "v100a", run_id)[-1]
        back = max(back, wait_for(lambda: ranks_started(cfg, "v100b", run_id, joined["generation"])
                                  and ranks_started(cfg, "v100a", run_id, joined["generation"]), 120))
        assert "v100b rejoined" in joined["why"], joined
        started, rebooted = time.monotonic(), time.time()
        subprocess.run([str(TOP / ".venv/bin/python"), "-m", "lab", "--prefix", cfg.prefix, "reboot", "v100a",
                        "--down-for", "40"], cwd=TOP, check=True, capture_output=True)
        def v100b_alone():
            """v100b trains alone, after the rejoin"""
            return [e for e in timeline(cfg, "v100b", run_id) if e["hosts"] == ["v100b"]
                    and e["generation"] > joined["generation"]]

        wait_for(v100b_alone, 180)
        survivor = v100b_alone()[-1]
        rank0_lost = survivor["time"] - rebooted  # v100b's keeper decided it while v100a was still off
        assert survivor["source"] == "v100b" and survivor["from_update"] >= joined["from_update"], survivor
        wait_for(lambda: any(e["hosts"] == ["v100a", "v100b"] and e["generation"] > survivor["generation"]
                             for e in timeline(cfg, "v100b", run_id)) and ranks(cfg, "v100a", run_id), 300)
        rebooted_back = time.monotonic() - started
        status = fab(data_ready, "status", "--run", run_id, check=False).stdout
        for said in ("v100b lost at update", "v100b rejoined at update", "v100a lost at update",
                     "v100a rejoined at update"):
            assert said in status, status
    finally:
        set_links(cfg, "v100b", "up")
        stopped = fab(data_ready, "stop", "--run", run_id, check=False)
    left = {h: ssh(cfg, h, f"ps -o pid,user,lstart,args -p $(pgrep -d, -f 'runs/{run_id}/checkpoint[s]') "
                           f"2>/dev/null; tail -5 /data/tandem/runs/{run_id}/keeper/keeper.log").stdout
            for h in cfg.names if ranks(cfg, h, run_id)}
    assert not left, f"{stopped.stdout}{stopped.stderr}\n{left}"
    print(f"cables of v100b pulled: v100a trained alone after {alone:.0f} s; plugged back: v100b training again "
          f"after {back:.0f} s; v100a rebooted (off 40 s): v100b alone after {rank0_lost:.0f} s, both training "
          f"again {rebooted_back - 40:.0f} s after v100a's boot")
