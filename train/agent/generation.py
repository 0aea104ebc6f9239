"""Which hosts train now, decided by the hosts themselves (train.agent.keeper runs this on each).

A *generation* is one fixed-size torchrun launch: a number, its members in rank order (rank 0 =
the first, the rendezvous host), the whole checkpoint it starts from, and why it began. Every keeper
says what it knows in its heartbeat (a `View`); the *current* generation is the highest one any
live host knows, by `Generation.key`. Only the *leader* (the first host of the run's order that is
live) makes a new one; every keeper adopts the current generation when it is a member.

The leader makes a new generation when:
- a member is *lost*: silent on the cluster network for `lost_after_s` (not: unreachable from the
  laptop). The survivors go on at once, with every live host;
- a live host is *outside* the current generation (it came back, or the two sides of a split see
  each other again): at the current generation's next checkpoint (no update is thrown away), or at
  once when the current one is not training;
- a member's ranks *ended* (a crash, not the end of the run) while every member is live: the same
  hosts again, at most `max_restarts` times an hour; then the run stops, saying why.

A new generation resumes from the newest whole checkpoint any live host holds, ordered by
(generation, update): two histories (a split's two sides) never mix, and the one set aside stays on
its host's disk (train.agent.replica.set_aside).

Two hosts have no majority: when they lose each other each goes on alone (a split costs GPU time,
never data: each writes its own disk), and the lowest in the run's order leads the reunion.
Waiting instead would leave a lone survivor idle for as long as its peer is gone, which is the
case this exists for (a host that died cannot be told from a link that did).

Pure: data in, data out (tests/unit/train/agent/test_generation.py).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

RUNNING, ENDED, IDLE, FINISHED = "running", "ended", "idle", "finished"


@dataclass(frozen=True)
class Checkpoint:
    """A whole checkpoint_last.pt a host holds, as its manifest says (train.agent.replica)."""

    generation: int
    update: int
    sha256: str
    size: int

    def key(self) -> tuple[int, int]:
        return (self.generation, self.update)

    @classmethod
    def of(cls, data: dict | None) -> Checkpoint | None:
        return cls(**{k: data[k] for k in ("generation", "update", "sha256", "size")}) if data else None


@dataclass(frozen=True)
class Generation:
    number: int
    members: tuple[str, ...]
    reason: str
    time: float
    source: dict | None = None  # {"host", "generation", "update", "sha256", "size"}: the checkpoint it starts from
    at_update: int | None = None  # the update the run had reached when it was decided
    pending: bool = False  # a start `fab train` asked for: the leader resolves its source once every member answers
    start: str = ""  # the `fab train` start it belongs to (a pending one is resolved for that start only)
    stopped: str = ""  # a generation without ranks: the run stopped, and why (restarts exhausted)

    def key(self, order: list[str]) -> tuple[int, bool, int]:
        """Higher is newer: the number, a resolved one over a pending one, then (the two sides of a
        split made the same number) the one led by the host first in the run's order."""
        leader = self.members[0] if self.members else ""
        return (self.number, not self.pending, -order.index(leader) if leader in order else -len(order))

    @property
    def leader(self) -> str | None:
        return self.members[0] if self.members else None

    def to_dict(self) -> dict:
        data = asdict(self)
        data["members"] = list(self.members)
        return data

    @classmethod
    def of(cls, data: dict | None) -> Generation | None:
        if not data:
            return None
        return cls(**{**data, "members": tuple(data.get("members") or ())})


