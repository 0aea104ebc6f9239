"""The run's keeper on one host: it keeps the run alive when nobody follows it.

    python -m train.agent.keeper.loop launch --run /data/tandem/runs/RUN   (fab train; returns at once)
    python -m train.agent.keeper.loop stop --run DIR [--wait 20]            (fab stop)
    python -m train.agent.keeper.loop show --run DIR                        (fab status, following: one JSON line)
    python -m train.agent.keeper.loop boot [--runs /data/tandem/runs]       (at boot: tandem-boot)

`fab train` writes RUN/keeper/spec.json on every host (the hosts in rank order, their cluster
addresses, each membership's exact training commands, built on the controller by train.run.command)
and launches a keeper on each: a supervisor process in a session of its own (it outlives the SSH
session and the controller) that restarts the keeper proper if it dies. The keepers heartbeat each
other over HTTP on the cluster network (`port`, with the run's token), so a host is judged lost by
its peers, never by a laptop. What they decide is train.agent.keeper.generation's; what moves checkpoints
is train.agent.keeper.replica's. The class Keeper is the keeper's rounds, tying together its parts, a module
each: its heartbeat's HTTP (keeper_heartbeat), its ranks (keeper_ranks), its checkpoint
(keeper_checkpoint), etcd's agreement and its fence (keeper_agreement) and its notices and copies off
the cluster (keeper_notices). Every membership change is appended to RUN/keeper/timeline.jsonl on
each host, with its time, update and reason: `fab status`, following and the report read it.

A reboot (a cloud maintenance event, a spot VM restarted) ends every process; `tandem-boot` (a
systemd unit on a VM, the lab host's init in the lab: the same command) runs `boot`, which launches
the keeper of every run that was neither finished nor stopped, as the user who started it. That
keeper is outside the generation its peers went on in, and is taken back at their next checkpoint.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from http.server import ThreadingHTTPServer
from pathlib import Path

from train.agent.keeper import etcd as agreement
from train.agent.keeper import heartbeat as keeper_heartbeat
from train.agent.keeper import supervision
from train.agent.keeper.consensus import Consensus, Fence, etcd_member, member_alive, stop_etcd_member
from train.agent.keeper.files import keeper_dir, read_json, read_timeline, say, show, supervisor_pid, write_json
from train.agent.keeper.generation import (
    FINISHED,
    RUNNING,
    Checkpoint,
    Generation,
    LeaderMemory,
    View,
    current,
    decide,
    runs_in,
    timeline_entry,
)
from train.agent.keeper.holding import Holding
from train.agent.keeper.notices import Notices
from train.agent.keeper.ranks import Ranks
from train.agent.keeper.stop import stop as stop_ranks
from train.agent.offsite import schedule
from train.agent.trainer import tracker


class Keeper:
    """One host's keeper: its heartbeat, its view of the others, and its rounds, which tie together its
    ranks (`ranks`, train.agent.keeper.ranks), its checkpoint (`holding`, keeper_checkpoint), etcd's
    agreement with three hosts or more (`consensus`, `fence`: keeper_agreement) and its notices and
    copies off the cluster (`notices`, keeper_notices)."""

    def __init__(self, run_dir: str, spec: dict, clock=time.time, ticks=time.monotonic, world: dict | None = None):
        # `clock`: the wall clock, for what is recorded and shared (times, the restart budget);
        # `ticks`: a monotonic one for liveness (an NTP step must not delay declaring a peer lost);
        # `world`: what the fault simulator (tests/sim) puts in place of processes, disks and etcd:
        # "ranks", "store" and "spawn" (train.agent.keeper.holding), "notices", "agreement"
        world = world or {}
        self.run_dir, self.spec, self.clock, self.ticks = run_dir, spec, clock, ticks
        self.dir = keeper_dir(run_dir)
        self.me: str = spec["me"]
        self.order: list[str] = list(spec["order"])
        self.peers = [h for h in self.order if h != self.me]
        self.lost_after_s = float(spec.get("lost_after_s", 20))
        self.views: dict[str, View] = {}
        started = clock()
        self.heard = {p: ticks() for p in self.peers}  # a peer gets lost_after_s to answer first
        self.live: set[str] = {self.me}
        self.peers_held: dict = read_json(self.dir / "peers.json", {})  # what the peers held when last heard
        for peer, held in self.peers_held.items():
            if peer in self.peers:
                self.views[peer] = View(host=peer, generation=None, checkpoint=Checkpoint.of(held))
        self.memory = LeaderMemory()
        self.lock = threading.RLock()
        self.ranks = world.get("ranks") or Ranks(run_dir, spec)
        self.generation = Generation.of(read_json(self.dir / "generation.json"))
        self.recorded = {(e.get("generation"), tuple(e.get("hosts") or ())) for e in self.timeline()}
        if spec.get("start") and self.ranks.started_for != spec["start"]:  # a start fab train asked for
            number = (self.generation.number if self.generation else 0) + 1
            self.generation = Generation(number=number, members=tuple(spec["members"]),
                                         reason=spec.get("reason", "start"), time=round(started, 1), pending=True,
                                         start=spec["start"])
            write_json(self.dir / "generation.json", self.generation.to_dict())
            self.ranks.forget(spec["start"])
        self.holding = Holding(run_dir, spec, self.views, ticks,
                               **{k: world[k] for k in ("store", "spawn") if k in world})
        self.said_waiting = ""
        self.clock_base = ((self.generation.clock if self.generation else 0.0) or 0.0, ticks())  # run_clock's
        self.unheard_in: tuple | None = None  # the generation `missed_by` is about:
        self.missed_by: dict[str, set[str]] = {}  # its members that went unheard since it ran, and by whom
        self.fence = Fence(self.ranks, self.lost_after_s)
        start = self.generation if self.generation and self.generation.pending else None
        self.consensus = Consensus(spec, start, self.fence, ticks, world.get("agreement")) \
            if agreement.uses_etcd(self.order) else None
        self.notices = world.get("notices") or Notices(run_dir, spec, clock)

    # --- the record on this host

    def timeline(self) -> list[dict]:
        return read_timeline(self.dir)

    def record(self, gen: Generation) -> None:
        """The newest generation known here, kept on disk; a resolved one enters the timeline once."""
        self.generation = gen
        write_json(self.dir / "generation.json", gen.to_dict())
        if gen.pending or (gen.number, gen.members) in self.recorded:
            return
        self.recorded.add((gen.number, gen.members))
        key = ",".join(gen.members)
        entry = timeline_entry(gen, self.spec.get("update_freq", {}).get(key), self.spec.get("ranks", {}).get(key))
        with (self.dir / "timeline.jsonl").open("a") as f:
            f.write(json.dumps(entry) + "\n")
        say(f"generation {gen.number}: {', '.join(gen.members) or 'no hosts'} ({gen.reason})")

    def remember_peers(self) -> None:
        """What each peer held when last heard, on disk: a keeper started again (a reboot) still knows
        that a silent peer holds the run's training, and does not start it from nothing."""
        held = {p: v.checkpoint.to_dict() for p, v in self.views.items() if p != self.me and v.checkpoint}
        if held != self.peers_held:
            write_json(self.dir / "peers.json", held)
            self.peers_held = held

    # --- what this host says

    def view(self, state: str | None = None) -> View:
        state = state or self.ranks.state()
        cannot_get, why = self.holding.cannot_get()
        return View(host=self.me, generation=self.generation, checkpoint=self.holding.checkpoint, ranks=state,
                    active=self.ranks.active, active_members=tuple(self.ranks.members),
                    update=self.ranks.last_update(), how=self.ranks.how(state),
                    stopping=(self.dir / "stop").exists(), hears=tuple(sorted(self.live)),
                    cannot_get=cannot_get, cannot_get_why=why, cannot_hold=self.holding.cannot_hold,
                    **self.notices.leaving)

    def answer(self) -> View:
        """What a peer hears: this moment's view, but "finished" only once a round has snapshot the
        last save (a peer that heard "finished" beside the save before it would end without it)."""
        now, last = self.view(), self.views.get(self.me)
        if now.ranks == FINISHED and (last is None or last.ranks != FINISHED):
            return replace(now, ranks=last.ranks if last else RUNNING)
        return now

    def listen(self) -> ThreadingHTTPServer:
        def state() -> dict:
            with self.lock:
                return self.answer().to_dict()

        return keeper_heartbeat.serve(self.spec, self.run_dir, state, self.holding.serves)

    def ask(self, peer: str) -> View | None:
        return keeper_heartbeat.ask(self.spec, peer)

    def ask_peers(self) -> dict[str, View | None]:
        """Every peer's view, asked at once (None: no answer)."""
        with ThreadPoolExecutor(max_workers=max(1, len(self.peers))) as pool:
            return dict(zip(self.peers, pool.map(self.ask, self.peers), strict=True))

    # --- one round

    def step(self) -> str | None:
        """Listen to the peers, decide (as leader), act. Returns why the keeper ends, or None."""
        now, tick = self.clock(), self.ticks()
        state = self.ranks.state()  # before the snapshot: "done training" is logged after the last save
        self.holding.recheck()  # a peer asked for a copy that no longer matches its manifest
        self.snapshot()
        self.notices.offsite.tick(self.ranks.running_members())  # a child process uploads
        self.notices.heed([self.holding.checkpoint, *(v.checkpoint for v in self.views.values())])
        answers = self.ask_peers()
        with self.lock:  # what the heartbeat reads; never held while acting (a stop takes seconds)
            for peer, said in answers.items():
                if said is not None:
                    self.views[peer], self.heard[peer] = said, tick
            self.live = {self.me} | {p for p in self.peers if tick - self.heard[p] < self.lost_after_s}
            self.views[self.me] = self.view(state)
            self.note_unheard(answers)
            seen = {h: v for h, v in self.views.items() if h in self.live}
        self.notices.save_for_leaving(seen, self.ranks, self.holding.checkpoint)
        if self.consensus is not None:
            decided = self.consensus.agree(lambda agreed: self.decide_locked(now, agreed))
            self.consensus.follow_hosts(dict(self.heard), self.me)
        else:
            with self.lock:
                newest = current(seen, self.order, self.me)
                mine = self.generation.key(self.order) if self.generation else None
                if newest is not None and (mine is None or newest.key(self.order) > mine):
                    self.record(newest)
                decided = self.decide(now)
        with self.lock:
            if decided is not None and decided != self.generation:
                self.record(decided)
            if self.memory.waiting and self.memory.waiting != self.said_waiting:  # etcd's round returns its
                say(self.memory.waiting)  # generation even when the leader waits: said either way
            self.said_waiting = self.memory.waiting
            self.remember_peers()
        return self.act(seen)

    def note_unheard(self, answers: dict[str, View | None]) -> None:
        """Which members of the current generation went unheard since its ranks ran together: this keeper
        got no answer from one, or a member said it no longer hears another. Ranks that end then ended on
        the network, not on a crash (train.agent.keeper.generation.decide); a member most others missed
        is the one whose link failed (`missed_by`: who missed it)."""
        gen = self.generation
        key = (gen.number, gen.members) if gen else None
        if key != self.unheard_in:
            self.unheard_in, self.missed_by = key, {}
        mine = self.views.get(self.me)
        if gen is None or mine is None or mine.ranks != RUNNING or not runs_in(mine, gen):
            return  # before the ranks run together, a peer not heard yet says nothing of the network
        for m in gen.members:
            for x in gen.members:
                if x == m:
                    continue
                if x == self.me:  # no answer from m this round
                    missed = answers.get(m) is None
                else:  # x says it no longer hears m
                    said = answers.get(x)
                    missed = said is not None and bool(said.hears) and m not in said.hears
                if missed:
                    self.missed_by.setdefault(m, set()).add(x)

    def unheard(self) -> dict[str, int]:
        """Each member that went unheard, and by how many of the others: one this keeper (the leader, whose
        own answers are fresh) did not hear counts as missed by all (the others' `hears` lag by lost_after_s)."""
        others = len(self.generation.members) - 1 if self.generation else 0
        return {m: others if self.me in by else len(by) for m, by in self.missed_by.items()}

    def decide(self, now: float, agreed: Generation | None = None) -> Generation | None:
        # every view, the silent hosts' last ones too: a lost rank 0's last update is in its own
        return decide(self.me, self.order, dict(self.views), set(self.live), now, self.memory,
                      self.lost_after_s, float(self.spec.get("ended_grace_s", 25)),
                      int(self.spec.get("max_restarts", 3)), bool(self.spec.get("elastic", True)),
                      max_rejoins=int(self.spec.get("max_rejoins", 6)), agreed=agreed, tick=self.ticks(),
                      unheard=self.unheard(), clock=self.run_clock(agreed or self.generation))

    def run_clock(self, gen: Generation | None) -> float:
        """The run's clock (Generation.clock): this keeper's monotonic seconds on from the newest generation
        it knows, never behind that generation's own; on a run from before it, the wall clock."""
        tick = self.ticks()
        if gen is not None and gen.clock and gen.clock > self.clock_base[0] + (tick - self.clock_base[1]):
            self.clock_base = (gen.clock, tick)
        if not self.clock_base[0]:
            return self.clock()
        return self.clock_base[0] + (tick - self.clock_base[1])

    def decide_locked(self, now: float, agreed: Generation) -> Generation | None:
        with self.lock:
            return self.decide(now, agreed=agreed)

    def snapshot(self) -> None:
        """On rank 0's host, each new save becomes the snapshot peers fetch."""
        if self.ranks.active is not None and self.ranks.rank0_here():
            self.holding.snapshot(self.ranks.active, self.ranks.lineage)

    def taken_back_soon(self, gen: Generation, seen: dict[str, View]) -> bool:
        """A stop that binds only this host (it gave up alone, cut off) while a peer it hears trains on: started
        again (`fab train --rejoin`), it waits to be taken back at their next checkpoint instead of ending."""
        return bool(gen.among) and set(gen.among) <= {self.me} and any(
            h != self.me and v.ranks == RUNNING and v.generation is not None and not v.generation.stopped
            for h, v in seen.items())

    def act(self, seen: dict[str, View]) -> str | None:
        gen = self.generation
        stopping = [h for h, v in seen.items() if v.stopping and gen and h in gen.members and h != self.me]
        if (self.dir / "stop").exists() or stopping:
            self.ranks.stop(mark=True)
            return f"stopped ({'fab stop' if not stopping else 'fab stop on ' + ', '.join(stopping)})"
        if any(v.ranks == FINISHED for v in seen.values()):
            self.ranks.wait(60)
            return None if self.holding.final_copy_pending(gen, seen) else "finished"
        if gen is None or gen.pending:
            return None
        if gen.stopped:
            if self.taken_back_soon(gen, seen):
                return None
            self.ranks.stop()
            return f"stopped: {gen.reason}"
        active, members = self.ranks.active, self.ranks.members
        if self.me in gen.members:
            if (active, tuple(members)) != (gen.number, gen.members):
                # never on a generation this side could not confirm with etcd
                if self.consensus is None or self.consensus.agreed_now:
                    self.start(gen)
            else:
                self.holding.replicate(gen, seen)
        elif active is not None and active <= gen.number and self.ranks.alive() \
                and set(members) & set(gen.members) - {self.me}:
            say(f"generation {gen.number} goes on without this host: its ranks of generation {active} stop")
            self.ranks.stop()
        return None

    def start(self, gen: Generation) -> None:
        """Join generation `gen`: this host's old ranks stopped, its checkpoint the one `gen` starts
        from (fetched and verified where it differs), then its ranks started."""
        if self.ranks.alive():
            say(f"stopping this host's ranks of generation {self.ranks.active} for generation {gen.number}")
            self.ranks.stop()
        if not self.holding.ready_to_start(gen) or not self.ranks.start(gen, self.holding.checkpoint):
            return
        self.holding.resumed()  # what it resumes from: no save of this generation
        self.ranks.save()
        source = gen.source or {}
        say(f"ranks of generation {gen.number} started (rank {gen.members.index(self.me)} host of "
            f"{len(gen.members)}; from update {source.get('update', 0)})")

    def end(self, ended: str) -> None:
        """The keeper ends (`ended` says why): said in RUN/keeper/ended, its last copies off the cluster made."""
        self.snapshot()  # a save rank 0 made before `fab stop` stopped it
        self.notices.offsite.closing()  # its final copy off the cluster is to come: `keeper stop` waits for it
        (self.dir / "ended").write_text(ended + "\n")
        say(f"the keeper ends: {ended}")
        self.notices.offsite.finish(self.ranks.running_members(), ended)


