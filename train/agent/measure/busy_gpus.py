"""Which runs train on this host, and on which of its GPUs: `fab evaluate` must not share one.

    python -m train.agent.measure.busy_gpus --runs /data/tandem/runs

Prints one JSON line: {"gpus": N (NVML's count, 0 on a CPU host), "runs": {RUN: [GPU, ...]}} for
every run directory under --runs with a process alive. A rank's GPU is its LOCAL_RANK (torchrun's;
fairseq sets its device from it), through CUDA_VISIBLE_DEVICES where that is set; a process whose
environment tells neither (torchrun itself, the monitor) names none.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from train.agent.keeper.state import run_pids


def environment(pid: int, proc: str = "/proc") -> dict[str, str]:
    try:
        with open(f"{proc}/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:  # ended meanwhile, or not ours to read
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def gpu_of(env: dict[str, str]) -> int | None:
    """The physical GPU a rank with this environment trains on, None where it names none."""
    local = env.get("LOCAL_RANK")
    if local is None or not local.isdigit():
        return None
    visible = [v.strip() for v in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if visible:
        index = int(local)
        return int(visible[index]) if index < len(visible) and visible[index].isdigit() else None
    return int(local)


def gpu_count() -> int:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no driver, no GPU, no pynvml: a CPU host
        return 0


def busy(runs_dir: str, proc: str = "/proc") -> dict[str, list[int]]:
    """{run: the GPUs its processes here train on} for every run with a process alive here."""
    found = {}
    for name in sorted(os.listdir(runs_dir)) if os.path.isdir(runs_dir) else []:
        pids = run_pids(os.path.join(runs_dir, name), proc)
        if pids:
            found[name] = sorted({g for pid in pids if (g := gpu_of(environment(pid, proc))) is not None})
    return found


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m train.agent.measure.busy_gpus", description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", required=True, help="the directory of every run's directory")
    args = p.parse_args(argv)
    print(json.dumps({"gpus": gpu_count(), "runs": busy(args.runs)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
