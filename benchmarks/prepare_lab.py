"""`fab prepare-data --wmt16` at full size on the lab, as a user runs it: WMT16's 4.56M pairs from a
WMT16-shaped mirror served on the lab's bridge, prepared on rank 0's host, copied host to host.

    make lab-up DATA_DISK_GB=16 && (provision it)
    python -m benchmarks.prepare_lab [--prefix tandem] [--pairs 4560000]

Prints the wall time, each stage's seconds (from the stage runner's `.STAGE.done` files on rank 0's
host) and peak memory (the PSS of the runner's process tree, sampled every 0.5 s from this machine: the lab's
hosts are PID namespaces under it), the host-to-host copy, and the bytes through the controller (the
bridge's counters, less the archives the mirror on this machine served). One JSON line at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import threading
import time
from pathlib import Path

import psutil

from benchmarks import wmt16_mirror
from benchmarks.prepare_data import tree_memory
from lab.__main__ import saved_config
from lab.config import LabConfig

TOP = Path(__file__).resolve().parent.parent
STAGES = ("raw", "text", "spm", "subwords", "bin")  # train.agent.data.corpus's, in order
WHAT = {"raw": "download + extract", "text": "check + clean", "spm": "subwords: learn", "subwords": "subwords: apply",
        "bin": "binarize + manifest", "copy": "publish, copy host to host, check"}


def bridge_bytes(cfg: LabConfig) -> int:
    """Bytes through the controller's side of the lab's bridge (the hosts' traffic with each other
    goes over the cluster bridge, and the bridge's own counters see only the controller's)."""
    stats = Path(f"/sys/class/net/{cfg.bridge}/statistics")
    return int((stats / "rx_bytes").read_text()) + int((stats / "tx_bytes").read_text())


def runner_of(name: str, host: str) -> psutil.Process | None:
    """The stage runner preparing `name` on `host` (its command line says both)."""
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if "train.agent.data" in cmd and name in cmd and host in cmd and "--host" in cmd:
            return proc
    return None


class Sampler(threading.Thread):
    """(time, bytes) of the runner's process tree every 0.5 s, once it has started."""

    def __init__(self, name: str, host: str):
        super().__init__(daemon=True)
        self.name_, self.host, self.samples, self.done = name, host, [], threading.Event()

    def run(self):
        proc = None
        while not self.done.wait(0.5):
            proc = proc if proc is not None and proc.is_running() else runner_of(self.name_, self.host)
            if proc is not None:
                with contextlib.suppress(psutil.Error):
                    self.samples.append((time.time(), tree_memory(proc)))


def ssh(cfg: LabConfig, host: str, command: str) -> str:
    proc = subprocess.run(["ssh", "-i", str(cfg.key), "-o", f"UserKnownHostsFile={cfg.known_hosts}",
                           "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes",
                           f"{cfg.login_user}@{cfg.host_ip(host)}", command],
                          capture_output=True, text=True, timeout=120)
    return proc.stdout


def run(cfg: LabConfig, pairs: int, where: Path, name: str = "wmt16-bench") -> dict:
    www = where / f"www-{pairs}"
    if not (www / "dev.tgz").exists():
        wmt16_mirror.build(www, pairs)
    archives = sum(p.stat().st_size for p in www.iterdir())
    rank0 = cfg.names[0]
    # from nothing: the download, every stage and the copy are what is timed. Only this lab's hosts,
    # only the benchmark's own dataset and the download cache.
    print(f"erasing on {', '.join(cfg.names)} (lab {cfg.prefix}): /data/tandem/datasets/{name}, "
          f"/data/tandem/prepare/{name}, /data/tandem/prepare/downloads")
    for host in cfg.names:
        ssh(cfg, host, f"sudo rm -rf /data/tandem/datasets/{name} /data/tandem/prepare/{name} "
                       "/data/tandem/prepare/downloads")
    httpd, url = wmt16_mirror.serve(www, bind=cfg.bridge_ip)
    sampler = Sampler(name, rank0)
    sampler.start()
    before, started = bridge_bytes(cfg), time.time()
    env = {**os.environ, "FABRIC_INVENTORY": str(cfg.default_inventory), "TANDEM_WMT16_MIRROR": url, "COLUMNS": "160"}
    try:
        out = subprocess.run([str(TOP / ".venv" / "bin" / "fab"), "prepare-data", "--wmt16", "--name", name],
                             cwd=TOP, env=env, capture_output=True, text=True)
    finally:
        ended = time.time()
        sampler.done.set()
        sampler.join()
        httpd.shutdown()
        httpd.server_close()
    through = bridge_bytes(cfg) - before - archives
    print(out.stdout[-4000:], out.stderr[-4000:])
    if out.returncode != 0:
        raise SystemExit(f"fab prepare-data failed ({out.returncode})")
    done = dict(line.split() for line in ssh(
        cfg, rank0, f"cd /data/tandem/prepare/{name} && stat -c '%n %Y' " + " ".join(f".{s}.done" for s in STAGES)
    ).splitlines())
    bounds = [started] + [float(done[f".{s}.done"]) for s in STAGES] + [ended]
    stages = {}
    for stage, start, end in zip([*STAGES, "copy"], bounds, bounds[1:], strict=False):
        during = [pss for t, pss in sampler.samples if start <= t <= end + 1]
        stages[stage] = {"what": WHAT[stage], "seconds": round(end - start),
                         "peak_mb": round(max(during, default=0) / 2**20)}
    dataset = int(ssh(cfg, cfg.names[-1], f"du -sb /data/tandem/datasets/{name}").split()[0])
    return {"pairs": pairs, "wall_s": round(ended - started), "stages": stages,
            "peak_mb": max(s["peak_mb"] for s in stages.values()), "dataset_mb": round(dataset / 1e6),
            "through_controller_mb": round(through / 1e6, 2), "archives_mb": round(archives / 1e6)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prefix", default=os.environ.get("LAB_PREFIX", "tandem"))
    parser.add_argument("--pairs", type=int, default=sum(wmt16_mirror.TRAIN_SHARE.values()))
    parser.add_argument("--dir", type=Path, default=Path("/var/tmp/tandem-prepare-bench"))
    args = parser.parse_args()
    cfg = saved_config(args.prefix)
    if cfg is None:
        raise SystemExit(f"no lab {args.prefix!r} is up: make lab-up DATA_DISK_GB=16 (and provision it) first")
    figures = run(cfg, args.pairs, args.dir)
    print(f"{figures['pairs']:,} pairs on the lab: {figures['wall_s']} s, peak {figures['peak_mb']} MB on rank 0's "
          f"host, {figures['through_controller_mb']} MB through the controller, dataset {figures['dataset_mb']} MB")
    for f in figures["stages"].values():
        print(f"  {f['what']:<36} {f['seconds']:>6} s  {f['peak_mb']:>6} MB")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