def run(run_dir: str, poll_s: float | None = None) -> int:
    """The keeper proper: rounds until the run finished or stopped (exit 0); raises on a fault (its
    supervisor starts it again)."""
    spec = read_json(keeper_dir(run_dir) / "spec.json")
    if spec is None:
        print(f"no keeper spec in {keeper_dir(run_dir)}", file=sys.stderr)
        return 2
    if os.environ.get(supervision.UNIT_ENV):  # systemd is its supervisor: `fab stop` and status find the keeper
        (keeper_dir(run_dir) / "keeper.pid").write_text(str(os.getpid()))
    keeper = Keeper(run_dir, spec)
    keeper.notices.watch()
    server = keeper.listen()  # first: asking etcd whether this host is a member may take seconds
    member = etcd_member(run_dir, spec) if keeper.consensus is not None else None
    member_retry = time.monotonic() + 10
    say(f"keeper of {spec['run_id']} on {keeper.me}: peers {', '.join(keeper.peers) or 'none'}, "
         f"lost after {keeper.lost_after_s:g} s of silence")
    poll = poll_s or float(spec.get("poll_s", 2))
    wake = threading.Event()  # SIGUSR1 (`keeper stop`): a round now, not at the next poll
    signal.signal(signal.SIGUSR1, lambda *_: wake.set())
    supervisor, spec_file = os.getppid(), keeper_dir(run_dir) / "spec.json"
    spec_seen = spec_file.stat().st_mtime_ns
    said_full = False
    try:
        while True:
            try:
                ended = keeper.step()
                said_full = False
            except OSError as err:
                if err.errno != errno.ENOSPC:
                    raise
                # its own small files cannot be written: said once, tried again each round (its supervisor
                # would restart it into the same wall until it gives up); the ranks are left as they are
                if not said_full:
                    say(f"{spec['me']}: the run's disk is full ({err}): the keeper waits for room, "
                        "its heartbeat still answers")
                said_full = True
                wake.wait(poll)
                wake.clear()
                continue
            if ended:
                keeper.end(ended)
                time.sleep(linger_s(spec))  # its heartbeat says so a while longer: every peer hears it
                return 0
            if spec_file.stat().st_mtime_ns != spec_seen:  # fab train started the run again: its token, its start
                say("fab train wrote a new spec: the keeper starts again to take it")
                return RESPEC
            # its supervisor was killed (not systemd's unit): a new one takes over, this keeper leaves
            if os.getppid() != supervisor and not os.environ.get(supervision.UNIT_ENV):
                server.shutdown()
                server.server_close()
                say(f"the keeper's supervisor is gone: a new one ({launch(run_dir)}) takes over")
                return 0
            if keeper.consensus is not None and (member is None or not member_alive(member)) \
                    and time.monotonic() >= member_retry:
                # its etcd exited (a full disk, its data gone, its member removed) or this host was added
                # as a member: started as etcd's member list says (consensus.etcd_member)
                if member is not None:
                    say("this host's etcd member exited (its etcd.log says why)")
                member, member_retry = etcd_member(run_dir, spec), time.monotonic() + 10
            wake.wait(poll)
            wake.clear()
    finally:
        server.shutdown()
        server.server_close()
        if member is not None:
            stop_etcd_member(member)


