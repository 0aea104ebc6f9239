"""The checkpoint one host's keeper (train.agent.keeper.loop) holds: its snapshot of rank 0's saves
(train.agent.keeper.replica's), hashed before it is resumed from or served, the copies it fetches from its
peers in the background (retried later and later, refused after FETCH_TRIES), and the one the
generation it joins starts from."""

from __future__ import annotations

import threading
import time

from train.agent.keeper import replica, tls
from train.agent.keeper.files import say
from train.agent.keeper.generation import Checkpoint, Generation, View, copies_from, descends_from, runs_in

FETCH_TRIES = 3  # copies of one checkpoint that fail before this host says it cannot get it


def _thread(work) -> threading.Thread:
    thread = threading.Thread(target=work, daemon=True, name="fetch")
    thread.start()
    return thread


class Holding:
    """What this host holds (`checkpoint`), what its ranks' saves were last seen at (`seen`), and its
    copy from a peer under way (`fetching`). `views`: the keeper's views of the hosts, shared."""

    def __init__(self, run_dir: str, spec: dict, views: dict[str, View], ticks=time.monotonic, store=replica,
                 spawn=None):
        # `store`: where checkpoints live (train.agent.keeper.replica's files; the fault simulator's disks);
        # `spawn`: runs a copy in the background (a thread; the simulator's clock)
        self.run_dir, self.spec, self.views, self.ticks = run_dir, spec, views, ticks
        self.store, self.spawn = store, spawn or _thread
        self.me: str = spec["me"]
        self.store.remove_partials(run_dir)  # a copy cut short by a kill: its bytes are no use
        self.checkpoint = Checkpoint.of(self.verified())  # hashed before it is resumed from or served
        if self.checkpoint is None and self.store.manifest(run_dir) is None and store.loose(run_dir):
            _, made = self.store.snapshot(run_dir, 0, None)  # a checkpoint from before keepers
            self.checkpoint = Checkpoint.of(made)
        self.seen: tuple[int, int] | None = None
        self.fetching: threading.Thread | None = None
        self.fetch_error = ""
        self.fetch_failures: dict[str, int] = {}  # sha256 -> copies of it that did not arrive whole
        self.fetch_after = 0.0  # ticks: the next try waits (1, 2, 4 ... 60 s after each failure)
        self.corrupt = False
        self.rehashed = ""  # the checkpoint hashed again because peers failed to copy it whole
        self.cannot_hold = ""  # why this host has no room for the checkpoint it needs (its /data full)
        self.needs = 0  # the bytes that checkpoint needs free
        self.starts = 0  # how often this host's ranks started: a copy begun before one lands nowhere
        self.installing = threading.Lock()  # a copy put in place, or the ranks starting: one at a time

    def verified(self) -> dict | None:
        """This host's snapshot's manifest, its bytes hashed against it; a snapshot that does not match
        (a flipped byte on disk) is set aside as corrupt and this host holds none."""
        held = self.store.manifest(self.run_dir)
        if held is None or self.store.verify(self.run_dir, held):
            return held
        aside = self.store.set_aside(self.run_dir, held, why="corrupt")
        say(f"checkpoint of update {held['update']} does not match its manifest's sha256: set aside at {aside}; "
                 "this host holds none until a peer's copy arrives")
        return None

    def recheck(self) -> None:
        """A peer asked for a copy that no longer matches its manifest: hashed again, set aside if so.
        A full /data that has room again is said, and this host can be taken back."""
        mine = self.checkpoint
        doubted = mine is not None and mine.sha256 != self.rehashed and any(
            h != self.me and v.cannot_get == mine.sha256 for h, v in self.views.items())
        if doubted:  # a peer's copies of it keep failing: its bytes hashed again (at rest, not from the cache)
            self.rehashed = mine.sha256
        if self.corrupt or doubted:
            self.corrupt, self.checkpoint = False, Checkpoint.of(self.verified())
        if self.cannot_hold and self.store.free(self.run_dir) >= self.needs:
            say(f"{self.me}'s /data has room for the run's checkpoint again ({self.needs:,} bytes)")
            self.cannot_hold = ""
            self.store.said_no_room(self.run_dir, "")
        elif not self.cannot_hold and mine is not None and self.store.free(self.run_dir) < mine.size:
            # the next save (or copy) will not fit: said before rank 0's save dies on it
            self.no_room({"size": mine.size, "update": None})

    def no_room(self, want: dict, found: str = "") -> bool:
        """Whether this host lacks the room to copy `want` (said once, in its heartbeat: the leader leaves it
        out, never the checkpoint, and takes it back once there is room)."""
        free = self.store.free(self.run_dir)
        if not found and free >= want["size"]:
            return False
        self.needs = want["size"]
        what = f"the checkpoint of update {want['update']}" if isinstance(want["update"], int) else "the next save"
        why = f"{self.me}: /data has {free:,} bytes free, {what} needs {want['size']:,}"
        why += f" ({found})" if found else ""
        if not self.cannot_hold:
            say(f"{why}: this host is left out until there is room")
            self.store.said_no_room(self.run_dir, why)  # for `fab status` (a tiny file: it fits, or is said)
        self.cannot_hold = why
        return True

    def serves(self) -> bool:
        """Whether the snapshot a peer asks for still matches its manifest (hashed once a file)."""
        held = self.store.manifest(self.run_dir)
        if held is not None and self.store.verify(self.run_dir, held, cached=True):
            return True
        self.corrupt = True
        return False

    def snapshot(self, generation: int, lineage) -> None:
        """On rank 0's host, each new save becomes the snapshot peers fetch."""
        self.seen, made = self.store.snapshot(self.run_dir, generation, self.seen, lineage)
        if made:
            self.checkpoint = Checkpoint.of(made)
            say(f"checkpoint of update {made['update']} ({made['size']:,} bytes) ready for the peers")

    def resumed(self) -> None:
        """This host's ranks started from what it holds: no save of theirs is seen yet."""
        self.seen = self.store.seen_now(self.run_dir)

    def cannot_get(self) -> tuple[str, str]:
        """The checkpoint this host cannot get (its sha256, "" when none) and why, as its heartbeat says it."""
        failed = [sha for sha, n in self.fetch_failures.items() if n >= FETCH_TRIES]
        return (failed[-1], self.fetch_error) if failed else ("", "")

    def busy(self) -> bool:
        return self.fetching is not None and self.fetching.is_alive()

    def ready_to_start(self, gen: Generation) -> bool:
        """`ready`, and from then on no copy begun before lands under the ranks about to start: a late copy
        of the last generation's would make this host's checkpoint another than its ranks resumed from,
        and the next member to join would resume from that one (the fault simulator's seed 242)."""
        with self.installing:
            if not self.ready(gen):
                return False
            self.starts += 1
            return True

    def ready(self, gen: Generation) -> bool:
        """This host holds `gen`'s checkpoint (or none, when it starts from none); False while a fetch runs."""
        holder = (gen.source or {}).get("host")
        if holder and holder != self.me and holder in gen.members and not (
                holder in self.views and runs_in(self.views[holder], gen)):
            return False  # its ranks of the last generation may save once more before they stop: all start from that
        want = self.newest_of_holder(gen.source)
        mine = self.checkpoint
        if want is None:
            if mine is not None:  # ranks elsewhere start from scratch: one finding a checkpoint would hang
                aside = self.store.set_aside(self.run_dir, mine.to_dict(), keep=self.set_aside_kept())
                say(f"generation {gen.number} starts from no checkpoint: this host's is set aside at {aside}")
                self.checkpoint = None
            self.store.clear(self.run_dir)
            return True
        if mine is not None and mine.sha256 == want["sha256"]:
            if not self.store.verify(self.run_dir, mine.to_dict()):  # hashed before it is resumed from
                self.checkpoint = mine = Checkpoint.of(self.verified())
                if want["host"] == self.me:
                    # this host cannot get the source whole (its own copy is it): its heartbeat says so, and the
                    # leader starts from the next best instead of waiting for a copy that no longer exists
                    self.fetch_failures[want["sha256"]] = FETCH_TRIES
                    self.fetch_error = f"{self.me}'s copy of update {want['update']} does not match its manifest"
                    return False
                # a copy of another host's: fetched again from that host, which holds it whole
            else:
                self.store.restore(self.run_dir)
                return True
        if self.busy():
            return False
        if want["host"] == self.me:  # its snapshot moved on since: the newest it holds is the one now
            if mine is None:  # it holds none any more (set aside as corrupt): a replica elsewhere, or the next best
                self.fetch_failures[want["sha256"]] = FETCH_TRIES
                self.fetch_error = f"{self.me} no longer holds the checkpoint of update {want['update']}"
                return False
            return self.store.restore(self.run_dir) is None
        if mine is not None and not descends_from(want, mine):
            aside = self.store.set_aside(self.run_dir, mine.to_dict(), keep=self.set_aside_kept())
            say(f"checkpoint of generation {mine.generation}, update {mine.update}: another history than the "
                     f"one generation {gen.number} goes on with (update {want['update']}), set aside whole at {aside}")
            self.checkpoint = None
        self.fetch_from(want)
        return False

    def set_aside_kept(self) -> int:
        return int(self.spec.get("set_aside_kept", replica.SET_ASIDE_KEPT))

    def newest_of_holder(self, want: dict | None) -> dict | None:
        """The checkpoint to start from: `want`, or the newer one its holder snapshotted since (its
        ranks of the previous generation saved again before they stopped). The holder resumes from
        its newest; so does every member, all from the same file."""
        holder = self.views.get(want["host"]) if want and want["host"] != self.me else None
        newer = holder.checkpoint if holder else None
        if newer is not None and newer.key() > (want["update"], want["generation"]) \
                and newer.sha256 not in self.refused():
            return {"host": want["host"], **newer.to_dict()}
        return want

    def refused(self) -> set[str]:
        return {sha for sha, n in self.fetch_failures.items() if n >= FETCH_TRIES}

    def fetch_from(self, want: dict) -> None:
        """Copy `want` from its holder in the background; a copy that fails waits 1, 2, 4 ... 60 s before
        the next try, and after FETCH_TRIES this host's heartbeat says it cannot get it (the leader leaves
        it out while the holder still holds it whole, or starts from the next best when none does)."""
        # a copy that failed is tried again later and later (a reset link heals): never refused for good
        if self.ticks() < self.fetch_after or self.no_room(want):
            return
        url = f"{tls.scheme(self.spec)}://{self.spec['addresses'][want['host']]}:{self.spec['port']}/checkpoint"

        began = self.starts

        def fetch() -> None:
            started = time.monotonic()
            try:
                got = self.store.fetch(url, self.spec["token"], self.run_dir, want, keep=lambda: self.starts == began,
                                       lock=self.installing, context=tls.client_context(self.spec))
                self.checkpoint, self.fetch_error = Checkpoint.of(got), ""
                self.fetch_failures.pop(want["sha256"], None)
                self.seen = self.store.seen_now(self.run_dir)
                say(f"checkpoint of update {want['update']} from {want['host']}: {want['size']:,} bytes, "
                         f"sha256 checked, in {time.monotonic() - started:.1f} s")
            except replica.Superseded as err:  # its ranks resumed from what this host held: so do all members
                say(str(err))
            except replica.FetchError as err:
                if "No space left" in str(err):  # this host's trouble, never the checkpoint's
                    self.no_room(want, "the copy ran out of space")
                    return
                failures = self.fetch_failures[want["sha256"]] = self.fetch_failures.get(want["sha256"], 0) + 1
                self.fetch_error = str(err)
                self.fetch_after = self.ticks() + min(60.0, 2.0 ** (failures - 1))
                gave_up = f"; {failures} tries: this host cannot get it" if failures >= FETCH_TRIES else ""
                say(f"checkpoint copy failed (the previous one is kept): {err}{gave_up}")

        self.fetching = self.spawn(fetch)

    def replicate(self, gen: Generation, seen: dict[str, View]) -> None:
        """Each new checkpoint of rank 0's is held by a majority of the generation's hosts: the next
        len // 2 hosts after rank 0's fetch it, each from the one before it (one copy a link, over the
        cluster network; every host at every save would send GBs x hosts beside the all-reduce)."""
        holder = copies_from(gen.members, self.me)
        before = seen.get(holder) if holder else None
        theirs = before.checkpoint if before else None
        if theirs is None or (self.checkpoint and theirs.key() <= self.checkpoint.key()) or self.busy():
            return
        self.fetch_from({"host": holder, **theirs.to_dict()})

    def final_copy_pending(self, gen: Generation | None, seen: dict[str, View]) -> bool:
        """The run is done, and the host after rank 0 does not hold rank 0's last save yet: both keepers
        stay (the one fetching, the one serving) until it does, or that host is lost."""
        if gen is None or len(gen.members) < 2:
            return False
        first, second = gen.members[0], gen.members[1]
        if first not in seen or second not in seen:
            return False
        last = self.checkpoint if self.me == first else seen[first].checkpoint
        held = self.checkpoint if self.me == second else seen[second].checkpoint
        if last is None or (held is not None and held.key() >= last.key()):
            return False
        if self.me == second:
            self.replicate(gen, seen)
        return True
