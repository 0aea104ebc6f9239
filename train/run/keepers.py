"""The controller's side of the hosts' keepers (train.agent.keeper.loop): what each is told, started, stopped.

`fab train` writes one spec per host into RUN/keeper/spec.json: the run's hosts in rank order, their
cluster addresses, the heartbeat port and token, and every membership's exact training commands,
built here by the one command builder (train.run.command), with the update-freq that keeps the
run's effective batch on that membership's ranks (train.run.elastic.scaled_update_freq, re-derived
by train.plan.batching). The keepers then choose among those commands by themselves: no command is
ever built on a host, and none needs the controller. Every ordered subset of the hosts is one
membership: 2 hosts -> 3, 4 -> 15, 8 -> 255 (a spec of a few MB at most).
"""

from __future__ import annotations

import copy
import io
import itertools
import json
import os
import secrets
import shlex
import time

from ..agent.keeper.generation import change_line  # noqa: F401 (what following and status say)
from ..agent.trainer import tracker
from ..cluster import ClusterError, Host, connect, on_each, run_all, world_size
from ..hosts.private_files import put_private
from ..hosts.remote import agent_command
from ..plan import batching
from ..recipe import presets
from ..recipe.record import Run
from . import interval, offsite, tls
from .elastic import scaled_update_freq
from .launch import host_commands

LOST_AFTER_S = 20.0  # a peer silent this long on the cluster network is lost (heartbeats every 2 s)
PORT_OFFSET = 100  # the keepers' heartbeat port: the run's rendezvous port + this


def memberships(hosts: list[Host]) -> list[list[Host]]:
    """Every non-empty subset of `hosts`, each in rank order (the order they were given)."""
    return [list(c) for n in range(len(hosts), 0, -1) for c in itertools.combinations(hosts, n)]


def membership_commands(run: Run, hosts: list[Host],
                        started: dict[str, str] | None = None) -> tuple[dict, dict, dict]:
    """({"a,b": {host: command}}, {"a,b": update_freq}, {"a,b": ranks}) for every membership of `hosts`;
    `started`: every host's command as the start resolved them (train.run.start), else built here too."""
    commands, update_freq, ranks = {}, {}, {}
    full = world_size(hosts)
    for members in memberships(hosts):
        world = world_size(members)
        trial = copy.deepcopy(run)
        trial.hosts = [h.name for h in members]
        if world != full:
            trial.update_freq = batching.update_freq_for(
                trial, world, scaled_update_freq(run.update_freq, full, world))
            trial.save_interval_updates = interval.on_fewer_ranks(run, trial.update_freq)  # same minutes
        key = ",".join(trial.hosts)
        commands[key] = started if started is not None and world == full else host_commands(trial, members)
        update_freq[key], ranks[key] = trial.update_freq, world
    return commands, update_freq, ranks


def spec(run: Run, hosts: list[Host], reason: str = "start", token: str | None = None, elastic: bool = True,
         commands: dict[str, str] | None = None) -> dict:
    """What every host's keeper is told (its own name apart); `commands`: every host's, as the start
    resolved them (default: built here)."""
    commands, update_freq, ranks = membership_commands(run, hosts, commands)
    options = presets.resolve(run.preset, run.overrides).options  # `--set restarts_per_hour=N`, ...
    return {"run_id": run.run_id, "order": [h.name for h in hosts], "members": [h.name for h in hosts],
            "addresses": {h.name: h.cluster_address for h in hosts}, "port": run.master_port + PORT_OFFSET,
            "token": token or secrets.token_hex(16), "start": f"{time.time():.3f}", "reason": reason,
            "lost_after_s": LOST_AFTER_S, "elastic": elastic, "commands": commands, "update_freq": update_freq,
            "ranks": ranks, "offsite": offsite.told(run), "tls_dir": f"{run.remote_dir}/keeper/tls",
            "max_restarts": int(options.get("restarts_per_hour", 3)),  # 0 counts: never restart, never take back
            "max_rejoins": int(options.get("rejoins_per_hour", 6))}