def linger_s(spec: dict) -> float:
    """How long an ending keeper still answers: a few of its peers' polls."""
    return 3 * float(spec.get("poll_s", 2)) + 1


RESTART_DELAYS_S = (1, 2, 5, 10, 30, 60)  # the keeper's restarts back off, then stay a minute apart
START_LIMIT = (10, 600.0)  # at most this many failed starts in this many seconds, then the supervisor gives up
RESPEC = 75  # the keeper's exit status when `fab train` wrote a new spec: started again at once, to read it


def restart_delay(failures: list[float], now: float) -> float | None:
    """How long to wait before starting a failed keeper again (its recent failures' monotonic times),
    or None when it failed START_LIMIT[0] times within START_LIMIT[1] seconds (systemd's StartLimit)."""
    recent = [t for t in failures if now - t < START_LIMIT[1]]
    if len(recent) >= START_LIMIT[0]:
        return None
    return float(RESTART_DELAYS_S[min(len(recent), len(RESTART_DELAYS_S)) - 1]) if recent else 0.0


def supervise(run_dir: str) -> int:
    """Run the keeper; start it again when it fails (backing off), until it ends (finished, stopped),
    is stopped, or fails too often (said in the keeper's log and in RUN/keeper/ended)."""
    kdir = keeper_dir(run_dir)
    (kdir / "keeper.pid").write_text(str(os.getpid()))
    child: subprocess.Popen | None = None
    failures: list[float] = []

    def leave(*_):
        if child is not None and child.poll() is None:
            child.terminate()
        sys.exit(0)

    signal.signal(signal.SIGTERM, leave)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # meant for the keeper (its own handler), sent to the group
    while not (kdir / "stop").exists():
        child = subprocess.Popen([sys.executable, "-m", "train.agent.keeper.loop", "run", "--run", run_dir])
        code = child.wait()
        if code == 0:
            return 0
        if code == RESPEC:
            continue
        failures.append(time.monotonic())
        delay = restart_delay(failures, time.monotonic())
        if delay is None:
            why = (f"the keeper failed {START_LIMIT[0]} times in {START_LIMIT[1]:g} s (last exit status {code}): "
                   "its supervisor gives up; keeper.log says why; fab train --rejoin starts it again")
            say(why)
            (kdir / "ended").write_text(why + "\n")
            return 1
        say(f"the keeper exited with status {code}: started again in {delay:g} s")
        time.sleep(delay)
    return 0