@dataclass(frozen=True)
class View:
    """What one keeper says of its host: its heartbeat."""

    host: str
    generation: Generation | None
    checkpoint: Checkpoint | None
    ranks: str = IDLE  # running, ended (died before the run's end), idle, finished
    active: int | None = None  # the generation its ranks run in (or last ran in): its number,
    active_members: tuple[str, ...] = ()  # and its members (the two sides of a split may share a number)
    update: int | None = None  # the last update its log shows (rank 0's host only)
    how: str = ""  # how its ranks ended, in words
    stopping: bool = False  # `fab stop` asked it to stop

    def to_dict(self) -> dict:
        return {"host": self.host, "generation": self.generation.to_dict() if self.generation else None,
                "checkpoint": asdict(self.checkpoint) if self.checkpoint else None, "ranks": self.ranks,
                "active": self.active, "active_members": list(self.active_members), "update": self.update,
                "how": self.how, "stopping": self.stopping}

    @classmethod
    def of(cls, data: dict) -> View:
        return cls(host=data["host"], generation=Generation.of(data.get("generation")),
                   checkpoint=Checkpoint.of(data.get("checkpoint")), ranks=data.get("ranks", IDLE),
                   active=data.get("active"), active_members=tuple(data.get("active_members") or ()),
                   update=data.get("update"), how=data.get("how", ""),
                   stopping=bool(data.get("stopping")))


def runs_in(view: View, gen: Generation) -> bool:
    """Whether that host's ranks were started for `gen` (a number alone is not enough: see View)."""
    return view.active == gen.number and tuple(view.active_members) == tuple(gen.members)


def current(views: dict[str, View], order: list[str]) -> Generation | None:
    """The newest generation any of `views` knows."""
    known = [v.generation for v in views.values() if v.generation is not None]
    return max(known, key=lambda g: g.key(order)) if known else None


@dataclass
class LeaderMemory:
    """What the leader remembers between its decisions (never shared)."""

    # (generation, host): rank 0's checkpoint when the host was first seen outside the generation
    joining_since: dict[tuple[int, str], int | None] = field(default_factory=dict)
    ended_since: float | None = None
    restarts: list[float] = field(default_factory=list)


def best_checkpoint(views: dict[str, View], hosts: list[str]) -> dict | None:
    """The newest whole checkpoint among `hosts` by (generation, update); among equals the first host's."""
    held = [(views[h].checkpoint, -i, h) for i, h in enumerate(hosts) if h in views and views[h].checkpoint]
    if not held:
        return None
    checkpoint, _, host = max(held, key=lambda t: (t[0].key(), t[1]))
    return {"host": host, **asdict(checkpoint)}


def progress(views: dict[str, View]) -> int | None:
    updates = [v.update for v in views.values() if v.update is not None]
    return max(updates) if updates else None


def _new(number: int, members: list[str], views: dict[str, View], reason: str, now: float,
         at: int | None) -> Generation:
    return Generation(number=number, members=tuple(members), reason=reason, time=round(now, 1),
                      source=best_checkpoint(views, members), at_update=at)


