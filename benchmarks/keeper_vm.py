"""On a VM (a lent GPU machine, or any host tandem trains on): the keeper's system paths for real, at a
user's checkpoint size.

    python -m benchmarks.keeper_vm --work DIR --out DIR [--gb 3.0]

1. **Integrity at rest at transformer-big's size.** A torch checkpoint shaped as fairseq saves big in fp16
   (fp16 weights, the fp32 master copy, Adam's two moments: ~3 GB), written to a temporary name, fsync'd
   and renamed as rank 0 saves; the keeper's snapshot of it (train.agent.keeper.replica.snapshot: hard link,
   fsync, sha256, manifest) timed; `verify` (what a resume or a served copy costs first) from a cold page
   cache where the kernel lets root drop it, warm, and cached (a peer's second request).
2. **Supervision by systemd**, where it is PID 1: a one-host run's keeper launched as `fab train` launches it
   (train.agent.keeper.loop.launch: `systemd-run`, a transient unit) with the keepers' tests' stand-in for its
   ranks (tests/unit/train/agent/fake_rank.py); the keeper SIGKILLed: systemd's restart (NRestarts, seconds
   until a new keeper runs), the ranks untouched (KillMode=process); `keeper stop`: the unit gone, no rank
   left. Where systemd is not the init it says so and stops there (the lab's tests cover tandem's supervisor).

Writes OUT/keeper_vm.json and OUT/keeper-journal.txt.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from train.agent.keeper import loop, replica, supervision
from train.agent.keeper.state import run_pids

FAKE_RANK = Path(__file__).parents[1] / "tests" / "unit" / "train" / "agent" / "fake_rank.py"
BIG_PARAMS = 213_000_000  # transformer_vaswani_wmt_en_de_big with a joined 32k vocabulary, shared embeddings


def timed(fn, *args, **kwargs):
    started = time.perf_counter()
    result = fn(*args, **kwargs)
    return result, time.perf_counter() - started


def big_checkpoint(path: Path, gb: float) -> dict:
    """A fairseq-shaped checkpoint of `gb` GB written as rank 0 writes one; the seconds each part took."""
    import torch

    scale = gb / 3.0
    chunk = 16_000_000
    tensors = max(1, int(BIG_PARAMS * scale) // chunk)
    model = {f"layer{i}.weight": torch.randn(chunk, dtype=torch.float16) for i in range(tensors)}
    state = {"fp32_params": torch.randn(chunk * tensors, dtype=torch.float32),
             "exp_avg": [torch.randn(chunk) for _ in range(tensors)],
             "exp_avg_sq": [torch.rand(chunk) for _ in range(tensors)]}
    checkpoint = {"model": model, "last_optimizer_state": state,
                  "optimizer_history": [{"criterion_name": "LabelSmoothedCrossEntropyCriterion",
                                         "optimizer_name": "FairseqAdam", "num_updates": 12_000}],
                  "extra_state": {"train_iterator": {"epoch": 3, "iterations_in_epoch": 500}}}
    tmp = path.with_name(path.name + ".tmp")
    _, save_s = timed(torch.save, checkpoint, tmp)
    fd = os.open(tmp, os.O_RDONLY)
    _, fsync_s = timed(os.fsync, fd)
    os.close(fd)
    os.replace(tmp, path)
    return {"bytes": path.stat().st_size, "torch_save_s": round(save_s, 2), "fsync_s": round(fsync_s, 2)}


def drop_page_cache() -> bool:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def integrity(work: Path, gb: float) -> dict:
    run_dir = work / "runs" / "integrity"
    (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
    last, _, _ = replica.paths(run_dir)
    figures = {"checkpoint": big_checkpoint(last, gb)}
    (_, held), snap_s = timed(replica.snapshot, run_dir, 1, None)
    assert held and held["update"] == 12_000, held
    gbytes = held["size"] / 1e9
    figures["snapshot_s"] = round(snap_s, 2)
    figures["cold_cache"] = drop_page_cache()
    ok, cold_s = timed(replica.verify, run_dir, held)
    figures["verify_cold_s"] = round(cold_s, 2) if ok else f"failed ({cold_s:.1f} s)"
    ok, warm_s = timed(replica.verify, run_dir, held)
    figures["verify_warm_s"] = round(warm_s, 2)
    ok, cached_s = timed(replica.verify, run_dir, held, cached=True)
    figures["verify_cached_s"] = round(cached_s, 4)
    figures["sha256_gb_per_s"] = round(gbytes / warm_s, 2)
    # one flipped byte at rest: found by verify (not trusted by its size)
    with replica.paths(run_dir)[1].open("r+b") as f:
        f.seek(held["size"] // 2)
        byte = f.read(1)
        f.seek(held["size"] // 2)
        f.write(bytes([byte[0] ^ 1]))
    figures["flipped_byte_refused"] = not replica.verify(run_dir, held)
    print(json.dumps(figures), flush=True)
    return figures


def unit_state(unit: str) -> dict[str, str]:
    out = subprocess.run(["systemctl", "show", unit, "-p", "MainPID", "-p", "NRestarts", "-p", "ActiveState",
                          "-p", "SubState"], capture_output=True, text=True).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def wait_for(predicate, timeout_s: float, poll_s: float = 0.2):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(poll_s)
    return None


def updates(run_dir: Path) -> int:
    try:
        text = (run_dir / "train.log").read_text()
    except FileNotFoundError:
        return 0
    return text.count('"num_updates"')


def supervised_by_systemd(work: Path, out: Path) -> dict:
    init = Path("/proc/1/comm").read_text().strip()
    figures: dict = {"pid1": init, "systemd_is_init": supervision.systemd_is_init()}
    if not figures["systemd_is_init"]:
        print(f"PID 1 is {init}, not systemd: the systemd unit's path cannot run here", flush=True)
        return figures
    run_dir = work / "runs" / "r1"
    (run_dir / "keeper").mkdir(parents=True, exist_ok=True)
    rank = (f"mkdir -p {run_dir}/checkpoints && cd {run_dir} && rm -f stopped && {{ setsid nohup {sys.executable} "
            f"{FAKE_RANK} --save-dir {run_dir}/checkpoints --rank0 >> {run_dir}/train.log 2>&1 < /dev/null & }}")
    spec = {"run_id": "r1", "me": "gpu0", "order": ["gpu0"], "members": ["gpu0"], "addresses": {"gpu0": "127.0.0.1"},
            "port": 29650, "token": "t", "start": "s1", "reason": "start", "lost_after_s": 10, "ended_grace_s": 3,
            "poll_s": 0.5, "commands": {"gpu0": {"gpu0": rank}}}
    (run_dir / "keeper" / "spec.json").write_text(json.dumps(spec))
    os.environ["PYTHONPATH"] = str(Path(__file__).parents[1])  # the unit's keeper imports tandem (roles/train_env)
    unit = supervision.unit_name(str(run_dir))
    try:
        loop.launch(str(run_dir))
        first = wait_for(lambda: (s := unit_state(unit)).get("ActiveState") == "active" and s, 10)
        figures["unit_started"] = first or unit_state(unit)
        figures["ranks_training"] = bool(wait_for(lambda: updates(run_dir) >= 5, 30))
        ranks = run_pids(str(run_dir))
        keeper = int(figures["unit_started"].get("MainPID") or 0)
        if keeper <= 0:  # kill(0) would be this process's own group
            raise RuntimeError(f"the keeper's unit {unit} has no main process: {figures['unit_started']}")
        os.kill(keeper, signal.SIGKILL)
        killed = time.monotonic()
        again = wait_for(lambda: (s := unit_state(unit)).get("NRestarts", "0") != "0"
                         and s.get("MainPID") not in ("0", str(keeper)) and s, 30)
        figures["keeper_back_s"] = round(time.monotonic() - killed, 2) if again else None
        figures["after_sigkill"] = again or unit_state(unit)
        figures["ranks_untouched"] = all(Path(f"/proc/{p}").exists() for p in ranks) and bool(ranks)
        before = updates(run_dir)
        figures["trained_on"] = bool(wait_for(lambda: updates(run_dir) >= before + 10, 30))
        figures["keeper_stop"] = loop.stop(str(run_dir), 20)
        figures["unit_after_stop"] = wait_for(lambda: (s := unit_state(unit)).get("ActiveState") != "active" and s,
                                              30) or unit_state(unit)
        figures["ranks_left"] = len(run_pids(str(run_dir)))
    finally:
        journal = subprocess.run(["journalctl", "-u", unit, "--no-pager", "-o", "short-monotonic"],
                                 capture_output=True, text=True)
        (out / "keeper-journal.txt").write_text(journal.stdout + journal.stderr)
        subprocess.run(["systemctl", "stop", unit], capture_output=True)
        for pid in run_pids(str(run_dir)):
            os.kill(pid, signal.SIGKILL)
    print(json.dumps(figures), flush=True)
    return figures


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.keeper_vm", description=__doc__.split("\n\n")[0])
    p.add_argument("--work", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--gb", type=float, default=3.0, help="the checkpoint's size (transformer-big fp16: ~3)")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    figures = {"supervision": supervised_by_systemd(args.work, args.out)}
    figures["integrity"] = integrity(args.work, args.gb)
    (args.out / "keeper_vm.json").write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
