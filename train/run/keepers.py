"""The controller's side of the hosts' keepers (train.agent.keeper): what each is told, started, stopped.

`fab train` writes one spec per host into RUN/keeper/spec.json: the run's hosts in rank order, their
cluster addresses, the heartbeat port and token, and every membership's exact training commands,
built here by the one command builder (train.run.command), with the update-freq that keeps the
run's effective batch on that membership's ranks (train.run.elastic.scaled_update_freq, re-derived
by train.run.batching). The keepers then choose among those commands by themselves: no command is
ever built on a host, and none needs the controller. Every ordered subset of the hosts is one
membership: 2 hosts -> 3, 4 -> 15, 8 -> 255 (a spec of a few MB at most).
"""

from __future__ import annotations

import copy
import io
import itertools
import json
import secrets
import time

from ..cluster import ClusterError, Host, on_each, run_all, world_size
from . import batching
from .elastic import scaled_update_freq
from .launch import host_commands
from .record import Run
from .remote import agent_command

LOST_AFTER_S = 20.0  # a peer silent this long on the cluster network is lost (heartbeats every 2 s)
PORT_OFFSET = 100  # the keepers' heartbeat port: the run's rendezvous port + this


def memberships(hosts: list[Host]) -> list[list[Host]]:
    """Every non-empty subset of `hosts`, each in rank order (the order they were given)."""
    return [list(c) for n in range(len(hosts), 0, -1) for c in itertools.combinations(hosts, n)]


def membership_commands(run: Run, hosts: list[Host]) -> tuple[dict, dict, dict]:
    """({"a,b": {host: command}}, {"a,b": update_freq}, {"a,b": ranks}) for every membership of `hosts`."""
    commands, update_freq, ranks = {}, {}, {}
    full = world_size(hosts)
    for members in memberships(hosts):
        world = world_size(members)
        trial = copy.deepcopy(run)
        trial.hosts = [h.name for h in members]
        if world != full:
            trial.update_freq = batching.update_freq_for(
                trial, world, scaled_update_freq(run.update_freq, full, world))
        key = ",".join(trial.hosts)
        commands[key] = host_commands(trial, members)
        update_freq[key], ranks[key] = trial.update_freq, world
    return commands, update_freq, ranks


def spec(run: Run, hosts: list[Host], reason: str = "start", token: str | None = None) -> dict:
    """What every host's keeper is told (its own name apart)."""
    commands, update_freq, ranks = membership_commands(run, hosts)
    return {"run_id": run.run_id, "order": [h.name for h in hosts], "members": [h.name for h in hosts],
            "addresses": {h.name: h.cluster_address for h in hosts}, "port": run.master_port + PORT_OFFSET,
            "token": token or secrets.token_hex(16), "start": f"{time.time():.3f}", "reason": reason,
            "lost_after_s": LOST_AFTER_S, "commands": commands, "update_freq": update_freq, "ranks": ranks}


def start(run: Run, hosts: list[Host], reason: str = "start") -> None:
    """Write each host's spec (over SFTP: 8 hosts' commands are MBs, beyond one shell argument) and
    launch its keeper; the keepers start the ranks among themselves."""
    told = spec(run, hosts, reason)
    kdir = f"{run.remote_dir}/keeper"

    def one(host: Host, conn):
        conn.run(f"mkdir -p {kdir} && rm -f {kdir}/stop {kdir}/ended", hide=True, in_stream=False)
        conn.put(io.BytesIO(json.dumps({**told, "me": host.name}).encode()), f"{kdir}/spec.json")
        return conn.run(agent_command(host, "keeper", "launch", "--run", run.remote_dir), hide=True, in_stream=False)

    problems = on_each(hosts, one).problems()
    if problems:
        stop(run, hosts)
        raise ClusterError("could not start the run's keepers (the others were stopped):\n  " + "\n  ".join(problems))


def stop(run: Run, hosts: list[Host], wait_s: float = 20):
    """Every host's keeper told to stop (its peers hear it), then its ranks: launch.stop's answers."""
    return run_all(hosts, agent_command(hosts[0], "keeper", "stop", "--run", run.remote_dir, "--wait", f"{wait_s:g}"),
                   timeout=wait_s + 15)
