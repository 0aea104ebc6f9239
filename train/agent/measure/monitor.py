"""The sampler that runs on every host beside the training (started and ended with it).

    python -m train.agent.measure.monitor --out RUN/samples.jsonl [--nic eth0] --watch RUN/checkpoints

Every `--interval` seconds it appends one JSON line: the cluster NIC's sent and received
bytes per second, CPU, memory, and per GPU its utilization and memory (NVML). Hosts
without an NVIDIA GPU report `"gpus": null` (absent), never zeros. It exits by itself once
no process of the run (found by the `--save-dir` on its command line) is left.

It is also the run's watchdog on this host: a process of the run that stays stopped (SIGSTOP, a
VM paused by its provider) for `--frozen-after` seconds is killed. Its peers' heartbeat has ended
them by then; a stopped process can end nothing itself and would hold the GPU and the port until
someone noticed. The kill is written to the run's train.log, so `fab status` names it. And a peer
host that stops answering on the cluster network for `--peer-lost-after` seconds (PeerWatch) ends
this host's ranks: a vanished host is noticed in under a minute even when the heartbeat, sized to
one collective's bytes on a slow link, is minutes long.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import time
from pathlib import Path

import psutil

from train.agent.keeper.state import save_dir_pids


def gpu_reader():
    """A function returning per-GPU samples, or None when there is no NVML/GPU here."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    except Exception:  # no driver, no library, no device: absent, not zero
        return None
    if not handles:
        return None

    def name(handle) -> str:  # the MFU table's key (train.plan.mfu); bytes from older pynvml
        raw = pynvml.nvmlDeviceGetName(handle)
        return raw.decode() if isinstance(raw, bytes) else str(raw)

    names = [name(h) for h in handles]

    def read() -> list[dict]:
        out = []
        for index, handle in enumerate(handles):
            util = pynvml.nvmlDeviceGetUtilizationRates(handle)
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
            out.append({"index": index, "name": names[index], "util_percent": float(util.gpu),
                        "mem_used_mb": mem.used / 2**20, "mem_total_mb": mem.total / 2**20})
        return out

    return read


STOPPED = (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)


class FrozenWatch:
    """Kills the processes of a run that stay stopped for `after_s` seconds (see the module's doc)."""

    def __init__(self, after_s: float, log_path: Path | None = None):
        self.after_s, self.log_path = after_s, log_path
        self.stopped_since: dict[int, float] = {}

    def check(self, pids: list[int], now: float | None = None) -> list[int]:
        """Look at the run's processes once; returns the pids killed now."""
        now = time.monotonic() if now is None else now
        stopped = set()
        for pid in pids:
            try:
                if psutil.Process(pid).status() in STOPPED:
                    stopped.add(pid)
            except psutil.Error:  # ended meanwhile
                continue
        self.stopped_since = {pid: self.stopped_since.get(pid, now) for pid in stopped}
        killed = []
        for pid in [pid for pid, since in self.stopped_since.items() if now - since >= self.after_s]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:  # ended meanwhile: nothing was killed
                continue
            killed.append(pid)
            self._say(f"tandem watchdog: process {pid} of the run was stopped (frozen) for "
                      f"{now - self.stopped_since.pop(pid):.0f} s; killed it (SIGKILL): its peers could not go on")
        return killed

    def _say(self, line: str) -> None:
        print(line, flush=True)
        if self.log_path is not None:
            with open(self.log_path, "a", encoding="utf-8") as log:
                log.write(line + "\n")


def tcp_answers(address: str, port: int = 22, timeout_s: float = 5.0) -> bool:
    """Whether `address` answers at all: a connection accepted or refused (the host is up either
    way); a timeout or an unreachable route is no answer. 5 s: a SYN dropped by a saturated slow
    link's queue is sent again at 1 s and 3 s (and a peer is judged lost only after 45 s of these)."""
    try:
        with socket.create_connection((address, port), timeout=timeout_s):
            return True
    except ConnectionRefusedError:
        return True
    except OSError:
        return False


class PeerWatch:
    """The run's other hosts, asked every `every_s` whether they answer on the cluster network (their
    sshd's port). A peer silent for `after_s` has vanished: this host's ranks are ended, with the
    cause in train.log. It watches the peers, not the collectives: on a slow link one all-reduce may
    rightly take minutes (the heartbeat is sized to its bytes), and a vanished host is still noticed
    within a minute. A peer is only judged once it has answered (a firewall that drops the probe
    from the start ends nothing)."""

    def __init__(self, peers: list[str], after_s: float = 45.0, every_s: float = 5.0, answers=tcp_answers,
                 log_path: Path | None = None):
        self.peers, self.after_s, self.every_s, self.answers = peers, after_s, every_s, answers
        self.log_path = log_path
        self.silent_since: dict[str, float] = {}
        self.armed: set[str] = set()
        self._asked_at: float | None = None
        self.lost: str | None = None

    def check(self, now: float | None = None) -> str | None:
        """Ask the peers when due; returns the first peer silent for `after_s` (once), else None."""
        now = time.monotonic() if now is None else now
        if self.lost or not self.peers or (self._asked_at is not None and now - self._asked_at < self.every_s):
            return None
        self._asked_at = now
        for peer in self.peers:
            if self.answers(peer):
                self.armed.add(peer)
                self.silent_since.pop(peer, None)
            elif peer in self.armed:
                since = self.silent_since.setdefault(peer, now)
                if now - since >= self.after_s:
                    self.lost = peer
                    return peer
        return None

    def end_ranks(self, pids: list[int], peer: str) -> None:
        """SIGTERM to this host's processes of the run (torchrun ends its ranks), SIGKILL to what is
        left after 10 s."""
        said = (f"tandem watchdog: peer {peer} has not answered on the cluster network for {self.after_s:.0f} s; "
                f"ended this host's ranks (the run cannot go on with a host missing)")
        print(said, flush=True)
        if self.log_path is not None:
            with open(self.log_path, "a", encoding="utf-8") as log:
                log.write(said + "\n")
        procs = []
        for pid in pids:
            try:
                proc = psutil.Process(pid)
                proc.terminate()
                procs.append(proc)
            except psutil.Error:
                continue
        _, alive = psutil.wait_procs(procs, timeout=10)
        for proc in alive:
            try:
                proc.kill()
            except psutil.Error:
                continue


