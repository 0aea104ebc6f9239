"""The sampler that runs on every host beside the training (started and ended with it).

    python -m train.agent.monitor --out RUN/samples.jsonl [--nic eth0] --watch RUN/checkpoints

Every `--interval` seconds it appends one JSON line: the cluster NIC's sent and received
bytes per second, CPU, memory, and per GPU its utilization and memory (NVML). Hosts
without an NVIDIA GPU report `"gpus": null` (absent), never zeros. It exits by itself once
no process of the run (found by the `--save-dir` on its command line) is left.

It is also the run's watchdog on this host: a process of the run that stays stopped (SIGSTOP, a
VM paused by its provider) for `--frozen-after` seconds is killed. Its peers' heartbeat has ended
them by then; a stopped process can end nothing itself and would hold the GPU and the port until
someone noticed. The kill is written to the run's train.log, so `fab status` names it.
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

from train.agent.state import save_dir_pids


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
    previous = None
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "a", encoding="utf-8") as out:
        while True:
            pids = save_dir_pids(args.watch)
            alive = bool(pids)
            seen = seen or alive
            watch.check(pids)
            if not alive and (seen or time.monotonic() - started > args.start_grace):
                return 0
            record, previous = sample(args.nic, previous, gpus)
            if record["tx_Bps"] is not None:
                out.write(json.dumps(record) + "\n")
                out.flush()
            time.sleep(args.interval)


if __name__ == "__main__":
    sys.exit(main())
