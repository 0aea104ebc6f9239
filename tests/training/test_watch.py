"""Watching a run on the lab: `fab watch` under tmux, the host lines under `fab train`'s bar and
`fab tensorboard` through its tunnel, all on one short run whose link is capped at 10 Mbit/s."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from labtools import FAB, TOP, as_at_a_terminal, fab, ssh

RUNS = "/data/tandem/runs"
MAX_UPDATE = 60


def watch_env(provisioned) -> dict[str, str]:
    return {**os.environ, "FABRIC_INVENTORY": str(provisioned.inventory), "COLUMNS": "200"}


@pytest.fixture(scope="module")
def capped_run(provisioned):
    """`fab train` following a run started on a 10 Mbit/s link (accepted as network-bound), in the
    background: yields (run id, the fab process); the cap is lifted and the run stopped afterwards."""
    cfg = provisioned.cfg
    if any(ssh(cfg, n, "test -s /data/tandem/datasets/synthetic/MANIFEST.sha256").returncode for n in cfg.names):
        assert "identical on every host" in fab(provisioned, "prepare-data").stdout
    run_id = time.strftime("watch-%Y%m%d-%H%M%S")
    provisioned.shape("10mbit")
    proc = subprocess.Popen([FAB, "train", "--new", "--run", run_id, "--accept-slow-network", "--set",
                             f"max_update={MAX_UPDATE},log_interval=2"], cwd=TOP, env=watch_env(provisioned),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120  # preflight and the link's measurement first, then run.json
        while not (TOP / "reports" / run_id / "run.json").exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
            time.sleep(1)
        yield run_id, proc
    finally:
        provisioned.shape("none")
        if proc.poll() is None:
            fab(provisioned, "stop", "--run", run_id, check=False)
            proc.wait(timeout=60)


class Tmux:
    """`fab watch` in an 80x24 terminal on a tmux server of its own."""

    def __init__(self, provisioned, run_id: str):
        self.socket = f"tandem-watch-{os.getpid()}"
        subprocess.run(["tmux", "-L", self.socket, "new-session", "-d", "-s", "watch", "-x", "80", "-y", "24",
                        f"cd {TOP} && FABRIC_INVENTORY={provisioned.inventory} {FAB} watch --run {run_id}; "
                        "echo WATCH-ENDED $?; sleep 600"],
                       check=True)

    def screen(self) -> str:
        return subprocess.run(["tmux", "-L", self.socket, "capture-pane", "-p", "-t", "watch"],
                              capture_output=True, text=True, check=True).stdout

    def wait_for(self, condition, timeout: float, what: str) -> str:
        deadline = time.monotonic() + timeout
        while True:
            text = self.screen()
            if condition(text):
                return text
            if time.monotonic() > deadline or "WATCH-ENDED" in text:
                raise AssertionError(f"no {what} within {timeout:.0f} s; the screen:\n{text}")
            time.sleep(0.5)

    def ctrl_c(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "send-keys", "-t", "watch", "C-c"], check=True)

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], check=False)


def update_of(screen: str) -> int:
    match = re.search(r"update (\d+)/", screen)
    return int(match.group(1)) if match else -1


def host_line(screen: str, name: str) -> str:
    return next((line for line in screen.splitlines() if line.startswith(name + " ")), "")


def nic_mbps(line: str) -> float:
    match = re.search(r"↑\s*([0-9.]+) ↓\s*([0-9.]+)", line)
    return max(float(match.group(1)), float(match.group(2))) if match else 0.0


def sshd_pids(cfg, name: str) -> list[int]:
    """The lab host's sshd processes (listener and sessions), seen from this machine."""
    pids = subprocess.run(["ip", "netns", "pids", cfg.netns(name)], capture_output=True, text=True).stdout.split()
    return [int(p) for p in pids if Path(f"/proc/{p}/comm").exists() and Path(f"/proc/{p}/comm").read_text().strip()
            == "sshd"]


@pytest.fixture(scope="module")
def watched(provisioned, capped_run):
    run_id, _ = capped_run
    tmux = Tmux(provisioned, run_id)
    try:
        yield tmux
    finally:
        tmux.close()


def test_watch_shows_both_hosts_traffic_and_progress(watched):
    first = watched.wait_for(lambda s: update_of(s) >= 4 and all(nic_mbps(host_line(s, n)) > 0
                                                                 for n in ("v100a", "v100b")),
                             120, "update 4 with traffic on both NICs")
    assert "running  no GPU" in host_line(first, "v100a") and "running  no GPU" in host_line(first, "v100b")
    second = watched.wait_for(lambda s: update_of(s) > update_of(first), 20, "a later update")
    assert update_of(second) > update_of(first)
    assert all(len(line) <= 80 for line in second.splitlines())


def test_watch_says_network_bound_on_a_10mbit_link(watched):
    screen = watched.wait_for(lambda s: "⇒ network-bound: NIC at" in s, 60, "a network-bound verdict")
    link = re.search(r"link ([0-9.]+) Mbit/s: measured by iperf3 as this run started", screen)
    assert link and 5 < float(link.group(1)) < 15, screen


