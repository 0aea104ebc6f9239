"""Which hosts train now, decided by the hosts themselves (train.agent.keeper.loop runs this on each).

A *generation* is one fixed-size torchrun launch: a number, its members in rank order (rank 0 =
the first, the rendezvous host), the whole checkpoint it starts from, and why it began. Every keeper
says what it knows in its heartbeat (a `View`: its generation, its checkpoint, the hosts it hears);
the *current* generation is the highest one any live host knows, by `Generation.key`. Only the
*leader* makes a new one; every keeper adopts the current generation when it is a member.

The leader is the first host of the run's order that is live in the view of some host this one
hears: with a one-sided partition (a-b cut, both hear c) b hears from c that a is there, so a alone
leads and b waits outside, instead of two leaders taking turns for ever. With three hosts or more a
side that does not hear a majority of the run's hosts never makes a generation (it never trains).

The leader makes a new generation when:
- a member is *lost*: silent on the cluster network for `lost_after_s` (not: unreachable from the
  laptop). The survivors go on at once, with every live host;
- a live host is *outside* the current generation (it came back, or the two sides of a split see
  each other again): at the current generation's next checkpoint (no update is thrown away), or at
  once when the current one is not training;
- a member's ranks *ended* (a crash, not the end of the run) while every member is live: the same
  hosts again, at most `max_restarts` times an hour (the budget travels with the generations, so a
  keeper restart or a new leader does not reset it); then the run stops, saying why;
- a member *cannot get* the checkpoint the generation starts from (it arrives corrupt, or its holder
  refuses to serve a copy its manifest does not match): the next best checkpoint then.

Progress orders histories, never generation numbers (they count trouble: each flap, crash restart
or start from nothing adds one): a new generation resumes from the whole checkpoint with the most
training any live member holds (its update: the keepers keep the tokens per update on every
membership, so updates measure tokens trained), and no generation starts from nothing while any host
of the run is known to hold a checkpoint. A checkpoint's `lineage` (the generations that trained it
and the update each began at) tells whether a host's own checkpoint is an older save of the history
the run goes on with (replaced) or another history (a split's other side: set aside whole, never
overwritten; train.agent.keeper.replica.set_aside).

Two hosts have no majority: when they lose each other each goes on alone (a split costs GPU time,
never data: each writes its own disk), and the reunion keeps the side with the most training.
Waiting instead would leave a lone survivor idle for as long as its peer is gone, which is the
case this exists for (a host that died cannot be told from a link that did).

Pure: data in, data out (tests/unit/train/agent/keeper/test_generation.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields, replace

RUNNING, ENDED, IDLE, FINISHED = "running", "ended", "idle", "finished"
STOPPED = "stopped"  # its keeper stopped them (a fence, a new membership): not a crash


LINEAGE_KEPT = 64  # generations a checkpoint remembers; an older save's history is then unknown: set aside
LEAVE_MARGIN_S = 10.0  # a host leaving (its cloud's notice) is left out this long before its deadline at the latest


def _shallow(obj) -> dict:
    """A dataclass's fields as a dict, without dataclasses.asdict's deep copy (every heartbeat sends one)."""
    return {f.name: getattr(obj, f.name) for f in fields(obj)}


@dataclass(frozen=True)
class Checkpoint:
    """A whole checkpoint_last.pt a host holds, as its manifest says (train.agent.keeper.replica)."""

    generation: int
    update: int
    sha256: str
    size: int
    # the generations that trained it, oldest first: (number, leader, the update it began at)
    lineage: tuple[tuple[int, str, int], ...] = ()

    def key(self) -> tuple[int, int]:
        """Training done first (updates at the keepers' constant tokens per update), then the generation."""
        return (self.update, self.generation)

    @classmethod
    def of(cls, data: dict | None) -> Checkpoint | None:
        if not data:
            return None
        lineage = tuple((int(n), str(leader), int(u)) for n, leader, u in data.get("lineage") or ())
        return cls(**{k: data[k] for k in ("generation", "update", "sha256", "size")}, lineage=lineage)

    def to_dict(self) -> dict:
        return {**_shallow(self), "lineage": [list(step) for step in self.lineage]}


def lineage_after(source: dict | None, number: int, leader: str) -> tuple[tuple[int, str, int], ...]:
    """The lineage of the saves generation `number` (led by `leader`) makes from `source`."""
    before = tuple(tuple(step) for step in (source or {}).get("lineage") or ())
    return (*before, (number, leader, int((source or {}).get("update") or 0)))[-LINEAGE_KEPT:]


def descends_from(want: dict, mine: Checkpoint) -> bool:
    """Whether `mine` is an older save of the history `want` (a checkpoint's dict) belongs to: then
    replacing it loses nothing. Another history's (a split's other side) is not."""
    if mine.sha256 == want.get("sha256"):
        return True
    theirs = [tuple(step) for step in want.get("lineage") or ()]
    if not mine.lineage or not theirs:  # saved before lineages: the same generation's older save only
        return mine.generation == want.get("generation") and mine.update <= want.get("update", -1)
    made_in = tuple(mine.lineage[-1])
    for i, step in enumerate(theirs):
        if tuple(step[:2]) == made_in[:2]:
            ended = theirs[i + 1][2] if i + 1 < len(theirs) else want.get("update", -1)
            return step[2] <= mine.update <= ended
    return False


@dataclass(frozen=True)
class Generation:
    number: int
    members: tuple[str, ...]
    reason: str
    time: float
    source: dict | None = None  # {"host", "generation", "update", "sha256", "size", "lineage"}: where it starts
    at_update: int | None = None  # the update the run had reached when it was decided
    pending: bool = False  # a start `fab train` asked for: the leader resolves its source once every member answers
    start: str = ""  # the `fab train` start it belongs to (a pending one is resolved for that start only)
    stopped: str = ""  # a generation without ranks: the run stopped, and why (restarts exhausted)
    among: tuple[str, ...] = ()  # a stopped one: the hosts that stopped (only they adopt it)
    restarts: tuple[float, ...] = ()  # the times of the run's crash restarts in the last hour: the budget
    churn: tuple[float, ...] = ()  # the times of its membership changes in the last hour
    # the run's clock when it was decided: seconds a keeper's monotonic clock counted on from the
    # generation before (a wall clock stepped an hour either way neither grants nor withholds a restart);
    # `restarts` and `churn` are on this clock
    clock: float = 0.0

    def key(self, order: list[str]) -> tuple[int, bool, int]:
        """Higher is newer: the number, a resolved one over a pending one, then (the two sides of a
        split made the same number) the one led by the host first in the run's order."""
        leader = self.members[0] if self.members else (self.among[0] if self.among else "")
        return (self.number, not self.pending, -order.index(leader) if leader in order else -len(order))

    @property
    def leader(self) -> str | None:
        return self.members[0] if self.members else None

    def to_dict(self) -> dict:
        data = _shallow(self)
        data["source"] = dict(self.source) if self.source is not None else None
        data["members"], data["among"] = list(self.members), list(self.among)
        data["restarts"], data["churn"] = list(self.restarts), list(self.churn)
        return data

    @classmethod
    def of(cls, data: dict | None) -> Generation | None:
        if not data:
            return None
        return cls(**{**data, "members": tuple(data.get("members") or ()), "among": tuple(data.get("among") or ()),
                      "restarts": tuple(data.get("restarts") or ()), "churn": tuple(data.get("churn") or ())})


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
    hears: tuple[str, ...] = ()  # the hosts it heard from within lost_after_s (itself included)
    cannot_get: str = ""  # the sha256 of a checkpoint it failed to get whole, again and again,
    cannot_get_why: str = ""  # and why
    cannot_hold: str = ""  # why it has no room for the run's next checkpoint (its /data full): left out until it has
    leaving: float | None = None  # its cloud reclaims it at this time (a spot notice, train.agent.keeper.preemption),
    leaving_why: str = ""  # the notice in words,
    leaving_after: int | None = None  # and the newest save it knew of then: the run goes on from a newer one

    def to_dict(self) -> dict:
        return {"host": self.host, "generation": self.generation.to_dict() if self.generation else None,
                "checkpoint": self.checkpoint.to_dict() if self.checkpoint else None, "ranks": self.ranks,
                "active": self.active, "active_members": list(self.active_members), "update": self.update,
                "how": self.how, "stopping": self.stopping, "hears": list(self.hears),
                "cannot_get": self.cannot_get, "cannot_get_why": self.cannot_get_why,
                "cannot_hold": self.cannot_hold, "leaving": self.leaving,
                "leaving_why": self.leaving_why, "leaving_after": self.leaving_after}

    @classmethod
    def of(cls, data: dict) -> View:
        return cls(host=data["host"], generation=Generation.of(data.get("generation")),
                   checkpoint=Checkpoint.of(data.get("checkpoint")), ranks=data.get("ranks", IDLE),
                   active=data.get("active"), active_members=tuple(data.get("active_members") or ()),
                   update=data.get("update"), how=data.get("how", ""),
                   stopping=bool(data.get("stopping")), hears=tuple(data.get("hears") or ()),
                   cannot_get=data.get("cannot_get", ""), cannot_get_why=data.get("cannot_get_why", ""),
                   cannot_hold=data.get("cannot_hold", ""), leaving=data.get("leaving"),
                   leaving_why=data.get("leaving_why", ""),
                   leaving_after=data.get("leaving_after"))


def runs_in(view: View, gen: Generation) -> bool:
    """Whether that host's ranks were started for `gen` (a number alone is not enough: see View)."""
    return view.active == gen.number and tuple(view.active_members) == tuple(gen.members)


def adopts(me: str | None, gen: Generation) -> bool:
    """A stopped generation binds only the hosts that stopped: a cut-off host that gave up alone
    must not end the healthy run it reconnects to."""
    return not gen.stopped or me is None or me in gen.among


def current(views: dict[str, View], order: list[str], me: str | None = None) -> Generation | None:
    """The newest generation any of `views` knows (that `me` adopts)."""
    known = [v.generation for v in views.values() if v.generation is not None and adopts(me, v.generation)]
    return max(known, key=lambda g: g.key(order)) if known else None


def leader(me: str, order: list[str], views: dict[str, View], live: set[str]) -> str | None:
    """The first host of the run's order that `me` hears, or hears of from a host it hears."""
    reachable = set(live)
    for host in live:
        if host != me and host in views:
            reachable |= set(views[host].hears)
    return next((h for h in order if h in reachable), None)


def connected(me: str, order: list[str], views: dict[str, View], live: set[str],
              members: tuple[str, ...] = ()) -> list[str]:
    """The live hosts that all hear each other, in rank order: the current generation's `members`
    first (a host that just came back, heard before it hears the others, never pushes them out), then
    the others in the run's order. A generation's ranks need every pair: a-b cut while both hear c
    gives a and c (or b and c), never all three."""

    def hears(host: str) -> set[str]:
        said = live if host == me else set(views[host].hears) if host in views and views[host].hears else None
        return said if said is not None else set(order)  # a host that says nothing of whom it hears: all

    together: list[str] = []
    for host in [*[m for m in members if m in order], *order]:
        if host in live and host not in together and all(host in hears(h) and h in hears(host) for h in together):
            together.append(host)
    return [h for h in order if h in together]


def quorate(order: list[str], live: set[str]) -> bool:
    """With three hosts or more, a side trains only with a majority of the run's hosts; two hosts
    have no majority, and each side may train alone (the reunion keeps the most training)."""
    return len(order) < 3 or 2 * len([h for h in order if h in live]) > len(order)


def copies_from(members: tuple[str, ...], me: str) -> str | None:
    """The host `me` copies each new save from, so that a majority of the generation's hosts hold it:
    the len // 2 hosts after rank 0's, each from the one before it (one copy a link); None for others."""
    index = members.index(me) if me in members else 0
    return members[index - 1] if 1 <= index <= len(members) // 2 else None


@dataclass
class LeaderMemory:
    """What the leader remembers between its decisions (never shared)."""

    # (generation, host): rank 0's checkpoint when the host was first seen outside the generation
    joining_since: dict[tuple[int, str], int | None] = field(default_factory=dict)
    ended_since: float | None = None
    waiting: str = ""  # why no generation is made although one is due (the keeper says it once)
    # host -> tick it was first heard again holding more training than the hosts that hear each other
    returning_since: dict[str, float] = field(default_factory=dict)
    pending_since: float | None = None  # tick: a start waits for a member that does not answer since


def best_checkpoint(views: dict[str, View], hosts: list[str], refused: set[str] = frozenset()) -> dict | None:
    """The whole checkpoint with the most training among `hosts`; among equals the first host's.
    `refused`: checkpoints (sha256) a member could not get whole."""
    held = [(views[h].checkpoint, -i, h) for i, h in enumerate(hosts)
            if h in views and views[h].checkpoint and views[h].checkpoint.sha256 not in refused]
    if not held:
        return None
    checkpoint, _, host = max(held, key=lambda t: (t[0].key(), t[1]))
    return {"host": host, **checkpoint.to_dict()}


def progress(views: dict[str, View]) -> int | None:
    updates = [v.update for v in views.values() if v.update is not None]
    return max(updates) if updates else None


def _new(number: int, members: list[str], views: dict[str, View], reason: str, now: float, at: int | None,
         budget: tuple[tuple[float, ...], tuple[float, ...]], refused: set[str] = frozenset(),
         holders: list[str] | None = None) -> Generation:
    """`holders`: the hosts whose checkpoints it may start from (its members; and a live host it leaves out)."""
    return Generation(number=number, members=tuple(members), reason=reason, time=round(now, 1),
                      source=best_checkpoint(views, list(dict.fromkeys(holders or members)), refused), at_update=at,
                      restarts=budget[0], churn=budget[1])


def _held_elsewhere(last_heard: dict[str, View], members: list[str]) -> str | None:
    """A host outside `members` known to hold a checkpoint with more training than any member's."""
    best = max((v.checkpoint.update for h, v in last_heard.items() if h in members and v.checkpoint), default=-1)
    others = [(v.checkpoint.update, h) for h, v in last_heard.items() if h not in members and v.checkpoint]
    if best < 0 and others:
        update, host = max(others)
        return f"{host} (update {update})"
    return None


def _returning_with_more(views: dict[str, View], staying: list[str], live: set[str], memory: LeaderMemory,
                         tick: float, lost_after_s: float) -> str:
    """Why the leader waits ('' when it does not): a host heard again (live) but not yet hearing the others
    holds more training than any of them; going on without it would resume from less. It waits as long
    as a peer takes to be lost, then goes on (a one-sided partition must not stop the run)."""
    best = max((views[h].checkpoint.key() for h in staying if views[h].checkpoint), default=(-1, -1))
    back = sorted(h for h in live if h not in staying and h in views and views[h].checkpoint
                  and views[h].checkpoint.key() > best)
    for h in list(memory.returning_since):
        if h not in back:
            del memory.returning_since[h]
    waiting = [h for h in back if tick - memory.returning_since.setdefault(h, tick) < lost_after_s]
    return (f"{', '.join(waiting)} heard again holding update "
            f"{max(views[h].checkpoint.update for h in waiting)}: waiting for it to hear the others") if waiting else ""


def _save_pending(views: dict[str, View], gen: Generation, going: list[str], staying: list[str],
                  now: float) -> str:
    """Why the leader does not go on without the `going` hosts yet ('' when it does): rank 0 saves at
    their notice (train.agent.keeper.preemption), and the run goes on once a staying host holds that save (a
    newer one than the leaving hosts knew of at their notice), once no ranks train (no save comes), or
    LEAVE_MARGIN_S before the first deadline, from the newest save the staying hosts hold then."""
    deadline = min(views[h].leaving for h in going)
    if now >= deadline - LEAVE_MARGIN_S or not any(views[m].ranks == RUNNING for m in gen.members if m in views):
        return ""
    known = [views[h].leaving_after for h in going]
    best = best_checkpoint(views, staying)
    if best is not None and (best["update"] > max(k for k in known if k is not None)
                             if any(k is not None for k in known) else best["generation"] == gen.number):
        return ""
    until = time.strftime("%H:%M:%SZ", time.gmtime(deadline - LEAVE_MARGIN_S))
    return (f"{', '.join(going)} leaving ({'; '.join(views[h].leaving_why for h in going)}): waiting for rank 0's "
            f"save to reach {', '.join(staying)} (until {until} at the latest)")


def decide(me: str, order: list[str], views: dict[str, View], live: set[str], now: float, memory: LeaderMemory,
           lost_after_s: float = 20.0, ended_grace_s: float = 25.0, max_restarts: int = 3,
           elastic: bool = True, max_rejoins: int = 6, agreed: Generation | None = None,
           tick: float | None = None, unheard: dict[str, int] | None = None,
           clock: float | None = None) -> Generation | None:
    """The next generation, when `me` leads and one is due (train.agent.keeper.generation's rules); else
    None. `clock`: the run's clock (Generation.clock; `now` when not given), which the restart budget and
    the membership changes are counted on."""
    clock = now if clock is None else clock
    made = _decide(me, order, views, live, now, memory, lost_after_s, ended_grace_s, max_restarts, elastic,
                   max_rejoins, agreed, tick, unheard or {}, clock)
    return replace(made, clock=round(clock, 1)) if made is not None and not made.clock else made


def _decide(me: str, order: list[str], views: dict[str, View], live: set[str], now: float, memory: LeaderMemory,
           lost_after_s: float = 20.0, ended_grace_s: float = 25.0, max_restarts: int = 3,
           elastic: bool = True, max_rejoins: int = 6, agreed: Generation | None = None,
           tick: float | None = None, unheard: dict[str, int] | None = None,
           clock: float | None = None) -> Generation | None:
    """The next generation, when `me` leads and one is due; else None. `views`: every host's last
    heartbeat (`me`'s own included; a silent host's last one too: what it held), `live`: the hosts
    heard from within `lost_after_s`, `now`: the wall clock (generations' times, the restart budget).
    Not `elastic` (`fab train --no-elastic`): a lost host or a crash stops the run instead. `agreed`:
    the generation etcd holds, when etcd decides who leads (train.agent.keeper.etcd: `me` holds the
    lease); without it the leader is the first host of the order that `me` hears or hears of. `tick`: a
    monotonic clock for the leader's own waits (a wall clock stepped back an hour must not postpone them).
    `unheard`: the members that went unheard since the current generation's ranks ran together, each
    with how many of the others missed it: ranks that ended then ended on the network, not on a crash,
    and a member most others missed is the one whose link failed (its membership change, counted)."""
    unheard = unheard or {}
    tick = now if tick is None else tick
    live = {h for h in live if h in views}  # a peer not heard yet since this keeper started says nothing
    if me not in live or (agreed is None and leader(me, order, views, live) != me):
        return None
    last_heard = views  # a lost host's last heartbeat still says where rank 0 was, and what it held
    views = {h: v for h, v in views.items() if h in live}
    gen = agreed or current(views, order, me)
    if gen is None or gen.stopped or any(v.stopping or v.ranks == FINISHED for v in views.values()):
        return None
    live_order = connected(me, order, last_heard, live, gen.members)  # the live hosts that all reach each other
    if me not in live_order or not quorate(order, set(live_order)):
        return None  # cut off from the generation's hosts (or just back: heard before it is heard)
    number = max([gen.number] + [v.generation.number for v in views.values() if v.generation]) + 1
    clock = now if clock is None else clock
    recent = tuple(t for t in gen.restarts if -60 < clock - t < 3600)  # (an entry from another clock: dropped)
    churn = tuple(t for t in gen.churn if -60 < clock - t < 3600)
    changed = (recent, (*churn, round(clock, 1)))  # a membership change: counted, never a reason to stop
    memory.waiting = ""
    if gen.pending:  # a start: every member answers, so the newest checkpoint among them is known
        if all(m in live for m in gen.members):
            memory.pending_since = None
            return Generation(number=gen.number, members=gen.members, reason=gen.reason, time=round(now, 1),
                              source=best_checkpoint(views, list(gen.members)), at_update=progress(views),
                              start=gen.start, restarts=recent, churn=churn)
        # a member that never answers (lost for good since the start was asked) must not hold it forever:
        # past lost_after_s the hosts that answer start it, never from less than a silent one held
        since = memory.pending_since = memory.pending_since if memory.pending_since is not None else tick
        answering = [m for m in live_order if m in gen.members]
        if tick - since < lost_after_s or not quorate(order, set(answering)) or \
                _held_elsewhere(last_heard, answering):
            return None
        memory.pending_since = None
        silent = [m for m in gen.members if m not in answering]
        return Generation(number=gen.number, members=tuple(answering), time=round(now, 1),
                          reason=f"{gen.reason}; {', '.join(silent)} silent since it was asked: started without",
                          source=best_checkpoint(views, answering), at_update=progress(views), start=gen.start,
                          restarts=recent, churn=churn)
    at = progress(last_heard)
    leaving = [h for h in live_order if views[h].leaving is not None]  # their cloud reclaims them: never taken back
    staying = [h for h in live_order if h not in leaving] or live_order
    lost = [m for m in gen.members if m not in live_order]
    why = f"silent on the cluster network for {lost_after_s:g} s" if all(m not in live for m in lost) else \
        "cut off from another member: a one-sided partition"
    if lost and not elastic:
        return Generation(number=number, members=(), reason=f"{', '.join(lost)} lost at update {at} "
                          f"({why}); --no-elastic: the run stops",
                          time=round(now, 1), at_update=at, stopped="a host lost, not elastic", among=gen.members)
    if lost:
        memory.ended_since = None
        if elsewhere := _held_elsewhere(last_heard, staying):  # never from nothing while a lost host
            memory.waiting = f"{', '.join(lost)} lost, but only {elsewhere} holds a checkpoint: waiting for it"
            return None
        if back := _returning_with_more(views, staying, live, memory, tick, lost_after_s):
            memory.waiting = back  # heard again, not yet hearing us: its training is worth a round or two
            return None
        return _new(number, staying, views,
                    f"{', '.join(lost)} lost at update {at if at is not None else '?'} ({why})", now, at, changed)
    refused = {views[m].cannot_get for m in gen.members if views[m].cannot_get}
    wanted = (gen.source or {}).get("sha256")
    # a host without room: left out before it joins, or while it holds rank 0 (its next save would die)
    full = [m for m in gen.members if views[m].cannot_hold and (not runs_in(views[m], gen) or m == gen.members[0])]
    receivers = [m for m in gen.members if wanted and views[m].cannot_get == wanted] + full
    if receivers:
        src = gen.source or {}
        who = "; ".join(f"{m}: {views[m].cannot_hold or views[m].cannot_get_why or 'failed'}" for m in receivers)
        holders = [h for h in live_order if h not in receivers and views[h].checkpoint is not None
                   and views[h].checkpoint.sha256 == wanted]
        rest = [m for m in staying if m not in receivers and not views[m].cannot_hold
                and not (m not in gen.members and views[m].cannot_get == wanted)]
        source = src.get("host")
        able = [m for m in staying if not views[m].cannot_hold]
        gone = source in receivers or source not in views or views[source].checkpoint is None or \
            views[source].checkpoint.sha256 != wanted  # its holder no longer holds it whole
        failing = [m for m in receivers if views[m].cannot_get == wanted]  # not only hosts without room
        if holders and gone and failing and source not in full and quorate(order, set(able)):
            # its holder's own copy rotted (or is gone) and a replica is whole: copied from there instead
            return _new(number, able, views, f"the checkpoint of update {src.get('update')} is copied from "
                        f"{holders[0]} instead ({who})", now, at, (recent, churn), holders=[*able, *holders])
        if full and full[0] == gen.members[0] and not (rest and quorate(order, set(rest))) and all(
                views[m].checkpoint is not None for m in full):
            # rank 0's host is full and the others are no majority without it: it trains on, rank 0 elsewhere
            moved = [m for m in gen.members if m not in full] + full
            if moved != list(gen.members) and quorate(order, set(moved)):
                return _new(number, moved, views, f"rank 0 moves off {', '.join(full)} at update {at} ({who})", now,
                            at, (recent, churn))
        if (holders or full) and rest and quorate(order, set(rest)):
            # the checkpoint is whole where it is: the hosts that cannot take it are left out, never it
            what = who if set(receivers) <= set(full) else (
                f"cannot take the checkpoint of update {src.get('update')} from {src.get('host')}: {who}")
            return _new(number, rest, views, f"{', '.join(receivers)} left out at update "
                        f"{at if at is not None else '?'} ({what})", now, at, changed,
                        holders=[*rest, *holders, *full])  # a full disk still serves the checkpoint it holds
        if not holders and wanted in refused:
            # no live host holds it whole any more: the next best, among every host that hears the others
            able = [h for h in staying if not views[h].cannot_hold]
            if elsewhere := _held_elsewhere(last_heard, [h for h in able if views[h].checkpoint is None
                                                          or views[h].checkpoint.sha256 not in refused]):
                memory.waiting = f"no member can get the checkpoint {src.get('host')} held; {elsewhere}"
                return None
            if not able or not quorate(order, set(able)):
                memory.waiting = f"no majority can take a checkpoint ({who}): waiting"
                return None
            return _new(number, able, views, f"the checkpoint of update {src.get('update')} on "
                        f"{src.get('host')} could not be copied whole ({who}): from the next best", now, at,
                        (recent, churn), refused)
        memory.waiting = f"{', '.join(receivers)} cannot take the run's checkpoint ({who}): the others wait"
        return None
    going = [m for m in gen.members if m in leaving and m not in staying]
    if going and elastic and quorate(order, set(staying)):
        if waits := _save_pending(views, gen, going, staying, now):
            memory.waiting = waits
            return None
        return _new(number, staying, views, f"{', '.join(going)} leaving at update {at if at is not None else '?'} "
                    f"({'; '.join(views[h].leaving_why for h in going)})", now, at, changed)
    going_on = (best_checkpoint(views, staying) or {}).get("sha256")
    joining = [h for h in staying if h not in gen.members and not views[h].cannot_hold
               and not (going_on and views[h].cannot_get == going_on)]
    if (outside := [h for h in staying if h not in gen.members and h not in joining]) and not joining:
        memory.waiting = "; ".join(f"{h} back, but it cannot take the run's checkpoint "
                                   f"({views[h].cannot_hold or views[h].cannot_get_why})" for h in outside)
    if joining and elastic:
        rank0 = views.get(gen.members[0])
        saved = rank0.checkpoint.update if rank0 and rank0.checkpoint and rank0.checkpoint.generation == gen.number \
            else None
        seen = [memory.joining_since.setdefault((gen.number, h), saved) for h in joining]
        # every member's ranks run (one that crashed waits for no save: there will be none)
        training = all(views[m].ranks == RUNNING for m in gen.members if m in views)
        if not training or (saved is not None and any(s is None or saved > s for s in seen)):
            if len(churn) < max_rejoins:
                return _new(number, [h for h in live_order if h in gen.members or h in joining], views,
                            f"{', '.join(joining)} rejoined at update "
                            f"{saved if saved is not None else at if at is not None else '?'}", now, at, changed)
            # a link that flaps: the run goes on without it, also when the host is back before the others
            # train again (a 25-s cut with 20 s to be lost: back as their restart begins; CI, 29 Nov)
            memory.waiting = (f"{', '.join(joining)} back, but the run's membership changed {len(churn)} times "
                              f"in the last hour: taken back once it is under {max_rejoins}")
            if training:
                return None
            # not training: ranks that ended are restarted below, without it
        else:
            return None
    ended = [m for m in gen.members if views[m].ranks in (ENDED, STOPPED) and runs_in(views[m], gen)]
    if not ended:
        memory.ended_since = None
        return None
    memory.ended_since = memory.ended_since if memory.ended_since is not None else tick
    if tick - memory.ended_since < ended_grace_s:
        return None  # a lost peer ends the others' ranks too: its loss is decided first
    memory.ended_since = None
    how = "; ".join(f"{m}: {views[m].how or 'ended'}" for m in ended)
    if fenced := [m for m in ended if views[m].ranks == STOPPED]:  # cut off from etcd, not a crash: no budget
        return _new(number, list(gen.members), views, f"ranks of {', '.join(fenced)} stopped by their keeper at "
                    f"update {at} (cut off from the run's majority): restarting", now, at, (recent, churn))
    if dropped := sorted(m for m in unheard if m in gen.members):  # the network broke the collective: no budget
        flapped = [m for m in dropped if 2 * unheard[m] > len(gen.members) - 1]
        rest = [m for m in gen.members if m not in flapped]
        if flapped and rest and len(churn) >= max_rejoins and quorate(order, set(rest)):
            return _new(number, rest, views, f"{', '.join(flapped)} left out at update {at}: its link went down "
                        f"again ({len(churn)} membership changes in the last hour; {how})", now, at, changed)
        return _new(number, list(gen.members), views, f"ranks ended at update {at} after {', '.join(dropped)} "
                    f"went unheard ({how}): restarting, not counted as a crash", now, at,
                    changed)  # a membership change all the same: a flapping link's count goes on
    if not elastic:
        return Generation(number=number, members=(), reason=f"ranks ended ({how}); --no-elastic: the run stops",
                          time=round(now, 1), at_update=at, stopped="ranks ended, not elastic", among=gen.members)
    if len(recent) >= max_restarts:
        return Generation(number=number, members=(), reason=f"ranks ended ({how}); {max_restarts} restarts in "
                          "the last hour already: the run stops", time=round(now, 1), at_update=at,
                          stopped="restarts exhausted", among=gen.members, restarts=recent, churn=churn)
    return _new(number, list(gen.members), views, f"ranks ended at update {at} ({how}): restarting", now, at,
                ((*recent, round(clock, 1)), churn))


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

