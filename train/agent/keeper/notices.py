"""What one host's keeper (train.agent.keeper.loop) does about leaving the cluster: a cloud's notice that it
reclaims this host (train.agent.keeper.preemption), said in its heartbeat; rank 0 asked to save at once for
any member's notice; and the run's copies off the cluster (train.agent.offsite.schedule), which
such a save hurries and the keeper's end closes."""

from __future__ import annotations

import time

from train.agent.keeper import preemption
from train.agent.keeper.files import say
from train.agent.keeper.generation import Checkpoint, View
from train.agent.keeper.ranks import Ranks
from train.agent.offsite import schedule


class Notices:
    """This host's notice, as its heartbeat says it (`leaving`: View.leaving ...), the notices rank 0
    was asked to save for, and the off-cluster copies (`offsite`)."""

    def __init__(self, run_dir: str, spec: dict, clock=time.time):
        self.run_dir, self.me = run_dir, spec["me"]
        self.offsite = schedule.Uploads(run_dir, spec, say, clock)  # copies off the cluster, if asked
        self.watcher: preemption.Watcher | None = None  # on a cloud VM: its notices (started by `watch`)
        self.leaving: dict = {}
        self.saved_for: set[tuple[str, float]] = set()

    def watch(self) -> None:
        self.watcher = preemption.watch(self.me, say=say)  # None off a cloud: nothing polls

    def heed(self, held: list[Checkpoint | None]) -> None:
        """This host's cloud reclaims it: its heartbeat says so from now on, with the deadline and the
        newest save it knows of among `held` (the run goes on from a newer one: rank 0's, now)."""
        notice = self.watcher.notice if self.watcher else None
        if notice is None or self.leaving:
            return
        updates = [c.update for c in held if c]
        self.leaving = {"leaving": notice.deadline, "leaving_why": notice.words(),
                        "leaving_after": max(updates, default=None)}
        say(f"{self.me}: {notice.words()}: this host leaves the run; the others go on without it from rank 0's save")

    def save_for_leaving(self, seen: dict[str, View], ranks: Ranks, checkpoint: Checkpoint | None) -> None:
        """The keeper holding rank 0 asks it to save now, once for each notice (its own host's or a peer's)."""
        notices = [(h, v) for h, v in seen.items() if v.leaving is not None and (h, v.leaving) not in self.saved_for
                   and h in ranks.members]
        if not notices or not ranks.rank0_here() or not ranks.alive():
            return
        why = preemption.save_now(self.run_dir)
        if not why:  # that save goes off the cluster at once, not at the interval (every VM may go)
            self.offsite.soon(checkpoint.update if checkpoint else None, max(v.leaving for _, v in notices) + 60,
                              " and ".join(f"{h}'s notice" for h, _ in notices))
        for host, v in notices:
            self.saved_for.add((host, v.leaving))
            say(f"{host}: {v.leaving_why}: {f'no save now ({why})' if why else 'saving now'}, going on without {host}")