def launch(run_dir: str, user: tuple[int, int] | None = None, keys: dict[str, str] | None = None) -> int:
    """Start the keeper's supervisor, detached; a no-op where it runs. Returns its pid. `keys`: the
    experiment trackers' (train.agent.trainer.tracker), in its environment only."""
    kdir = keeper_dir(run_dir)
    if pid := supervisor_pid(run_dir):
        if not (kdir / "ended").exists():
            return pid
        end_lingering(pid, run_dir)  # a keeper that ended (fab stop) and lingers for its peers: a new start
    for mark in ("stop", "ended"):
        (kdir / mark).unlink(missing_ok=True)
    if supervision.systemd_is_init():
        why = supervision.start_unit(run_dir, user, keys)
        if why is None:
            return supervisor_pid_within(run_dir, 5) or 0
        say(f"systemd-run could not start the keeper's unit ({why}): tandem's supervisor keeps it instead")
    log = (kdir / "keeper.log").open("ab")
    proc = subprocess.Popen([sys.executable, "-m", "train.agent.keeper.loop", "supervise", "--run", run_dir],
                            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                            cwd=run_dir, env=os.environ | (keys or {}),
                            **({"user": user[0], "group": user[1]} if user else {}))
    return proc.pid


def supervisor_pid_within(run_dir: str, seconds: float) -> int | None:
    deadline = time.monotonic() + seconds
    while not (pid := supervisor_pid(run_dir)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return pid


def end_lingering(pid: int, run_dir: str, wait_s: float = 5) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + wait_s
    while supervisor_pid(run_dir) and time.monotonic() < deadline:
        time.sleep(0.05)


def stop(run_dir: str, wait_s: float = 20) -> str:
    """`fab stop` on this host: the keeper told and woken (SIGUSR1: a round now), it stops its ranks and
    ends; then every rank confirmed stopped (train.agent.keeper.stop), and the keeper's final copy off the cluster
    waited for within the same time (an upload still under way goes on; `fab status` says when it is
    done). Returns train.agent.keeper.stop's word. The keeper's heartbeat says "stopping" a while longer (its
    peers hear it) in the background: the stop returns once the ranks are gone, not after that linger."""
    kdir = keeper_dir(run_dir)
    if kdir.exists():
        (kdir / "stop").write_text(time.strftime("%Y-%m-%dT%H:%M:%S%z\n"))
    deadline = time.monotonic() + wait_s + 5
    if pid := supervisor_pid(run_dir):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGUSR1)
        while supervisor_pid(run_dir) and not (kdir / "ended").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        if not (kdir / "ended").exists() and (pid := supervisor_pid(run_dir)):
            end_lingering(pid, run_dir)  # a keeper that did not end in time: it would start ranks again
    outcome = stop_ranks(run_dir, wait_s, mark=True)
    while schedule.newest_copy(run_dir)["closing"] and supervisor_pid(run_dir) \
            and time.monotonic() < deadline:  # the ending keeper's final copy off the cluster (fab stop says it)
        time.sleep(0.1)
    return "stopped" if outcome == "none" and (kdir / "ended").exists() else outcome