def launch_keepers(run: Run, hosts: list[Host], told: dict, must_hold_ca: bool = False) -> list[str]:
    """Each host's spec and its certificate of the run's CA (train.run.tls) written (over SFTP: 8 hosts'
    commands are MBs, beyond one shell argument; 0600 in a 0700 folder) and its keeper launched; `host:
    why` for each that failed. `must_hold_ca`: the running hosts trust the CA this controller made
    before; without it here, a new one would leave the joining hosts unable to talk to them."""
    kdir = f"{run.remote_dir}/keeper"
    if must_hold_ca and not (tls.folder(run.run_id) / "ca.key").exists():
        raise ClusterError(f"this checkout does not hold {run.run_id}'s certificate authority "
                           f"({tls.folder(run.run_id)}/, made by the controller that started the run): start the run "
                           f"again from here (`fab train --run {run.run_id}`: every host gets a certificate of a new "
                           "one), or copy that folder here")
    ca = tls.run_ca(run.run_id)

    keys = tracker.from_environment(os.environ)  # on the keeper's standard input: never on the hosts' disk

    def one(host: Host, conn):
        # the stop and ended marks stay for `keeper launch`: a keeper that ended (fab stop) and still
        # lingers for its peers is told apart by them, and replaced, not taken for this start's keeper
        tls_dir = f"{kdir}/tls"
        conn.run(f"mkdir -p {shlex.quote(kdir)} && mkdir -p -m 700 {shlex.quote(tls_dir)} && chmod 700 "
                 f"{shlex.quote(tls_dir)}", hide=True, in_stream=False)
        put_private(conn, json.dumps({**told, "me": host.name}).encode(), f"{kdir}/spec.json")  # the run's token
        for name, data in tls.host_files(ca, host.name, host.cluster_address).items():
            conn.put(io.BytesIO(data), f"{tls_dir}/{name}")
        conn.run(f"chmod 600 {shlex.quote(kdir + '/spec.json')} {shlex.quote(tls_dir)}/*", hide=True, in_stream=False)
        flags = ["--keys-on-stdin"] if keys else []
        launch = agent_command(host, "keeper.loop", "launch", "--run", run.remote_dir, *flags)
        return conn.run(launch, hide=True, in_stream=io.StringIO(json.dumps(keys) + "\n") if keys else False)

    return on_each(hosts, one).problems()


def run_token(run: Run, hosts: list[Host]) -> str | None:
    """The heartbeat token the run's keepers already hold (any host's spec), so that a new start keeps
    it: a host that misses this start (unreachable now) can still talk to the others when it returns."""
    said = run_all(hosts, f"cat {shlex.quote(run.remote_dir + '/keeper/spec.json')} 2>/dev/null || true", timeout=10)
    for result in said.values():
        try:
            return json.loads(result.stdout)["token"]
        except (ValueError, KeyError, TypeError):
            continue
    return None


def start(run: Run, hosts: list[Host], reason: str = "start", elastic: bool = True,
          commands: dict[str, str] | None = None) -> None:
    """Every host's keeper launched with this start's spec (the run's token kept); the keepers start the
    ranks among themselves, each running keeper starting again to take the new spec. `commands`: every
    host's, as the start resolved them (train.run.start; default: built here)."""
    told = spec(run, hosts, reason, token=run_token(run, hosts), elastic=elastic, commands=commands)

    problems = launch_keepers(run, hosts, told)
    if problems:
        stop(run, hosts)
        raise ClusterError("could not start the run's keepers (the others were stopped):\n  " + "\n  ".join(problems))


def add(run: Run, current: list[Host], joining: list[Host]) -> None:
    """Start the keeper of hosts the run lost whose own keeper does not run (a replaced VM, a keeper that
    ended): each gets the spec the current keepers hold (their token, every membership's commands), and
    the leader takes it back at rank 0's next checkpoint. Only hosts the run started with: a host it
    never had needs a new start (`fab train --hosts ...` on the stopped run)."""
    kdir = f"{run.remote_dir}/keeper"
    with connect(current[0]) as conn:
        told = json.loads(conn.run(f"cat {shlex.quote(kdir + '/spec.json')}", hide=True, in_stream=False).stdout)
    strangers = [h.name for h in joining if h.name not in told["order"]]
    if strangers:
        raise ClusterError(f"{', '.join(strangers)} never trained in {run.run_id} (it started on "
                           f"{', '.join(told['order'])}): `fab stop`, then `fab train --hosts ...` on all of them")

    problems = launch_keepers(run, joining, {**told, "tls_dir": f"{kdir}/tls"} if told.get("tls_dir") else told,
                              must_hold_ca=bool(told.get("tls_dir")))
    if problems:
        raise ClusterError("could not start the keepers of the hosts rejoining:\n  " + "\n  ".join(problems))


def stop(run: Run, hosts: list[Host], wait_s: float = 20):
    """Every host's keeper told to stop (its peers hear it), then its ranks: launch.stop's answers."""
    stop_keeper = agent_command(hosts[0], "keeper.loop", "stop", "--run", run.remote_dir, "--wait", f"{wait_s:g}")
    return run_all(hosts, stop_keeper, timeout=wait_s + 15)


# --- what the controller reads of them (fab train following, fab status, the report)

def _generation(state) -> dict | None:
    return ((state.keeper or {}).get("generation") or None) if state.reachable else None


