"""How the controller names things on a host: the training venv, the agent modules' command lines,
the threads a CPU rank may use."""

from __future__ import annotations

import shlex

from ..cluster import Host


def venv_of(host: Host) -> str:
    """The training venv on `host`: the inventory's (train_env's own variable, else the shared one)."""
    return str(host.var("train_env_venv") or host.var("tandem_venv"))


def agent_command(host: Host, module: str, *args: object) -> str:
    """The shell line that runs a host-side agent module (train/agent/, installed by roles/train_env)."""
    return shlex.join([f"{venv_of(host)}/bin/python", "-m", f"train.agent.{module}", *map(str, args)])


def train_threads(host: Host) -> int | None:
    """The inventory's `train_threads` for this host: CPU threads for each of its ranks
    (OMP_NUM_THREADS in every rank's environment; None: torch's default). A host running several
    ranks (`cpu_ranks`) wants cores / ranks, or they contend."""
    return host.var("train_threads")  # type: ignore[return-value]