def test_a_host_whose_sshd_stops_is_unreachable_within_5_s_and_the_other_goes_on(provisioned, watched):
    """sshd frozen (SIGSTOP), not killed: on the lab it is the host's init's only child, its death
    ends the host. A frozen sshd answers nothing, as a host whose link or sshd died."""
    cfg = provisioned.cfg
    pids = sshd_pids(cfg, "v100b")
    assert pids
    before = watched.screen()

    def signal_all(sig: int) -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):  # a session that ended meanwhile
                os.kill(pid, sig)

    try:
        signal_all(signal.SIGSTOP)
        started = time.monotonic()
        gone = watched.wait_for(lambda s: "unreachable" in host_line(s, "v100b"), 5, "v100b unreachable")
        took = time.monotonic() - started
        print(f"v100b shown unreachable {took:.1f} s after its sshd stopped")
        assert "running" in host_line(gone, "v100a")
        later = watched.wait_for(lambda s: update_of(s) > update_of(before) and "unreachable" in s, 15,
                                 "v100a updating while v100b is unreachable")
        assert "running" in host_line(later, "v100a")
    finally:
        signal_all(signal.SIGCONT)  # also when the test failed: a frozen sshd would freeze the next tests
    watched.wait_for(lambda s: "running" in host_line(s, "v100b"), 20, "v100b back")


def test_ctrl_c_leaves_the_view_and_the_training_goes_on(provisioned, capped_run, watched):
    run_id, proc = capped_run
    watched.ctrl_c()
    watched.wait_for(lambda s: "WATCH-ENDED 0" in s, 10, "fab watch to end")
    assert proc.poll() is None, "the training ended with the view:\n" + proc.stdout.read()


def test_fab_train_shows_each_hosts_line_under_its_bar(provisioned, capped_run):
    run_id, proc = capped_run
    provisioned.shape("none")  # the rest of the run at full speed
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    assert f"{MAX_UPDATE}/{MAX_UPDATE}" in out, out
    for name in ("v100a", "v100b"):
        assert re.search(rf"^\s+{name} no GPU · NIC [0-9.]+ Mbit/s \(\d+% of link\) · CPU \d+%", out, re.M), out
    assert re.search(r"v100a no GPU .* · [0-9.]+ s/update", out), out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def test_tensorboard_through_the_tunnel_shows_the_runs_scalars(provisioned, capped_run):
    run_id, proc = capped_run
    if proc.poll() is None:
        proc.communicate(timeout=300)
    cfg = provisioned.cfg
    log = ssh(cfg, "v100a", f"cat {RUNS}/{run_id}/train.log").stdout
    logged = len(re.findall(r"\| train_inner \|", log))
    port = free_port()
    tb = subprocess.Popen([FAB, "tensorboard", "--run", run_id, "--port", str(port)], cwd=TOP,
                          env=watch_env(provisioned), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          preexec_fn=as_at_a_terminal)
    try:
        line = tb.stdout.readline()
        match = re.search(r"127\.0\.0\.1:(\d+) there\), forwarded over SSH: (http://127\.0\.0\.1:\d+/)", line)
        assert match, line + (tb.stdout.read() if tb.poll() is not None else "")
        remote, url = int(match.group(1)), match.group(2)
        tags = get_json(url + "data/plugin/scalars/tags")
        assert {"loss", "lr", "wps"} <= set(tags["train_inner"]) and "loss" in tags["valid"], tags
        for tag in ("loss", "lr"):
            steps = get_json(f"{url}data/plugin/scalars/scalars?run=train_inner&tag={tag}")
            assert len(steps) == logged, (tag, len(steps), logged)
        # a browser loads it through the tunnel
        page = subprocess.run(["chromium", "--headless=new", "--no-sandbox", "--disable-gpu", "--dump-dom",
                               "--virtual-time-budget=5000", url], capture_output=True, text=True, timeout=90).stdout
        assert "<tb-webapp" in page, page[:2000]
        # bound to rank 0's loopback only: its cluster address does not answer, from the other host
        probe = ssh(cfg, "v100b", f"timeout 5 bash -c 'echo > /dev/tcp/{cfg.peer_ip('v100a')}/{remote}' "
                                  "&& echo open || echo closed")
        assert probe.stdout.strip().endswith("closed"), probe.stdout + probe.stderr
        assert ssh(cfg, "v100a", f"timeout 5 bash -c 'echo > /dev/tcp/127.0.0.1/{remote}'").returncode == 0
    finally:
        tb.send_signal(signal.SIGINT)
        out, _ = tb.communicate(timeout=60)
    assert "stopping TensorBoard and the tunnel" in out, out
    assert ssh(cfg, "v100a", "pgrep -f 'bin/tensorboar[d]' || true").stdout.strip() == ""
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0, "the tunnel's port is still open"
