"""Checkpoints of a real run's size (>= 500 MB, the base preset's is 744 MB) on the lab: rank 0's host
is lost while its checkpoint is being copied to the controller; v100b goes on from the copy it got
host to host (no wait for the controller's copy, no byte of it through the controller), grows back
to v100a in the middle of an epoch, and finishes. Prints the time from the loss to training again
and the bytes that went through the controller.

The model is the tiny preset with learned positional embeddings over 350k positions (2 x 350k x 64
parameters): 47M parameters, a 0.57 GB checkpoint with Adam's state, while each update costs what
the tiny preset's does (a lookup, not a matmul): a few updates on 2 shared CPU cores, not hours."""

from __future__ import annotations

import contextlib
import re
import subprocess
import time
from pathlib import Path

import pytest
from labtools import TOP, fab, set_links, ssh
from test_three_hosts import Follower
from test_train import QUICK_HEARTBEAT, RUNS, inner_records, log_of

RUN = time.strftime("run-gb-%Y%m%d-%H%M%S")
SAVE_EVERY = 6
MAX_UPDATE = 24
BIG = ("encoder_learned_pos=true,decoder_learned_pos=true,max_source_positions=350000,"
       "max_target_positions=350000")
# the lab's /data has ~4 GB: 4 files of 0.66 GB (last, best, one interval, one being written), not the preset's 9
SETTINGS = (f"{BIG},keep_best_checkpoints=0,max_update={MAX_UPDATE},save_interval_updates={SAVE_EVERY},"
            f"log_interval=1,{QUICK_HEARTBEAT}")


def checkpoint_bytes(cfg, name: str) -> int:
    out = ssh(cfg, name, f"stat -c %s {RUNS}/{RUN}/checkpoints/checkpoint_last.pt 2>/dev/null || echo 0").stdout
    return int(out.split()[0])