def newest(states) -> dict | None:
    """The newest resolved generation any reachable host's keeper knows."""
    known = [g for s in states if (g := _generation(s)) and not g.get("pending")]
    return max(known, key=lambda g: g["number"]) if known else None


def timeline(states) -> list[dict]:
    """Every membership change the reachable hosts recorded, once each, oldest first."""
    seen, out = set(), []
    for s in states:
        for entry in (s.keeper or {}).get("timeline") or []:
            key = (entry.get("generation"), tuple(entry.get("hosts") or ()))
            if key not in seen:
                seen.add(key)
                out.append(entry)
    return sorted(out, key=lambda e: (e.get("generation") or 0, e.get("time") or 0))


def set_aside_lines(states) -> list[str]:
    """The histories the keepers set aside (a split's other side, a corrupt copy), a line each, with how to
    go on from one: nothing is ever thrown away, but only one history trains."""
    lines = []
    for s in states:
        for e in (s.keeper or {}).get("set_aside") or [] if s.reachable else []:
            lines.append(f"{s.name}: update {e.get('update', '?'):,} (generation {e.get('generation', '?')}, "
                         f"{e.get('why', 'another history')}), {e.get('size', 0) / 1e9:.2f} GB at {e['path']}")
    if lines:
        lines.append("to train from one: fab stop, copy it to that path on every host, then "
                     "fab train --new --set restore_file=PATH")
    return lines


def no_room_lines(states) -> list[str]:
    """The hosts whose /data has no room for the run's checkpoint (left out until it has), a line each."""
    return [f"{(s.keeper or {}).get('no_room')}: left out until there is room (free some space on "
            f"{s.name}'s /data; it is taken back by itself)" for s in states
            if s.reachable and (s.keeper or {}).get("no_room")]


def lineage(entries: list[dict]) -> list[dict]:
    """The generations the run's newest checkpoint descends from, oldest first: after a split, the side
    whose history was set aside is left out (`fab status` still lists it)."""
    by_generation: dict[int, list[dict]] = {}
    for entry in entries:
        by_generation.setdefault(entry.get("generation") or 0, []).append(entry)
    chain, entry = [], entries[-1] if entries else None
    while entry is not None:
        chain.append(entry)
        parent = entry.get("source_generation")
        if not parent or parent >= (entry.get("generation") or 0):
            # a start from no checkpoint, or one made before the keepers: the previous generation
            earlier = [e for e in entries if (e.get("generation") or 0) < (entry.get("generation") or 0)]
            entry = None if not parent and entry.get("from_update") in (0, None) else (earlier[-1] if earlier else None)
            continue
        held = [e for e in by_generation.get(parent, []) if entry.get("source") in (e.get("hosts") or [])]
        entry = (held or by_generation.get(parent) or [None])[-1]
    return chain[::-1]


def _key(entry: dict) -> tuple:
    return entry.get("generation"), tuple(entry.get("hosts") or ())


def sync(run: Run, states, said: set | None = None) -> list[dict]:
    """The run record brought up to what the keepers decided (its hosts, update-freq, and the history
    it went on with); returns the changes not in `said` (default: the record's), adding them to it."""
    entries = timeline(states)
    if not entries:
        return []
    said = {_key(e) for e in run.members} if said is None else said
    fresh = [e for e in entries if _key(e) not in said]
    said.update(_key(e) for e in fresh)
    members, last = lineage(entries), entries[-1]
    hosts = list(last["hosts"]) if last.get("hosts") else run.hosts
    update_freq = int(last.get("update_freq") or run.update_freq) if last.get("hosts") else run.update_freq
    if (members, hosts, update_freq) != (run.members, run.hosts, run.update_freq):
        run.members, run.hosts, run.update_freq = members, hosts, update_freq
        run.save()
    return fresh


def keeper_ended(states) -> str | None:
    """Why the run's keepers ended (finished, stopped, restarts exhausted), once none is alive on the
    hosts that answer; None while one keeps the run."""
    reachable = [s for s in states if s.reachable and s.keeper is not None]
    if not reachable or any(s.keeper.get("keeper") for s in reachable):
        return None
    reasons = [s.keeper.get("ended") for s in reachable if s.keeper.get("ended")]
    if not reasons:
        return "no keeper runs" if not any(s.running for s in reachable) else None
    return next((r for r in reasons if r == "finished"), reasons[0])


def rank_order(run: Run, states):
    """The states with the current members first, in rank order (rank 0's host first: its log has
    the updates), then the hosts outside the run now."""
    members = run.hosts
    first = [s for name in members for s in states if s.name == name]
    return first + [s for s in states if s.name not in members]
