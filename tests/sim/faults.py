"""Fault schedules for the simulator: a seed draws a swarm profile (hosts, which faults, how often,
as TigerBeetle's VOPR does), then the faults' times and targets. A schedule is plain JSON (a list of
faults, each {"at": seconds, "op": ..., ...}), so a failure prints as a program to replay, and a
fixed defect keeps its schedule under tests/sim/regressions/."""

from __future__ import annotations

import random

OPS = ("cut", "isolate", "flap", "crash_host", "crash_keeper", "crash_ranks", "disk_full", "flip_byte",
       "tear_manifest", "clock_step", "flaky", "etcd_cut", "lose")
LOSE_EVERY_S = 75  # hosts lost for good, one after the other: past etcd_replace_after_s (60) and a round
SAFETY_S = 180  # faults land within this; then the liveness phase heals everything


def profile(rng: random.Random) -> dict:
    """A swarm: which faults this run draws from, and how many hosts."""
    hosts = rng.choice([2, 2, 2, 3, 3, 3, 4, 5, 8])
    ops = [op for op in OPS if rng.random() < 0.6] or ["cut"]
    if hosts < 3 and "etcd_cut" in ops:
        ops.remove("etcd_cut")
    return {"hosts": hosts, "ops": ops or ["cut"], "faults": rng.randint(1, 10),
            "maybe_applied": rng.choice([0.0, 0.0, 0.1])}


def draw(rng: random.Random, prof: dict, names: list[str]) -> list[dict]:
    out = []
    if "lose" in prof["ops"]:  # a minority of the hosts gone for good (spot VMs never given back), one at a time
        most = 1 if len(names) == 2 else (len(names) - 1) // 2
        for i, host in enumerate(rng.sample(names, rng.randint(1, most))):
            out.append({"at": 20 + i * LOSE_EVERY_S + rng.randint(0, 5), "op": "lose", "host": host})
    for _ in range(prof["faults"]):
        op = rng.choice([o for o in prof["ops"] if o != "lose"] or ["cut"])
        at = rng.randint(20, SAFETY_S - 10)
        host = rng.choice(names)
        other = rng.choice([n for n in names if n != host])
        dur = rng.choice([3, 6, 10, 25, 45, 90])
        f = {"at": at, "op": op, "host": host}
        if op == "cut":
            f.update(other=other, lasts=dur, oneway=rng.random() < 0.3)
        elif op in ("isolate", "disk_full", "flaky"):
            f.update(lasts=dur)
        elif op == "flap":
            f.update(down=rng.choice([6, 25]), up=rng.choice([6, 20]), times=rng.randint(2, 4))
        elif op == "crash_host":
            f.update(lasts=dur, wipe=rng.random() < 0.2)
        elif op == "clock_step":
            f.update(seconds=rng.choice([-3600, -60, 60, 3600]))
        elif op == "etcd_cut":  # two hosts cut from each other for a few seconds, again and again
            f.update(other=other, lasts=6, times=rng.randint(1, 4))
        out.append(f)
    return sorted(out, key=lambda f: (f["at"], f["op"], f["host"]))


def apply(world, f: dict) -> list[tuple[int, callable]]:
    """Carry out fault `f` now; returns what undoes it later: [(ms, action)]."""
    h = world.hosts[f["host"]]
    op, now = f["op"], world.now
    if h.gone:
        return []  # lost for good: nothing happens to it any more that anyone could see
    world.note(f"fault: {describe(f)}")
    later = []
    if op in ("cut", "etcd_cut"):
        pairs = [(f["host"], f["other"])] + ([] if f.get("oneway") else [(f["other"], f["host"])])
        for i in range(f.get("times", 1)):
            start = now + i * (f["lasts"] + 10) * 1000
            later.append((start, lambda p=pairs: world.sever(p)))
            later.append((start + f["lasts"] * 1000, lambda p=pairs: world.mend(p)))
    elif op == "isolate":
        pairs = [(f["host"], o) for o in world.order if o != f["host"]]
        pairs += [(b, a) for a, b in pairs]
        world.sever(pairs)
        later.append((now + f["lasts"] * 1000, lambda: world.mend(pairs)))
    elif op == "flap":
        pairs = [(f["host"], o) for o in world.order if o != f["host"]]
        pairs += [(b, a) for a, b in pairs]
        t = now
        for _ in range(f["times"]):
            later.append((t, lambda: world.sever(pairs)))
            later.append((t + f["down"] * 1000, lambda: world.mend(pairs)))
            t += (f["down"] + f["up"]) * 1000
    elif op == "lose":
        world.crash_host(h)
        h.gone = True  # never back: no fault's undo and no heal boots it
    elif op == "crash_host":
        world.crash_host(h)
        later.append((now + f["lasts"] * 1000, lambda: world.boot_host(h, f.get("wipe", False))))
    elif op == "crash_keeper":
        world.crash_keeper(h)
    elif op == "crash_ranks":
        world.crash_ranks(h)
    elif op == "disk_full":
        h.disk.capacity = h.disk.used()  # another program filled it
        later.append((now + f["lasts"] * 1000, lambda: setattr(h.disk, "capacity", world.disk_size)))
    elif op == "flip_byte":
        if h.disk.snap is not None:
            h.disk.snap.corrupt = True
    elif op == "tear_manifest":
        if h.disk.manifest is not None:
            h.disk.torn = True
            world.crash_keeper(h)
    elif op == "clock_step":
        h.clock_offset_s += f["seconds"]
    elif op == "flaky":
        h.flaky_until = now + f["lasts"] * 1000
    return later


def describe(f: dict) -> str:
    rest = ", ".join(f"{k}={v}" for k, v in f.items() if k not in ("at", "op", "host"))
    return f"{f['op']}({f['host']}{', ' + rest if rest else ''}) at {f['at']} s"