def wait_for(condition, timeout: float, what: str, follower: Follower | None = None, poll_s: float = 1.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if follower is not None and follower.proc.poll() is not None:
            raise AssertionError(f"fab train ended before {what}:\n{follower.out[-4000:]}")
        if found := condition():
            return found
        time.sleep(poll_s)
    raise AssertionError(f"{what} not within {timeout:.0f} s")


LAPTOP_LINK = "100mbit"  # the controller's link to every host: a laptop's, not the cluster network's


@contextlib.contextmanager
def laptop_link(cfg):
    """Every host's link to the controller (eth0; the cluster network is another NIC) capped at
    LAPTOP_LINK with tc tbf, removed afterwards whatever happens."""
    try:
        for name in cfg.names:
            subprocess.run(["ip", "netns", "exec", cfg.netns(name), "tc", "qdisc", "replace", "dev", "eth0", "root",
                            "tbf", "rate", LAPTOP_LINK, "burst", "256kb", "latency", "200ms"], check=True)
        yield
    finally:
        for name in cfg.names:
            subprocess.run(["ip", "netns", "exec", cfg.netns(name), "tc", "qdisc", "del", "dev", "eth0", "root"],
                           capture_output=True)


def copying(local: Path) -> bool:
    """A copy of rank 0's checkpoint_last.pt to the controller under way (train.cluster.get_whole's
    temporary name, then the candidate checked for a rewrite before it replaces the copy)."""
    return any((local / name).exists() for name in (".checkpoint_last.pt.fetched.partial",
                                                    ".checkpoint_last.pt.fetched"))


def controller_rx_bytes(cfg) -> int:
    """Bytes the controller received from the hosts (its bridge; host-to-host traffic is on the cluster bridge)."""
    return int(Path(f"/sys/class/net/{cfg.bridge}/statistics/rx_bytes").read_text())


@pytest.mark.sweep
def test_losing_rank_0s_host_mid_copy_goes_on_host_to_host_and_grows_back_mid_epoch(data_ready):
    """~3 min: a sweep (`make bench-targets`), not `make test`."""
    cfg = data_ready.cfg
    local = TOP / "reports" / RUN / "checkpoints"
    received = controller_rx_bytes(cfg)
    with laptop_link(cfg):
        follower = Follower(data_ready, "train", "--new", "--run", RUN, "--set", SETTINGS)
        try:
            # v100b holds rank 0's first checkpoint (pushed host to host) while the controller's copy is under way
            size = wait_for(lambda: checkpoint_bytes(cfg, "v100b") if copying(local) else 0, 600,
                            "v100b holding rank 0's checkpoint with the controller's copy under way",
                            follower, poll_s=0.2)
            down = time.monotonic()
            set_links(cfg, "v100a", "down")
            again, lost = follower.wait_for(r"generation \d+: v100b from update (?P<resumed>\d+) \((?P<source>\S+)'s "
                                            r"checkpoint\), update-freq 2; v100a lost at update (?P<at>[\d,]+)", 600)
            resumed = int(lost.group("resumed"))
            wait_for(lambda: any(int(r["num_updates"]) > resumed for r in
                                 inner_records(log_of(cfg, "v100b", RUN).split("Loaded checkpoint")[-1])),
                     600, "v100b training again", follower)
            training_again = time.monotonic()
            set_links(cfg, "v100a", "up")
            _, back = follower.wait_for(r"generation \d+: v100a, v100b from update (\d+) \(\S+'s checkpoint\), "
                                        r"update-freq 1; v100a rejoined", 600)
            follower.proc.wait(timeout=900)
            follower.reader.join(timeout=10)
        finally:
            set_links(cfg, "v100a", "up")
            if follower.proc.poll() is None:
                follower.proc.kill()
                fab(data_ready, "stop", "--run", RUN, check=False)
            log = log_of(cfg, "v100a", RUN)
            remove_run(cfg, RUN)  # 2 GB of the lab's 3.9 GB /data on each host
    moved = controller_rx_bytes(cfg) - received
    out = follower.out
    grown = re.findall(r"Loaded checkpoint \S+ \(epoch (\d+) @ (\d+) updates\)", log)
    print(f"checkpoint {size / 1e6:.0f} MB, controller link {LAPTOP_LINK}: v100a lost with the controller's copy "
          f"under way at update {lost.group('at')} -> went on from {resumed} ({lost.group('source')}'s copy), "
          f"restart said in {again - down:.0f} s, training again in {training_again - down:.0f} s; "
          f"grew back at update {back.group(1)}; the controller received "
          f"{moved / 1e6:,.0f} MB from the hosts in all")
    assert follower.proc.returncode == 0, out[-4000:]
    assert lost.group("source") == "v100b", out[-3000:]  # its own copy, fetched host to host
    said = re.search(r"checkpoints through the controller: ([\d,]+) MB \(--backup every:60\)", out)
    assert said, out[-3000:]
    assert grown and int(grown[-1][1]) == int(back.group(1)), grown
    # mid-epoch: the grown run's first updates are of the epoch the checkpoint was saved in, not the next
    after = inner_records(log.split("Loaded checkpoint")[-1])
    assert after and int(after[0]["epoch"]) == int(grown[-1][0]), (grown[-1], after[:1])
    assert "done training" in log and f"{MAX_UPDATE}/{MAX_UPDATE}" in out
    # the first copy (cut short by the loss, so not counted), the end's: never the restart's
    assert int(said.group(1).replace(",", "")) <= 1.1 * size / 1e6, said.group(0)


def test_a_run_that_would_fill_a_hosts_disk_is_refused_naming_host_need_and_free(data_ready):
    """The same model with the preset's files kept (last, best, 5 best, 1 interval, 1 being written, 1 set aside):
    ~5 GB on each host, more than the lab's 3.9 GB /data: refused before anything starts."""
    proc = fab(data_ready, "train", "--new", "--run", time.strftime("run-full-%Y%m%d-%H%M%S"), "--set",
               f"{BIG},max_update={MAX_UPDATE}", check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    for name in ("v100a", "v100b"):
        found = re.search(rf"{name}: the run writes up to ([\d.]+) GB on /data \(10 checkpoint files of (0\.5\d) GB "
                          r"\+ [\d.]+ GB of logs and samples; any host may become rank 0 after a loss\), ([\d.]+) GB "
                          "free", out)
        assert found and float(found.group(1)) > float(found.group(3)), out[-3000:]
    print(" ".join(found.group(0).split()))


def test_evaluate_refuses_a_host_a_run_is_training_on(data_ready):
    """On a GPU host it takes a GPU no run trains on (train.run.gpu_choice, unit-tested); on the lab's
    CPU hosts a run training there is refused, named."""
    run_id = time.strftime("run-busy-%Y%m%d-%H%M%S")
    fab(data_ready, "train", "--new", "--run", run_id, "--detach", "--set", "max_update=3000,save_interval_updates=5")
    try:
        wait_for(lambda: checkpoint_bytes_of(data_ready.cfg, run_id), 300, "a first checkpoint")
        proc = fab(data_ready, "evaluate", "--run", run_id, "--checkpoint", "checkpoint_last.pt", check=False)
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0 and f"v100a: run {run_id} is training there (CPU host)" in out, out[-3000:]
    finally:
        fab(data_ready, "stop", "--run", run_id, check=False)
        remove_run(data_ready.cfg, run_id)


def remove_run(cfg, run_id: str) -> None:
    for name in cfg.names:
        ssh(cfg, name, f"rm -rf {RUNS}/{run_id}")


def checkpoint_bytes_of(cfg, run_id: str) -> int:
    out = ssh(cfg, "v100a", f"stat -c %s {RUNS}/{run_id}/checkpoints/checkpoint_last.pt 2>/dev/null || echo 0").stdout
    return int(out.split()[0])
