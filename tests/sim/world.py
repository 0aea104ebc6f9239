"""The world the keepers live in, simulated: hosts that crash and come back, links cut one way or
both, disks that fill, lose a byte or a manifest, rank processes that train, save and crash, clocks
that step, and a linearizable store standing in for etcd whose writes need a reachable majority.

The keepers themselves are real: train.agent.keeper.loop.Keeper with its Holding, Fence, Consensus
and the leader's decide(), driven round by round on the simulated clock. Only what a keeper touches
outside Python is replaced (`world=` of Keeper): its ranks' processes (SimRanks, a subclass of the
real Ranks whose bookkeeping stays), the checkpoint files (SimStore, train.agent.keeper.replica's
functions), the copy thread (a simulated transfer), its peers' answers and etcd. The keeper's own
small files (generation.json, timeline.jsonl, active.json) are real files in a scratch folder.

Deterministic: one seeded random.Random, an integer-millisecond clock, sorted iteration; no sleeps,
threads or sockets.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from train.agent.keeper import etcd, files, replica
from train.agent.keeper.generation import Generation
from train.agent.keeper.loop import Keeper, linger_s
from train.agent.keeper.ranks import Ranks

POLL_MS = 2000  # the keepers' round (spec poll_s)
TICK_MS = 500
SAVE_EVERY = 10  # rank 0 saves every 10 updates
UPDATES_PER_S = 2
CKPT_SIZE = 100  # a checkpoint's size in the disks' units
DISK = 1000  # a host's /data
RENDEZVOUS_MS = 900_000  # ranks that wait longer for their peers end (torchrun static rendezvous: 15 min)
PEER_DEAD_MS = 5_000  # a peer's ranks gone: the collective fails this soon
LINK_CUT_MS = 30_000  # a peer cut off: the collective times out
COPY_MS = 3_000  # a checkpoint copy host to host


@dataclass
class File:
    """A checkpoint file on a simulated disk; copies share the id (the same bytes, the same sha256)."""

    id: int
    update: int
    size: int = CKPT_SIZE
    corrupt: bool = False
    made_ms: int = 0


@dataclass
class Disk:
    capacity: int = DISK
    last: File | None = None  # fairseq's checkpoint_last.pt
    snap: File | None = None  # the keeper's snapshot (.keep/), a hard link of `last` after a snapshot
    manifest: dict | None = None
    torn: bool = False  # the manifest no longer parses
    aside: list[tuple[File, dict]] = field(default_factory=list)
    previous: tuple[File, int] | None = None  # the snapshot before this one, and when it was replaced

    def used(self) -> int:
        held = {id(f): f.size for f in (self.last, self.snap) if f is not None}
        return sum(held.values()) + sum(f.size for f, _ in self.aside)

    def free(self) -> int:
        return self.capacity - self.used()


@dataclass
class Procs:
    """A host's rank processes of one generation."""

    generation: int
    members: tuple[str, ...]
    started_ms: int
    resumed: int | None  # the update they resumed from (None: from nothing)
    resumed_file: int | None
    running: bool = True
    how: str = ""
    broken_since: int | None = None
    stopped_by_keeper: bool = False


class Host:
    def __init__(self, name: str, root: Path):
        self.name, self.root = name, root
        self.run_dir = str(root / name)
        self.up = True
        self.disk = Disk()
        self.procs: Procs | None = None
        self.keeper: Keeper | None = None
        self.keeper_ended_ms: int | None = None
        self.keeper_down_until: int | None = None
        self.clock_offset_s = 0.0
        self.flaky_until = 0  # copies from or to it fail until then (connection reset)
        self.etcd_lost = False  # its etcd member's data wiped: down until it joins again as a new member
        self.gone = False  # lost for good (faults "lose")
        self.log: list[str] = []


class AnyMembership(dict):
    """The spec's training commands: one for every membership (the processes are simulated)."""

    def __missing__(self, key: str) -> dict:
        return {h: "true" for h in key.split(",")}


