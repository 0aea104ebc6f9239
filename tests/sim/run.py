"""Run one schedule (a seed's, or one given as JSON) and say whether every rule held; shrink a failing one."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from tests.sim import faults
from tests.sim.checks import Checks, Violation
from tests.sim.world import TICK_MS, World

NAMES = ["v100a", "v100b", "v100c", "v100d", "v100e", "v100f", "v100g", "v100h"]
HEAL_S = 180  # the liveness phase: everything healed, a majority trains again within this


@dataclass
class Outcome:
    seed: int | None
    hosts: int
    schedule: list[dict]
    violation: str = ""  # the rule's name
    detail: str = ""
    fired: dict = field(default_factory=dict)
    events: list[str] = field(default_factory=list)
    logs: dict = field(default_factory=dict)
    last_members: list = field(default_factory=list)  # the hosts of the newest generation a keeper knows


def schedule_of(seed: int) -> tuple[int, list[dict], dict]:
    rng = random.Random(seed)
    prof = faults.profile(rng)
    return prof["hosts"], faults.draw(rng, prof, NAMES[: prof["hosts"]]), prof


def run(hosts: int, schedule: list[dict], seed: int = 0, profile: dict | None = None,
        spec: dict | None = None) -> Outcome:
    rng = random.Random(seed * 7919 + 1)
    world = World(NAMES[:hosts], rng, profile or {}, spec)
    checks = Checks(world)
    world.observers.append(checks)
    out = Outcome(seed, hosts, schedule)
    pending = sorted((f["at"] * 1000, i, f) for i, f in enumerate(schedule))
    later: list[tuple[int, int, callable]] = []
    n = 0
    try:
        end = faults.SAFETY_S * 1000
        while world.now < end:
            world.tick()
            while pending and pending[0][0] <= world.now:
                _, _, f = pending.pop(0)
                for at, undo in faults.apply(world, f):
                    n += 1
                    later.append((at, n, undo))
                later.sort(key=lambda t: (t[0], t[1]))
            while later and later[0][0] <= world.now:
                later.pop(0)[2]()
        for _, _, undo in later:  # the liveness phase: every fault healed
            undo()
        world.cut.clear()
        for h in world.hosts.values():
            h.disk.capacity, h.flaky_until = world.disk_size, 0
            if not h.up:
                world.boot_host(h, False)
        best = max((h.disk.snap.update for h in world.hosts.values()
                    if h.disk.snap and not h.disk.snap.corrupt and not h.gone), default=0)
        world.note("everything healed")
        healed_at = world.now
        while world.now - healed_at < HEAL_S * 1000:
            world.tick()
            if world.now % 5000 == 0 and checks.live_again(world, best):
                break  # trains again: the rest of the phase would show no more
        checks.healed(world, world.now - healed_at, best)
    except Violation as v:
        out.violation, out.detail = v.name, str(v)
    finally:
        out.fired, out.events = checks.fired, world.events
        out.logs = {h.name: h.log for h in world.hosts.values()}
        known = [h.keeper.generation for h in world.hosts.values() if h.keeper is not None and h.keeper.generation]
        out.last_members = list(max(known, key=lambda g: g.number).members) if known else []
        world.close()
    return out


def run_seed(seed: int) -> Outcome:
    hosts, schedule, prof = schedule_of(seed)
    return run(hosts, schedule, seed, prof)


def shrink(out: Outcome, profile: dict | None = None) -> Outcome:
    """The smallest schedule (faults removed one at a time) that still breaks the same rule."""
    best = out
    changed = True
    while changed:
        changed = False
        for i in range(len(best.schedule)):
            fewer = best.schedule[:i] + best.schedule[i + 1:]
            tried = run(best.hosts, fewer, best.seed or 0, profile)
            if tried.violation == out.violation:
                best, changed = tried, True
                break
    return best


TICKS_PER_S = 1000 // TICK_MS