def decide(me: str, order: list[str], views: dict[str, View], live: set[str], now: float, memory: LeaderMemory,
           lost_after_s: float = 20.0, ended_grace_s: float = 25.0, max_restarts: int = 3,
           elastic: bool = True) -> Generation | None:
    """The next generation, when `me` leads and one is due; else None. `views`: every host's last
    heartbeat (`me`'s own included), `live`: the hosts heard from within `lost_after_s`. Not
    `elastic` (`fab train --no-elastic`): a lost host or a crash stops the run instead."""
    live_order = [h for h in order if h in live]
    if not live_order or live_order[0] != me:
        return None
    last_heard = views  # a lost host's last heartbeat still says where rank 0 was
    views = {h: v for h, v in views.items() if h in live}
    gen = current(views, order)
    if gen is None or gen.stopped or any(v.stopping or v.ranks == FINISHED for v in views.values()):
        return None
    number = max(v.generation.number for v in views.values() if v.generation) + 1
    if gen.pending:  # a start: every member answers, so the newest checkpoint among them is known
        if all(m in live for m in gen.members):
            return Generation(number=gen.number, members=gen.members, reason=gen.reason, time=round(now, 1),
                              source=best_checkpoint(views, list(gen.members)), at_update=progress(views),
                              start=gen.start)
        return None
    at = progress(last_heard)
    lost = [m for m in gen.members if m not in live]
    if lost and not elastic:
        return Generation(number=number, members=(), reason=f"{', '.join(lost)} lost at update {at} "
                          f"(silent on the cluster network for {lost_after_s:g} s); --no-elastic: the run stops",
                          time=round(now, 1), at_update=at, stopped="a host lost, not elastic")
    if lost:
        memory.ended_since = None
        return _new(number, live_order, views,
                    f"{', '.join(lost)} lost at update {at if at is not None else '?'} "
                    f"(silent on the cluster network for {lost_after_s:g} s)", now, at)
    joining = [h for h in live_order if h not in gen.members]
    if joining and elastic:
        rank0 = views.get(gen.members[0])
        saved = rank0.checkpoint.update if rank0 and rank0.checkpoint and rank0.checkpoint.generation == gen.number \
            else None
        seen = [memory.joining_since.setdefault((gen.number, h), saved) for h in joining]
        training = any(views[m].ranks == RUNNING for m in gen.members if m in views)
        if not training or (saved is not None and any(s is None or saved > s for s in seen)):
            return _new(number, live_order, views, f"{', '.join(joining)} rejoined at update "
                        f"{saved if saved is not None else at if at is not None else '?'}", now, at)
        return None
    ended = [m for m in gen.members if views[m].ranks == ENDED and runs_in(views[m], gen)]
    if not ended:
        memory.ended_since = None
        return None
    memory.ended_since = memory.ended_since or now
    if now - memory.ended_since < ended_grace_s:
        return None  # a lost peer ends the others' ranks too: its loss is decided first
    memory.ended_since = None
    memory.restarts = [t for t in memory.restarts if now - t < 3600]
    how = "; ".join(f"{m}: {views[m].how or 'ended'}" for m in ended)
    if not elastic:
        return Generation(number=number, members=(), reason=f"ranks ended ({how}); --no-elastic: the run stops",
                          time=round(now, 1), at_update=at, stopped="ranks ended, not elastic")
    if len(memory.restarts) >= max_restarts:
        return Generation(number=number, members=(), reason=f"ranks ended ({how}); {max_restarts} restarts in "
                          "the last hour already: the run stops", time=round(now, 1), at_update=at,
                          stopped="restarts exhausted")
    memory.restarts.append(now)
    return _new(number, list(gen.members), views, f"ranks ended at update {at} ({how}): restarting", now, at)


def timeline_entry(gen: Generation, update_freq: int | None = None, ranks: int | None = None) -> dict:
    """A membership change as the run's record keeps it (train.report.members reads these)."""
    entry = {"generation": gen.number, "hosts": list(gen.members), "time": gen.time, "why": gen.reason,
             "from_update": (gen.source or {}).get("update", 0) if gen.members else None,
             "at_update": gen.at_update, "update_freq": update_freq, "ranks": ranks,
             "source": (gen.source or {}).get("host"), "source_generation": (gen.source or {}).get("generation")}
    if "lost at update" in gen.reason:
        entry["lost"] = gen.reason.split(" lost at update")[0].split(", ")
        entry["lost_at"] = gen.at_update
    if "rejoined at update" in gen.reason:
        entry["joined"] = gen.reason.split(" rejoined at update")[0].split(", ")
    return entry


def change_line(entry: dict) -> str:
    """A membership change in one line, as following, `fab status` and `fab watch` say it:
    `04:34:02 generation 2: v100a from update 150 (v100a's checkpoint), update-freq 2; v100b lost at ...`."""
    hosts = ", ".join(entry.get("hosts") or []) or "no host"
    when = time.strftime("%H:%M:%S", time.localtime(entry["time"])) if entry.get("time") else "?"
    start = f"from update {entry.get('from_update') or 0:,}"
    if entry.get("source"):
        start += f" ({entry['source']}'s checkpoint)"
    if entry.get("update_freq"):
        start += f", update-freq {entry['update_freq']}"
    if entry.get("ranks") and entry["ranks"] != len(entry.get("hosts") or []):
        start += f", {entry['ranks']} ranks"
    return f"{when} generation {entry.get('generation')}: {hosts} {start}; {entry.get('why', '')}"