class SimRanks(Ranks):
    """The real Ranks' bookkeeping (active.json, lineage, what a stop means) over simulated processes."""

    def __init__(self, world: World, host: Host, spec: dict):
        super().__init__(host.run_dir, spec)
        self.world, self.host = world, host

    def alive(self) -> list[int]:
        return [1] if self.host.procs is not None and self.host.procs.running else []

    def finished(self) -> bool:
        return False  # runs never end in the simulator

    def how(self, state: str) -> str:
        procs = self.host.procs
        return (procs.how or "its ranks exited") if procs is not None and state != "running" else ""

    def last_update(self) -> int | None:
        return self.world.update_of(self.host) if self.rank0_here() else None

    def launch(self, command: str) -> bool:
        return True

    def end_processes(self, mark: bool) -> None:
        if self.host.procs is not None and self.host.procs.running:
            self.host.procs.running, self.host.procs.how = False, "stopped by its keeper"
            self.host.procs.stopped_by_keeper = True

    def wait(self, seconds: float) -> None:
        self.stop()

    def start(self, gen: Generation, checkpoint) -> bool:
        if not super().start(gen, checkpoint):
            return False
        self.world.start_procs(self.host, gen)
        return True


class SimStore:
    """train.agent.keeper.replica's functions over the simulated disks (run_dir names the host)."""

    def __init__(self, world: World):
        self.world = world

    def disk(self, run_dir: str) -> Disk:
        return self.world.by_dir[run_dir].disk

    def loose(self, run_dir: str) -> bool:
        return self.disk(run_dir).last is not None

    def manifest(self, run_dir: str) -> dict | None:
        d = self.disk(run_dir)
        # torn: the manifest no longer parses, and replica.manifest reads its second copy
        if d.manifest is None or d.snap is None or d.snap.size != d.manifest["size"]:
            return None
        return dict(d.manifest)

    def verify(self, run_dir: str, held: dict, cached: bool = False) -> bool:
        d = self.disk(run_dir)
        return d.snap is not None and not d.snap.corrupt and sha(d.snap) == held.get("sha256")

    def snapshot(self, run_dir: str, generation: int, seen, lineage=()):
        d = self.disk(run_dir)
        if d.last is None or d.last.id == seen:
            return seen, None
        if d.snap is not None and d.snap is not d.last:
            d.previous = (d.snap, self.world.now)
        d.snap = d.last
        d.manifest = {"generation": generation, "update": d.last.update, "size": d.last.size, "sha256": sha(d.last),
                      "lineage": [list(step) for step in lineage]}
        d.torn = False
        return d.last.id, dict(d.manifest)

    def seen_now(self, run_dir: str):
        d = self.disk(run_dir)
        return d.last.id if d.last else None

    def clear(self, run_dir: str) -> None:
        d = self.disk(run_dir)
        d.last = d.snap = d.manifest = None

    def restore(self, run_dir: str) -> None:
        d = self.disk(run_dir)
        d.last = d.snap

    def set_aside(self, run_dir: str, held: dict, why: str = "", keep: int = replica.SET_ASIDE_KEPT):
        d = self.disk(run_dir)
        source = d.snap or d.last
        if source is None:
            return None
        d.aside.append((source, {**held, "why": why or "another history", "set_aside_at": self.world.now}))
        d.last = d.snap = d.manifest = None
        listed = [{**info, "path": str(i)} for i, (_, info) in enumerate(d.aside)]
        removed = {int(e["path"]) for e in replica.pruned(listed, keep)}
        for i in sorted(removed):
            self.world.pruned(self.world.by_dir[run_dir], d.aside[i][0])
        d.aside = [a for i, a in enumerate(d.aside) if i not in removed]
        return Path(run_dir) / "set-aside" / f"g{held.get('generation')}-u{held.get('update')}"

    def fetch(self, url: str, token: str, run_dir: str, want: dict, keep=lambda: True, lock=None,
              context=None) -> dict:
        return self.world.copy(url.split("//")[1].split(":")[0], self.world.by_dir[run_dir], want, keep)

    def free(self, run_dir: str) -> int:
        return self.disk(run_dir).free()

    def said_no_room(self, run_dir: str, why: str) -> None:
        pass  # fab status's file: the simulator reads the heartbeat

    def remove_partials(self, run_dir: str) -> None:
        pass  # a simulated copy is whole or absent


def sha(f: File) -> str:
    return f"sha-{f.id}"


class Copy:
    """A copy under way (the keeper's fetch thread): done at its time on the simulated clock."""

    def __init__(self, work, due: int, keeper: Keeper):
        self.work, self.due, self.keeper, self.done = work, due, keeper, False

    def is_alive(self) -> bool:
        return not self.done


