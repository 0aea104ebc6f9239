"""Where `fab evaluate` may run on a host: a GPU no run of this cluster trains on, or nowhere
(it says which run holds which GPUs). A translation beside a training rank on the same GPU
slows the run and can run it out of memory; on a CPU host a running run is refused likewise
(evaluating would take the cores its ranks train on)."""

from __future__ import annotations

import json

from ..cluster import ClusterError, Host, run_all
from ..hosts.remote import agent_command


def choose(host: str, gpus: int, busy: dict[str, list[int]]) -> int | None:
    """The GPU to evaluate on (None: a CPU host with nothing training); ClusterError naming the
    runs and their GPUs where none is free (or, on a CPU host, where a run trains)."""
    taken = {g for used in busy.values() for g in used}
    if gpus == 0:
        if busy:
            raise ClusterError(f"{host}: {said(dict.fromkeys(busy, []))} training there (CPU host): evaluating "
                               "beside it takes its cores; wait for it, `fab stop --run RUN`, or evaluate on "
                               "another host (--hosts)")
        return None
    free = [g for g in range(gpus) if g not in taken]
    if not free:
        raise ClusterError(f"{host}: every GPU ({gpus}) is training: {said(busy)}; wait for it, `fab stop --run RUN`, "
                           "or evaluate on another host (--hosts)")
    return free[0]


def said(busy: dict[str, list[int]]) -> str:
    """`run-a (GPU 0, 1), run-b (GPU 2)`: the runs and the GPUs each holds."""
    def gpus(used: list[int]) -> str:
        return f" (GPU {', '.join(map(str, used))})" if used else ""

    runs = [f"{run}{gpus(used)}" for run, used in busy.items()]
    return ("run " if len(runs) == 1 else "runs ") + ", ".join(runs) + (" is" if len(runs) == 1 else " are")


def free_gpu(host: Host, runs_dir: str) -> int | None:
    """Ask `host` which runs train on which GPUs (train.agent.measure.busy_gpus) and choose."""
    result = run_all([host], agent_command(host, "measure.busy_gpus", "--runs", runs_dir), timeout=60)[host.name]
    lines = result.stdout.strip().splitlines() if result.ok else []
    try:
        answer = json.loads(lines[-1])
    except (IndexError, ValueError):
        raise ClusterError(f"{host.name}: could not tell which GPUs are training: "
                           f"{result.error or result.stderr or result.stdout}") from None
    return choose(host.name, int(answer.get("gpus") or 0), answer.get("runs") or {})