def boot(runs_root: str) -> list[str]:
    """At boot: launch the keeper of every run here that was neither finished nor stopped, as its owner."""
    started = []
    for spec in sorted(Path(runs_root).glob("*/keeper/spec.json")):
        kdir = spec.parent
        if (kdir / "ended").exists() or (kdir / "stop").exists():
            continue
        st = spec.stat()
        launch(str(kdir.parent), (st.st_uid, st.st_gid) if os.geteuid() == 0 else None)
        started.append(kdir.parent.name)
    return started


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m train.agent.keeper.loop", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    for name in ("launch", "run", "supervise", "stop", "show"):
        s = sub.add_parser(name)
        s.add_argument("--run", required=True, help="the run's directory on this host (/data/tandem/runs/RUN)")
        if name == "stop":
            s.add_argument("--wait", type=float, default=20)
        if name == "launch":
            s.add_argument("--keys-on-stdin", action="store_true",
                           help="read the experiment trackers' keys, one JSON line, from standard input")
    b = sub.add_parser("boot")
    b.add_argument("--runs", default="/data/tandem/runs")
    args = p.parse_args(argv)
    if args.what == "launch":
        print(launch(args.run, keys=tracker.read(sys.stdin) if args.keys_on_stdin else None))
    elif args.what == "run":
        return run(args.run)
    elif args.what == "supervise":
        return supervise(args.run)
    elif args.what == "stop":
        outcome = stop(args.run, args.wait)
        print(outcome)
        return 0 if outcome in ("none", "stopped", "killed") else 1
    elif args.what == "show":
        print(json.dumps(show(args.run)))
    else:
        print(" ".join(boot(args.runs)) or "no run to keep")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