class NoNotices:
    """No cloud notices and no copies off the cluster in the simulator (their own tests cover them)."""

    leaving: dict = {}

    class offsite:  # noqa: N801 - the shape of train.agent.offsite.schedule.Uploads the keeper calls
        @staticmethod
        def tick(members): ...

        @staticmethod
        def closing(): ...

        @staticmethod
        def finish(members, ended): ...

    def heed(self, held): ...

    def save_for_leaving(self, seen, ranks, checkpoint): ...

    def watch(self): ...


class SimEtcd:
    """A linearizable key-value store with leases, as the keepers use etcd: readable and writable
    only from a host that reaches a member with a majority of the members behind it."""

    def __init__(self, world: World, order: list[str]):
        self.world, self.members = world, etcd.members(order)
        self.starts_at: dict[str, int] = {}  # an added member serves from then (ms)
        self.generation: tuple[str | None, int] = (None, 0)
        self.revision = 0
        self.leader: tuple[str, int, int] | None = None  # (holder, lease, expiry ms)
        self.leases: dict[int, int] = {}  # lease -> expiry ms
        self.next_lease = 1

    def serving(self, m: str) -> bool:
        h = self.world.hosts[m]
        return h.up and not h.etcd_lost and self.world.now >= self.starts_at.get(m, 0)

    def follow(self, live: set[str], gone: set[str]) -> str | None:
        """etcd's member API as train.agent.keeper.etcd.Agreement.follow uses it: the real next_change; an
        added member serves once its host's keeper started it (a round later, while its host is up)."""
        listed = {m: self.world.now >= self.starts_at.get(m, 0) for m in self.members}
        remove, add = etcd.next_change(listed, live, gone, self.world.order, len(etcd.members(self.world.order)))
        if remove is not None:
            self.members.remove(remove)
            self.world.note(f"etcd: {remove}'s member removed")
        if add is not None:
            self.members.append(add)
            self.starts_at[add] = self.world.now + POLL_MS
            self.world.hosts[add].etcd_lost = False  # a new member: whatever its data was, it joins afresh
            self.world.note(f"etcd: {add} added as a member")
        return f"etcd: {remove} removed, {add} added" if remove or add else None

    def reachable(self, me: str) -> bool:
        w = self.world
        for raft_leader in self.members:
            if not self.serving(raft_leader):
                continue
            behind = [x for x in self.members if self.serving(x) and (x == raft_leader or w.both(raft_leader, x))]
            if 2 * len(behind) <= len(self.members):
                continue
            if any(self.serving(m) and (m == me or w.both(me, m)) and (m == raft_leader or w.both(m, raft_leader))
                   for m in self.members):
                return True
        return False

    def rejoin(self, h: Host) -> None:
        """train.agent.keeper.etcd.rejoin, as the keeper's loop runs it while its member is down: a member
        whose data is gone joins again as a new one once the others' majority answers."""
        if h.etcd_lost and h.name in self.members and self.reachable(h.name):
            h.etcd_lost = False
            self.world.note(f"{h.name}'s etcd member joined again as a new member")

    def expire(self) -> None:
        now = self.world.now
        self.leases = {k: t for k, t in self.leases.items() if t > now}
        if self.leader and self.leader[1] not in self.leases:
            self.leader = None


class SimAgreement:
    """train.agent.keeper.etcd.Agreement's calls against SimEtcd. A write may be applied and still
    answered with an error (a timeout after the majority took it): Jepsen's "maybe applied"."""

    def __init__(self, world: World, me: str, ttl_s: float):
        self.world, self.me, self.ttl_ms = world, me, int(ttl_s * 1000)
        self.lease: int | None = None

    def store(self) -> SimEtcd:
        store = self.world.etcd
        store.expire()
        if not store.reachable(self.me):
            raise etcd.Unavailable(f"{self.me}: no etcd member with a majority answers")
        return store

    def leads(self) -> bool:
        try:
            store = self.store()
        except etcd.Unavailable:
            return False
        now = self.world.now
        if self.lease not in store.leases:
            self.lease, store.next_lease = store.next_lease, store.next_lease + 1
        store.leases[self.lease] = now + self.ttl_ms
        if store.leader is None:
            store.leader = (self.me, self.lease, 0)
        return store.leader[0] == self.me and store.leader[1] == self.lease

    def follow(self, live: set[str], gone: set[str]) -> str | None:
        try:
            return self.store().follow(live, gone)
        except etcd.Unavailable:
            return None

    def current(self) -> etcd.Agreed:
        value, revision = self.store().generation
        return etcd.Agreed(Generation.of(json.loads(value)) if value else None, revision)

    def propose(self, gen: Generation, revision: int) -> bool:
        store = self.store()
        if store.generation[1] != revision:
            return False
        store.revision += 1
        store.generation = (json.dumps(gen.to_dict()), store.revision)
        self.world.agreed(gen)
        if self.world.rng.random() < self.world.profile.get("maybe_applied", 0.0):
            raise etcd.Unavailable("timed out after the write was applied")
        return True