def sample(nic: str, previous: tuple[float, int, int] | None, gpus) -> tuple[dict, tuple[float, int, int]]:
    now = time.time()
    counters = psutil.net_io_counters(pernic=True).get(nic)
    sent, recv = (counters.bytes_sent, counters.bytes_recv) if counters else (0, 0)
    record = {"t": round(now, 3), "host": socket.gethostname(), "nic": nic}
    if previous is not None and counters:
        dt = max(now - previous[0], 1e-6)
        record["tx_Bps"] = (sent - previous[1]) / dt
        record["rx_Bps"] = (recv - previous[2]) / dt
    else:
        record["tx_Bps"] = record["rx_Bps"] = None
    memory = psutil.virtual_memory()
    record["cpu_percent"] = psutil.cpu_percent(interval=None)
    record["mem_used_mb"] = (memory.total - memory.available) / 2**20
    record["mem_total_mb"] = memory.total / 2**20
    record["gpus"] = gpus() if gpus else None
    return record, (now, sent, recv)


def read_pid_file(path: Path | None) -> str | None:
    try:
        return path.read_text().strip() or None if path else None
    except OSError:
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--nic", default=os.environ.get("TANDEM_CLUSTER_NIC"),
                        help="the cluster NIC (default: TANDEM_CLUSTER_NIC, from /etc/tandem/env)")
    parser.add_argument("--watch", required=True, metavar="SAVE_DIR",
                        help="the run's save dir: stop when no process with --save-dir SAVE_DIR is left")
    parser.add_argument("--interval", type=float, default=2.0)
    parser.add_argument("--start-grace", type=float, default=60.0,
                        help="seconds to wait for the training to appear before giving up")
    parser.add_argument("--frozen-after", type=float, default=60.0,
                        help="kill a process of the run stopped this long (beyond its peers' heartbeat)")
    parser.add_argument("--log", type=Path, help="the run's train.log, where a kill is written")
    parser.add_argument("--peers", default="",
                        help="the other hosts' cluster addresses, comma-separated: a peer silent for "
                             "--peer-lost-after seconds ends this host's ranks")
    parser.add_argument("--peer-lost-after", type=float, default=45.0)
    parser.add_argument("--pid-file", type=Path,
                        help="the run's train.pid: once a restart writes another pid there, the new world has "
                             "its own monitor and this one ends (it would judge the new world by the old peers)")
    args = parser.parse_args(argv)
    nics = psutil.net_io_counters(pernic=True)
    if not args.nic:  # never a guess (eth0): the figures would be another NIC's, or none
        print(f"{socket.gethostname()}: no cluster NIC to sample: set the inventory's cluster_nic, or provision "
              "the host (roles/network writes TANDEM_CLUSTER_NIC to /etc/tandem/env)", file=sys.stderr)
        return 2
    if args.nic not in nics:  # else every sample would lack the NIC's figures and none be written
        print(f"{socket.gethostname()}: no NIC {args.nic} to sample (has {', '.join(sorted(nics))}); "
              "set the inventory's cluster_nic", file=sys.stderr)
        return 2
    gpus = gpu_reader()
    psutil.cpu_percent(interval=None)  # the first reading is meaningless: prime it
    started, seen = time.monotonic(), False
    watch = FrozenWatch(args.frozen_after, args.log)
    peers = PeerWatch([p for p in args.peers.split(",") if p], args.peer_lost_after, log_path=args.log)
    previous = None
    args.out.parent.mkdir(parents=True, exist_ok=True)
    generation = None  # the pid the training command wrote, as first read
    with open(args.out, "a", encoding="utf-8") as out:
        while True:
            written = read_pid_file(args.pid_file)
            generation = generation or written
            if generation and written and written != generation:
                return 0
            pids = save_dir_pids(args.watch)
            alive = bool(pids)
            seen = seen or alive
            watch.check(pids)
            if alive and (lost := peers.check()):
                peers.end_ranks(pids, lost)
            if not alive and (seen or time.monotonic() - started > args.start_grace):
                return 0
            record, previous = sample(args.nic, previous, gpus)
            if record["tx_Bps"] is not None:
                out.write(json.dumps(record) + "\n")
                out.flush()
            time.sleep(args.interval)


if __name__ == "__main__":
    sys.exit(main())
