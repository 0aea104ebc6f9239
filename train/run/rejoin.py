"""Growing back to hosts the run lost, as `fab train` asks it on a stopped run (`--rejoin`, or
`--hosts` naming them): which hosts, in which order (the run's first rank 0 is rank 0 again), the
update-freq back to the effective batch the run started with, the membership entry and the line
said. On a running run the hosts' keepers take a returning host back by themselves
(train.agent.keeper.loop); `--rejoin` only starts the keeper of a host whose own does not run.

The parts take data and return data: tests/unit/train/run/test_rejoin.py.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from ..plan import batching
from ..recipe.record import Run
from .elastic import scaled_update_freq


def _trained(members: Sequence[dict] | None) -> list[str]:
    """Every host of every membership (and every host an entry says was lost), in the order they
    first trained in."""
    out: list[str] = []
    for entry in members or []:
        for name in [*entry.get("hosts", []), *(entry.get("lost") or [])]:
            if isinstance(name, str) and name not in out:
                out.append(name)
    return out


def lost_hosts(members: Sequence[dict] | None, current: Sequence[str]) -> list[str]:
    """The hosts the run lost and does not train on now, in the order they first trained in.

    >>> m = [{"hosts": ["v100a", "v100b", "v100c"], "from_update": 0, "why": "start"},
    ...      {"hosts": ["v100a", "v100b"], "from_update": 30, "lost": ["v100c"], "why": "..."}]
    >>> lost_hosts(m, ["v100a", "v100b"])
    ['v100c']
    """
    return [n for n in _trained(members) if n not in current]


def grown_hosts(members: Sequence[dict] | None, current: Sequence[str], joining: Sequence[str]) -> list[str]:
    """The hosts after a rejoin, in rank order: the order they first trained in (so the run's first
    rank 0 is rank 0 again), then any the membership never had."""
    wanted = [*current, *(n for n in joining if n not in current)]
    order = _trained(members)
    return [n for n in order if n in wanted] + [n for n in wanted if n not in order]


def grown_update_freq(members: Sequence[dict] | None, update_freq: int, ranks_now: int, ranks_after: int,
                      ranks_per_host: int = 1) -> int:
    """The update-freq on `ranks_after` ranks that gives back the effective batch the run started
    with: its first membership's ranks × update-freq (elastic.scaled_update_freq: rounded up,
    never a smaller batch). A first entry without `ranks` (recorded before hosts ran several):
    its hosts × `ranks_per_host`. A run whose first entry has no update-freq (tandem recorded none
    before rejoins existed): the current scaling undone, rounded down, at least 1."""
    first = (members or [None])[0]
    if isinstance(first, dict) and isinstance(first.get("update_freq"), int) and first.get("hosts"):
        ranks = first.get("ranks") if isinstance(first.get("ranks"), int) else len(first["hosts"]) * ranks_per_host
        return scaled_update_freq(first["update_freq"], ranks, ranks_after)
    return max(1, update_freq * ranks_now // max(1, ranks_after))


def membership_after(run: Run, joining: Sequence[str], ranks_per_host: int = 1) -> tuple[list[str], int]:
    """The hosts (rank order) and update-freq of `run` once `joining` are back; every host runs
    `ranks_per_host` ranks (train.run.preflight refuses hosts that differ)."""
    names = grown_hosts(run.members, run.hosts, joining)
    scaled = grown_update_freq(run.members, run.update_freq, len(run.hosts) * ranks_per_host,
                               len(names) * ranks_per_host, ranks_per_host)
    return names, batching.update_freq_for(run, len(names) * ranks_per_host, scaled)  # the recipe's batch


def entry(hosts: list[str], joined: list[str], at: int, update_freq: int, when: float | None = None,
          ranks: int | None = None) -> dict:
    """The membership entry of a rejoin (train.report.members reads it as a join); `ranks`: the
    world size it trains in (default one rank a host)."""
    return {"hosts": list(hosts), "from_update": at, "why": f"{', '.join(joined)} rejoined at update {at}",
            "joined": list(joined), "update_freq": update_freq, "ranks": len(hosts) if ranks is None else ranks,
            "time": round(time.time() if when is None else when, 1)}


def line(joined: list[str], hosts: list[str], at: int, update_freq: int, ranks: int | None = None) -> str:
    """What tandem says when the run grows back (`ranks`: said where hosts run several)."""
    return (f"{', '.join(joined)} {'is' if len(joined) == 1 else 'are'} back: growing to {', '.join(hosts)} "
            f"from update {at:,}, update-freq {update_freq}"
            + (f" ({ranks} ranks)" if ranks is not None and ranks != len(hosts) else ""))


def record(run: Run, joining: Sequence[str], at: int, ranks_per_host: int = 1) -> str:
    """Grow `run`'s membership by `joining` from update `at` (the entry, its hosts and update-freq;
    not saved, nothing started); returns the line to say. Every host runs `ranks_per_host` ranks."""
    names, update_freq = membership_after(run, joining, ranks_per_host)
    joined = [n for n in names if n not in run.hosts]
    if not run.members:
        run.members.append({"hosts": list(run.hosts), "from_update": 0, "why": "start",
                            "update_freq": run.update_freq, "ranks": len(run.hosts) * ranks_per_host})
    run.members.append(entry(names, joined, at, update_freq, ranks=len(names) * ranks_per_host))
    run.hosts, run.update_freq = names, update_freq
    return line(joined, names, at, update_freq, len(names) * ranks_per_host)