class SimKeeper(Keeper):
    def __init__(self, world: World, host: Host, spec: dict):
        self.world_, self.host = world, host
        parts = {"ranks": SimRanks(world, host, spec), "store": world.store, "notices": NoNotices(),
                 "spawn": lambda work: world.spawn(work, self)}
        if etcd.uses_etcd(spec["order"]):
            parts["agreement"] = SimAgreement(world, host.name, max(2, int(float(spec["lost_after_s"]) / 2)))
        super().__init__(host.run_dir, spec, clock=lambda: world.now / 1000 + host.clock_offset_s + 1.7e9,
                         ticks=lambda: world.now / 1000, world=parts)

    def ask_peers(self):
        return {p: self.world_.ask(self.me, p) for p in self.peers}


class Voice:
    """What a keeper says while it acts goes to its host's log, on the simulated clock."""

    def __init__(self, world: World, h: Host):
        self.world, self.h = world, h

    def __enter__(self):
        self.before = files.LISTENER
        files.LISTENER = lambda text: self.h.log.append(f"{self.world.now / 1000:7.1f} {text}")

    def __exit__(self, *exc):
        files.LISTENER = self.before


class World:
    """Hosts, links, disks, processes and etcd on one integer-millisecond clock."""

    def __init__(self, names: list[str], rng, profile: dict, spec_extra: dict | None = None):
        self.rng, self.profile, self.now = rng, profile, 0
        self.root = Path(tempfile.mkdtemp(prefix="tandem-sim-", dir="/dev/shm" if Path("/dev/shm").is_dir() else None))
        self.order = list(names)
        self.hosts = {n: Host(n, self.root) for n in names}
        self.by_dir = {h.run_dir: h for h in self.hosts.values()}
        self.cut: Counter = Counter()  # directed: (from, to) dropped, by as many faults as hold it
        self.store = SimStore(self)
        self.etcd = SimEtcd(self, self.order)
        self.copies: list[Copy] = []
        self.answers: dict = {}  # this tick's answers of each host's keeper
        self.file_ids = 0
        self.training_update: dict[tuple[int, tuple[str, ...]], int] = {}  # a generation's progress
        self.events: list[str] = []  # what happened, for a failure's report
        self.observers: list = []
        self.spec = {"run_id": "sim", "order": self.order, "members": self.order, "start": "s1", "reason": "start",
                     "addresses": {n: n for n in names}, "port": 29500, "token": "t", "lost_after_s": 20,
                     "ended_grace_s": 25, "poll_s": POLL_MS / 1000, "max_restarts": 3, "max_rejoins": 6,
                     "commands": {}, **(spec_extra or {})}
        for h in self.hosts.values():
            (Path(h.run_dir) / "keeper").mkdir(parents=True)
            self.start_keeper(h)

    def close(self) -> None:
        files.LISTENER = None
        shutil.rmtree(self.root, ignore_errors=True)

    # --- what happens, said

    def note(self, text: str) -> None:
        self.events.append(f"{self.now / 1000:7.1f} {text}")

    # --- the network

    def link(self, a: str, b: str) -> bool:
        return self.cut[(a, b)] <= 0

    def sever(self, pairs) -> None:
        self.cut.update(pairs)

    def mend(self, pairs) -> None:
        self.cut.subtract(pairs)

    def both(self, a: str, b: str) -> bool:
        return a == b or (self.link(a, b) and self.link(b, a) and self.hosts[a].up and self.hosts[b].up)

    def ask(self, me: str, peer: str):
        h = self.hosts[peer]
        if not self.both(me, peer) or h.keeper is None:
            return None
        if peer not in self.answers:  # what it says stays the same until it acts again
            with self.speaking(h):
                said = h.keeper.answer()
            self.answers[peer] = type(said).of(said.to_dict())  # as the heartbeat sends it: every field a dict's
        return self.answers[peer]

    # --- keepers

    def keeper_spec(self, h: Host) -> dict:
        return {**self.spec, "me": h.name, "addresses": {n: n for n in self.order}, "commands": AnyMembership()}

    def start_keeper(self, h: Host) -> None:
        spec = self.keeper_spec(h)
        files.write_json(Path(h.run_dir) / "keeper" / "spec.json", {**spec, "commands": {}})
        with self.speaking(h):
            h.keeper = SimKeeper(self, h, spec)
        h.keeper_ended_ms, h.keeper_down_until = None, None

    def stop_keeper(self, h: Host) -> None:
        if h.keeper is not None:
            self.copies = [c for c in self.copies if c.keeper is not h.keeper]
        h.keeper = None

    def speaking(self, h: Host) -> Voice:
        return Voice(self, h)

    def round(self, h: Host) -> None:
        """One round of h's keeper."""
        if h.keeper is None or h.keeper_ended_ms is not None:
            return
        self.etcd.rejoin(h)
        self.answers.pop(h.name, None)
        with self.speaking(h):
            ended = h.keeper.step()
        self.answers.pop(h.name, None)
        with self.speaking(h):
            if ended:
                h.keeper.end(ended)
                h.keeper_ended_ms = self.now
                self.note(f"{h.name}'s keeper ends: {ended}")

    # --- copies

    def spawn(self, work, keeper: Keeper) -> Copy:
        c = Copy(work, self.now + COPY_MS, keeper)
        self.copies.append(c)
        return c

    def copy(self, holder: str, to: Host, want: dict, keep=lambda: True) -> dict:
        src = self.hosts[holder]
        if not self.both(holder, to.name):
            raise replica.FetchError(f"http://{holder}: URLError: timed out")
        if self.now < src.flaky_until or self.now < to.flaky_until:
            raise replica.FetchError(f"http://{holder}: ConnectionResetError: [Errno 104] Connection reset by peer")
        f = src.disk.snap
        was = src.disk.previous
        if was is not None and sha(was[0]) == want["sha256"] and self.now - was[1] < COPY_MS:
            f = was[0]  # replaced while it was being sent: the holder's open file is sent whole
        elif f is None or sha(f) != want["sha256"] or src.disk.manifest is None:
            raise replica.FetchError(f"http://{holder}: HTTP Error 409: its copy no longer matches its manifest")
        if f.corrupt:
            raise replica.FetchError(f"http://{holder}: sha256 differs from the manifest's: not replaced")
        d = to.disk
        if d.free() < f.size:
            raise replica.FetchError(f"http://{holder}: OSError: [Errno 28] No space left on device")
        if not keep():
            raise replica.Superseded(f"http://{holder}: the copy of update {want['update']} arrived after this "
                                     "host's ranks started from another: dropped")
        d.last = d.snap = File(f.id, f.update, f.size, False, f.made_ms)
        d.manifest = {k: want[k] for k in ("generation", "update", "size", "sha256", "lineage") if k in want}
        d.torn = False
        return want

    # --- ranks

    def start_procs(self, h: Host, gen: Generation) -> None:
        last = h.disk.last
        h.procs = Procs(gen.number, tuple(gen.members), self.now, last.update if last else None,
                        last.id if last else None)
        for o in self.observers:
            o.started(self, h, gen)

    def update_of(self, h: Host) -> int | None:
        p = h.procs
        if p is None:
            return None
        return self.training_update.get((p.generation, p.members))

    def groups(self) -> dict[tuple[int, tuple[str, ...]], list[Host]]:
        out: dict = {}
        for h in self.hosts.values():
            if h.up and h.procs is not None and h.procs.running:
                out.setdefault((h.procs.generation, h.procs.members), []).append(h)
        return out

    def training(self) -> list[tuple[int, tuple[str, ...]]]:
        """The generations whose every member's ranks run together, connected: they train."""
        return [key for key, hs in sorted(self.groups().items())
                if len(hs) == len(key[1]) and all(self.both(a.name, b.name) for a in hs for b in hs)]

    def advance_ranks(self, dt_ms: int) -> None:
        for key, hs in sorted(self.groups().items()):
            members = key[1]
            together = len(hs) == len(members) and all(self.both(a.name, b.name) for a in hs for b in hs)
            if together:
                for h in hs:
                    h.procs.broken_since = None
                starts = {h.procs.resumed_file for h in hs}
                if key not in self.training_update:
                    self.training_update[key] = hs[0].procs.resumed or 0
                    for o in self.observers:
                        o.trains(self, key, hs, starts)
                before = self.training_update[key]
                after = before + UPDATES_PER_S * dt_ms // 1000
                self.training_update[key] = after
                rank0 = self.hosts[members[0]]
                for u in range(before + 1, after + 1):
                    if u % SAVE_EVERY == 0 and not self.save(rank0, u):
                        return
                continue
            oldest = min(h.procs.started_ms for h in hs)
            dead_peer = any(not self.hosts[m].up or self.hosts[m].procs is None or not self.hosts[m].procs.running
                            or (self.hosts[m].procs.generation, self.hosts[m].procs.members) != key for m in members)
            if key not in self.training_update and self.now - oldest < RENDEZVOUS_MS:
                continue  # still meeting at the rendezvous
            for h in hs:
                h.procs.broken_since = h.procs.broken_since if h.procs.broken_since is not None else self.now
                limit = PEER_DEAD_MS if dead_peer else int(self.profile.get("collective_timeout_s", LINK_CUT_MS // 1000)
                                                           * 1000)
                if key not in self.training_update:
                    limit = 0
                if self.now - h.procs.broken_since >= limit:
                    h.procs.running = False
                    h.procs.how = "RuntimeError: [c10d] the collective failed: a peer is gone" if key in \
                        self.training_update else "torchrun: the rendezvous timed out"

    def save(self, rank0: Host, update: int) -> bool:
        d = rank0.disk
        if d.free() < CKPT_SIZE:
            rank0.procs.running = False
            rank0.procs.how = "OSError: [Errno 28] No space left on device"
            self.note(f"{rank0.name}: rank 0's save of update {update} failed: its disk is full")
            for o in self.observers:
                o.crashed(self, rank0, "disk full")
            return False
        self.file_ids += 1
        d.last = File(self.file_ids, update, CKPT_SIZE, False, self.now)
        return True

    def agreed(self, gen: Generation) -> None:
        for o in self.observers:
            o.agreed(self, gen)

    def pruned(self, h: Host, f: File) -> None:
        for o in self.observers:
            o.pruned(self, h, f)

    # --- time

    def tick(self) -> None:
        self.now += TICK_MS
        self.answers.clear()
        for c in [c for c in self.copies if c.due <= self.now]:
            self.copies.remove(c)
            h = self.by_dir[c.keeper.run_dir]
            with self.speaking(h):
                c.work()
            c.done = True
        self.advance_ranks(TICK_MS)
        for i, h in enumerate(self.hosts.values()):
            if h.up and h.keeper is None and h.keeper_down_until is not None and self.now >= h.keeper_down_until:
                self.start_keeper(h)  # its supervisor (or tandem-boot) started it again
            if h.keeper_ended_ms is not None and self.now - h.keeper_ended_ms > linger_s(self.spec) * 1000:
                h.keeper = None
            if h.up and (self.now + i * TICK_MS) % POLL_MS == 0:
                self.round(h)
        for o in self.observers:
            o.tick(self)

    # --- faults the schedule applies (tests.sim.faults)

    disk_size = DISK

    def crash_host(self, h: Host) -> None:
        """Power gone: its processes, keeper and copies end; its disk stays."""
        self.stop_keeper(h)
        if h.procs is not None and h.procs.running:
            for o in self.observers:
                o.crashed(self, h, "host crash")
        h.up, h.procs = False, None

    def boot_host(self, h: Host, wipe: bool) -> None:
        """Back (tandem-boot starts its keeper); `wipe`: a new VM in its place, /data empty, the run's spec
        written again (fab train --replace). A host lost for good never is."""
        if h.gone:
            return
        h.up = True
        if wipe:
            h.disk = Disk(capacity=self.disk_size)
            h.etcd_lost = h.name in self.etcd.members  # its member's data is gone: it cannot rejoin as it was
            shutil.rmtree(Path(h.run_dir) / "keeper", ignore_errors=True)
            (Path(h.run_dir) / "keeper").mkdir(parents=True)
            self.note(f"{h.name} replaced by a new VM (empty /data)")
        self.start_keeper(h)

    def crash_keeper(self, h: Host) -> None:
        """The keeper process killed: its supervisor starts it again a second later; the ranks go on."""
        if h.keeper is None or h.keeper_ended_ms is not None:
            return
        self.stop_keeper(h)
        h.keeper_down_until = self.now + 1000

    def crash_ranks(self, h: Host) -> None:
        if h.procs is not None and h.procs.running and h.up:
            h.procs.running, h.procs.how = False, "RuntimeError: CUDA error: an illegal memory access was encountered"
            for o in self.observers:
                o.crashed(self, h, "rank crash")
