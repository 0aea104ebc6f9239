"""The rules the keepers keep, each a named check the simulator runs as the world changes (safety) or
at the end of a healed run (liveness). A check that fails raises Violation with its name."""

from __future__ import annotations

from tests.sim.world import POLL_MS, Host, World


class Violation(AssertionError):
    def __init__(self, name: str, detail: str):
        super().__init__(f"{name}: {detail}")
        self.name = name


SAFETY = ("never_rolls_back", "never_from_nothing", "one_start_for_all", "one_generation_training",
          "never_a_minority", "set_aside_bounded", "best_never_pruned", "budget_counts_crashes",
          "budget_within_the_hour")
LIVENESS = ("a_healed_majority_trains",)


def whole(h: Host, before_ms: int):
    """h's checkpoint if it is whole (bytes as its manifest says, or a manifest to re-hash) and was
    there at `before_ms` (a save newer than a keeper's round is not yet known to anyone)."""
    f = h.disk.snap
    if f is None or f.corrupt or f.made_ms > before_ms:
        return None
    return f


class Checks:
    """Observes the world (its hooks) and checks the rules; `fired` counts each rule checked."""

    def __init__(self, world: World):
        self.world = world
        self.crashes = 0  # rank crashes the schedule caused (injected, or a save on a full disk)
        self.restarts = 0  # crash restarts the keepers made
        self.held_then: dict[tuple[int, tuple[str, ...]], list] = {}
        self.fired: dict[str, int] = {}
        self.seen_generations: set[tuple[int, tuple[str, ...]]] = set()
        self.restart_times: list[int] = []  # when the keepers made a crash restart (the simulated clock)
        self.stops: list = []  # the generations that stopped the run (their keepers end, and are gone)

    def fail(self, name: str, detail: str):
        raise Violation(name, detail)

    def count(self, name: str) -> None:
        self.fired[name] = self.fired.get(name, 0) + 1

    # --- hooks

    def started(self, w: World, h: Host, gen) -> None:
        self.decided(w, (gen.number, tuple(gen.members)))

    def decided(self, w: World, key) -> None:
        """What the live hosts held when generation `key` was decided: its members, and every host that reaches
        each of them both ways (one a member cannot reach could serve it no copy)."""
        if key in self.held_then:
            return
        before = w.now - 2 * POLL_MS
        members = key[1]
        live = [x for x in w.hosts.values() if x.name in members or (
            x.up and x.keeper is not None and x.keeper_ended_ms is None and all(w.both(x.name, m) for m in members))]
        self.held_then[key] = [(f.update, x.name, f) for x in live if (f := whole(x, before))]

    def trains(self, w: World, key, hosts: list[Host], starts: set) -> None:
        number, members = key
        self.count("one_start_for_all")
        if len(starts) > 1:
            self.fail("one_start_for_all", f"generation {number} {list(members)}: ranks resumed from different files "
                                           f"{sorted(map(str, starts))}")
        # held when it was decided, and still whole when the ranks resume (a disk wiped or rotted since lost it)
        held = [(update, name) for update, name, f in self.held_then.get(key, [])
                if w.hosts[name].disk.snap is f and not f.corrupt]
        resumed = hosts[0].procs.resumed
        self.count("never_rolls_back")
        self.count("never_from_nothing")
        if held:
            best, where = max(held)
            if resumed is None:
                self.fail("never_from_nothing", f"generation {number} {list(members)} started from nothing while "
                                                f"{where} held update {best}")
            if resumed < best:
                self.fail("never_rolls_back", f"generation {number} {list(members)} resumed from update {resumed} "
                                              f"while {where} held update {best}")

    def crashed(self, w: World, h: Host, why: str) -> None:
        self.crashes += 1

    def agreed(self, w: World, gen) -> None:
        pass  # etcd's record; the keepers' own records are read in tick

    def pruned(self, w: World, h: Host, f) -> None:
        self.count("best_never_pruned")
        best = max((g.update for x in w.hosts.values() for g in [x.disk.snap, *(a for a, _ in x.disk.aside)]
                    if g is not None and not g.corrupt and g is not f), default=-1)
        if f.update > best and not f.corrupt:
            self.fail("best_never_pruned", f"{h.name} removed a set-aside checkpoint of update {f.update}, "
                                           f"the most training any host held (next best {best})")

    def tick(self, w: World) -> None:
        training = w.training()
        n = len(w.order)
        if n >= 3:
            self.count("one_generation_training")
            if len(training) > 1:
                self.fail("one_generation_training", f"{len(training)} generations train at once: {training}")
            self.count("never_a_minority")
            for number, members in training:
                if 2 * len(members) <= n:
                    self.fail("never_a_minority", f"generation {number} trains on {list(members)}, "
                                                  f"a minority of {n} hosts")
        for h in w.hosts.values():
            self.count("set_aside_bounded")
            if len(h.disk.aside) > max(1, int(w.spec.get("set_aside_kept", 1))):
                self.fail("set_aside_bounded", f"{h.name} keeps {len(h.disk.aside)} set-aside checkpoints")
            gen = h.keeper.generation if h.keeper is not None else None
            if gen is None or gen.pending or (gen.number, gen.members) in self.seen_generations:
                continue
            self.seen_generations.add((gen.number, gen.members))
            self.decided(w, (gen.number, tuple(gen.members)))
            if gen.stopped:
                self.stops.append(gen)
            self.count("budget_counts_crashes")
            if gen.reason.startswith("ranks ended at update") and gen.reason.endswith("): restarting"):
                self.restart_times.append(w.now)
                self.count("budget_within_the_hour")
                hour = [t for t in self.restart_times if w.now - t < 3_600_000]
                if len(hour) > int(w.spec["max_restarts"]):
                    self.fail("budget_within_the_hour", f"generation {gen.number}: crash restart {len(hour)} "
                                                        f"within an hour, past max_restarts={w.spec['max_restarts']}")
            if len(gen.restarts) > self.restarts:  # the budget spent: one restart more
                self.restarts = len(gen.restarts)
                if self.restarts > self.crashes:
                    self.fail("budget_counts_crashes", f"generation {gen.number}: {gen.reason!r} is restart "
                                                       f"{self.restarts}, after {self.crashes} rank crashes")
            if gen.stopped == "restarts exhausted" and self.crashes < int(w.spec["max_restarts"]):
                self.fail("budget_counts_crashes", f"generation {gen.number} stopped the run ({gen.reason!r}) "
                                                   f"after {self.crashes} rank crashes")

    # --- liveness

    def healed(self, w: World, within_ms: int, best_before: int) -> None:
        """After everything healed: a majority of the hosts (one of two) trains past what was held, or the
        run stopped as its rules say (the restart budget spent by real crashes)."""
        self.count("a_healed_majority_trains")
        if self.live_again(w, best_before):
            return
        if any(whole(h, w.now) for h in w.hosts.values() if h.gone) and \
                not any(whole(h, w.now) for h in w.hosts.values() if not h.gone):
            # the run's only whole checkpoints were on hosts lost for good: never from nothing, the keepers
            # wait (the user resumes from a copy off the cluster, or starts anew)
            self.count("oracle: only hosts lost for good held a whole checkpoint")
            return
        kept = [m for m in w.etcd.members if not w.hosts[m].etcd_lost and not w.hosts[m].gone]
        if len(w.order) >= 3 and 2 * len(kept) <= len(w.etcd.members):
            # a majority of etcd's members lost (their data, or their hosts for good) before one could be
            # replaced: no member change can pass; a new `fab train` start forms a new cluster
            self.count("oracle: etcd's majority lost for good")
            return
        said = "; ".join(f"{h.name}: {h.log[-1] if h.log else 'nothing'}" for h in w.hosts.values())
        self.fail("a_healed_majority_trains", f"{within_ms / 1000:.0f} s after every fault healed no majority "
                                              f"trains past update {best_before} (training: {w.training()}); "
                                              f"last words: {said}")

    def live_again(self, w: World, best_before: int) -> bool:
        n = len(w.order)
        stopped = self.stops
        if stopped and all(g.stopped == "restarts exhausted" for g in stopped) and self.crashes >= int(
                w.spec["max_restarts"]):
            return True
        for number, members in w.training():
            if 2 * len(members) > n or (n == 2 and members):
                update = w.training_update.get((number, members), 0)
                if update > best_before:
                    return True
        return False
