"""The run's keeper on one host: it keeps the run alive when nobody follows it.

    python -m train.agent.keeper launch --run /data/tandem/runs/RUN   (fab train; returns at once)
    python -m train.agent.keeper stop --run DIR [--wait 20]            (fab stop)
    python -m train.agent.keeper show --run DIR                        (fab status, following: one JSON line)
    python -m train.agent.keeper boot [--runs /data/tandem/runs]       (at boot: tandem-boot)

`fab train` writes RUN/keeper/spec.json on every host (the hosts in rank order, their cluster
addresses, each membership's exact training commands, built on the controller by train.run.command)
and launches a keeper on each: a supervisor process in a session of its own (it outlives the SSH
session and the controller) that restarts the keeper proper if it dies. The keepers heartbeat each
other over HTTP on the cluster network (`port`, with the run's token), so a host is judged lost by
its peers, never by a laptop. What they decide is train.agent.generation's; what moves checkpoints
is train.agent.replica's. Every membership change is appended to RUN/keeper/timeline.jsonl on
each host, with its time, update and reason: `fab status`, following and the report read it.

A reboot (a cloud maintenance event, a spot VM restarted) ends every process; `tandem-boot` (a
systemd unit on a VM, the lab host's init in the lab: the same command) runs `boot`, which launches
the keeper of every run that was neither finished nor stopped, as the user who started it. That
keeper is outside the generation its peers went on in, and is taken back at their next checkpoint.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from train.agent import agreement, offsite_schedule, preemption, replica, supervision, tracker
from train.agent.generation import (
    ENDED,
    FINISHED,
    IDLE,
    RUNNING,
    Checkpoint,
    Generation,
    LeaderMemory,
    View,
    copies_from,
    current,
    decide,
    descends_from,
    lineage_after,
    timeline_entry,
)
from train.agent.keeper_files import keeper_dir, read_json, read_timeline, show, supervisor_pid
from train.agent.state import run_pids, tail
from train.agent.stop import stop as stop_ranks

DONE = "done training in"  # fairseq's last line on rank 0 (fairseq_cli/train.py)
FETCH_TRIES = 3  # copies of one checkpoint that fail before this host says it cannot get it
RENDEZVOUS_PORTS = 4  # generations take turns on the run's port .. +3 (the firewall opens 29500-29510)


def _write_json(path: Path, data) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _say(text: str) -> None:
    print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {text}", flush=True)


ERROR_LINE = re.compile(r"^\s*(?:[\w.]+(?:Error|Exception)\b.*|exitcode\s*:.*|.*Killing job.*)$")


def rendezvous_moved(command: str, generation: int) -> str:
    """`command` with torchrun's --master_port moved to generation `generation`'s turn: consecutive
    generations never share a rendezvous, so a cut-off host's torchrun of an older one (alive until
    its keeper hears of the newer) cannot join the newer's store as a node it no longer is."""
    return re.sub(r"--master_port (\d+)",
                  lambda m: f"--master_port {int(m.group(1)) + generation % RENDEZVOUS_PORTS}", command, count=1)


def how_ranks_ended(lines: list[str]) -> str:
    """The last line of the log that says why the ranks ended (an exception, torchrun's exit code)."""
    said = [line.strip() for line in lines if ERROR_LINE.match(line)]
    return said[-1][-200:] if said else "its ranks exited"


class Keeper:
    """One host's keeper: its heartbeat, its view of the others, its ranks."""

    def __init__(self, run_dir: str, spec: dict, clock=time.time, ticks=time.monotonic):
        # `clock`: the wall clock, for what is recorded and shared (times, the restart budget);
        # `ticks`: a monotonic one for liveness (an NTP step must not delay declaring a peer lost)
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
        for peer, held in read_json(self.dir / "peers.json", {}).items():  # what the peers held when last heard
            if peer in self.peers:
                self.views[peer] = View(host=peer, generation=None, checkpoint=Checkpoint.of(held))
        self.memory = LeaderMemory()
        self.lock = threading.RLock()
        saved = read_json(self.dir / "active.json", {})
        self.active: int | None = saved.get("active")
        self.active_members: list[str] = saved.get("members", [])
        self.log_offset: int = saved.get("log_offset", 0)
        self.lineage = tuple(tuple(step) for step in saved.get("lineage") or ())  # of the saves its ranks make
        self.generation = Generation.of(read_json(self.dir / "generation.json"))
        self.recorded = {(e.get("generation"), tuple(e.get("hosts") or ())) for e in self.timeline()}
        if spec.get("start") and saved.get("start") != spec["start"]:  # a start fab train asked for
            number = (self.generation.number if self.generation else 0) + 1
            self.generation = Generation(number=number, members=tuple(spec["members"]),
                                         reason=spec.get("reason", "start"), time=round(started, 1), pending=True,
                                         start=spec["start"])
            _write_json(self.dir / "generation.json", self.generation.to_dict())
            # nothing runs for this start yet: a finished run resumed for more updates is not finished
            self.active, self.active_members, self.log_offset = None, [], 0
            self._save_active(start=spec["start"])
        self.checkpoint = Checkpoint.of(self.verified())  # hashed before it is resumed from or served
        if self.checkpoint is None and replica.manifest(run_dir) is None and replica.paths(run_dir)[0].exists():
            _, made = replica.snapshot(run_dir, 0, None)  # a checkpoint from before keepers
            self.checkpoint = Checkpoint.of(made)
        self.seen: tuple[int, int] | None = None
        self.fetching: threading.Thread | None = None
        self.fetch_error = ""
        self.fetch_failures: dict[str, int] = {}  # sha256 -> copies of it that did not arrive whole
        self.fetch_after = 0.0  # ticks: the next try waits (1, 2, 4 ... 60 s after each failure)
        self.said_waiting = ""
        self.agreement = agreement.Agreement(spec) if agreement.uses_etcd(self.order) else None
        self.agreed_now = self.agreement is None  # etcd answered this round (with three hosts or more)
        self.start_to_propose = self.generation if self.generation and self.generation.pending else None
        self.said_unavailable = ""
        self.unavailable_since: float | None = None  # ticks: etcd's majority out of reach since
        self.corrupt = False
        self.peers_held: dict = read_json(self.dir / "peers.json", {})
        self.how = ""
        self.ended = ""
        self.offsite = offsite_schedule.Uploads(run_dir, spec, _say, clock)  # copies off the cluster, if asked
        self.watcher: preemption.Watcher | None = None  # on a cloud VM: its notices (started by run())
        self.leaving: dict = {}  # this host's notice, as its heartbeat says it (View.leaving ...)
        self.saved_for: set[tuple[str, float]] = set()  # the notices rank 0 was asked to save for

    # --- the record on this host

    def verified(self) -> dict | None:
        """This host's snapshot's manifest, its bytes hashed against it; a snapshot that does not match
        (a flipped byte on disk) is set aside as corrupt and this host holds none."""
        held = replica.manifest(self.run_dir)
        if held is None or replica.verify(self.run_dir, held):
            return held
        aside = replica.set_aside(self.run_dir, held, why="corrupt")
        _say(f"checkpoint of update {held['update']} does not match its manifest's sha256: set aside at {aside}; "
             "this host holds none until a peer's copy arrives")
        return None

    def _save_active(self, start: str | None = None) -> None:
        data = read_json(self.dir / "active.json", {})
        data.update({"active": self.active, "members": self.active_members, "log_offset": self.log_offset,
                     "lineage": [list(step) for step in self.lineage]})
        if start is not None:
            data["start"] = start
        _write_json(self.dir / "active.json", data)

    def timeline(self) -> list[dict]:
        return read_timeline(self.dir)

    def record(self, gen: Generation) -> None:
        """The newest generation known here, kept on disk; a resolved one enters the timeline once."""
        self.generation = gen
        _write_json(self.dir / "generation.json", gen.to_dict())
        if gen.pending or (gen.number, gen.members) in self.recorded:
            return
        self.recorded.add((gen.number, gen.members))
        key = ",".join(gen.members)
        entry = timeline_entry(gen, self.spec.get("update_freq", {}).get(key), self.spec.get("ranks", {}).get(key))
        with (self.dir / "timeline.jsonl").open("a") as f:
            f.write(json.dumps(entry) + "\n")
        _say(f"generation {gen.number}: {', '.join(gen.members) or 'no hosts'} ({gen.reason})")

    # --- what this host says

    def log(self) -> Path:
        return Path(self.run_dir) / "train.log"

    def finished(self) -> bool:
        """Rank 0's fairseq said it is done, since this host's ranks last started."""
        try:
            with self.log().open("rb") as f:
                f.seek(max(self.log_offset, f.seek(0, os.SEEK_END) - (1 << 16)))
                return DONE.encode() in f.read()
        except OSError:
            return False

    def ranks(self) -> str:
        if run_pids(self.run_dir):
            return RUNNING
        if self.active is None:
            return IDLE
        if self.active_members[:1] == [self.me] and self.finished():
            return FINISHED
        return ENDED

    def last_update(self) -> int | None:
        if self.active_members[:1] != [self.me]:
            return None
        from train.agent.state import last_update
        return last_update(self.log())

    def view(self, ranks: str | None = None) -> View:
        ranks = ranks or self.ranks()
        how = ""
        if ranks == ENDED:
            how = how_ranks_ended(tail(self.log(), 80))
        failed = [sha for sha, n in self.fetch_failures.items() if n >= FETCH_TRIES]
        return View(host=self.me, generation=self.generation, checkpoint=self.checkpoint, ranks=ranks,
                    active=self.active, active_members=tuple(self.active_members), update=self.last_update(), how=how,
                    stopping=(self.dir / "stop").exists(), hears=tuple(sorted(self.live)),
                    cannot_get=failed[-1] if failed else "", cannot_get_why=self.fetch_error if failed else "",
                    **self.leaving)

    def answer(self) -> View:
        """What a peer hears: this moment's view, but "finished" only once a round has snapshot the
        last save (a peer that heard "finished" beside the save before it would end without it)."""
        now, last = self.view(), self.views.get(self.me)
        if now.ranks == FINISHED and (last is None or last.ranks != FINISHED):
            return replace(now, ranks=last.ranks if last else RUNNING)
        return now

    # --- the others

    def ask(self, peer: str) -> View | None:
        url = f"http://{self.spec['addresses'][peer]}:{self.spec['port']}/state"
        request = urllib.request.Request(url, headers={"X-Tandem-Token": self.spec["token"]})
        try:
            with urllib.request.urlopen(request, timeout=2) as answer:
                return View.of(json.loads(answer.read()))
        except (OSError, ValueError, KeyError):
            return None

    def listen(self) -> ThreadingHTTPServer:
        keeper = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # one line a poll would drown the keeper's own log
                pass

            def do_GET(self):
                if self.headers.get("X-Tandem-Token") != keeper.spec["token"]:
                    self.send_error(403)
                    return
                if self.path == "/state":
                    with keeper.lock:
                        body = json.dumps(keeper.answer().to_dict()).encode()
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                elif self.path == "/checkpoint":
                    snap = replica.paths(keeper.run_dir)[1]
                    if not keeper.serves():
                        self.send_error(409, "this host's checkpoint does not match its manifest")
                        return
                    try:
                        f = snap.open("rb")
                    except OSError:
                        self.send_error(404)
                        return
                    with f:
                        self.send_response(200)
                        self.send_header("Content-Length", str(os.fstat(f.fileno()).st_size))
                        self.end_headers()
                        self.wfile.flush()
                        with contextlib.suppress(OSError):
                            self.connection.sendfile(f)
                else:
                    self.send_error(404)

        server = ThreadingHTTPServer((self.spec["addresses"][self.me], int(self.spec["port"])), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True, name="heartbeat").start()
        return server

    # --- one round

    def step(self) -> str | None:
        """Listen to the peers, decide (as leader), act. Returns why the keeper ends, or None."""
        now, tick = self.clock(), self.ticks()
        ranks = self.ranks()  # before the snapshot: "done training" is logged after the last save
        if self.corrupt:  # a peer asked for a copy that no longer matches its manifest
            self.corrupt, self.checkpoint = False, Checkpoint.of(self.verified())
        self.snapshot()
        self.offsite.tick(self.active_members if self.active is not None else [])  # a child process uploads
        self.heed_notice()
        with ThreadPoolExecutor(max_workers=max(1, len(self.peers))) as pool:
            answers = dict(zip(self.peers, pool.map(self.ask, self.peers), strict=True))
        with self.lock:  # what the heartbeat reads; never held while acting (a stop takes seconds)
            for peer, said in answers.items():
                if said is not None:
                    self.views[peer], self.heard[peer] = said, tick
            self.live = {self.me} | {p for p in self.peers if tick - self.heard[p] < self.lost_after_s}
            self.views[self.me] = self.view(ranks)
            seen = {h: v for h, v in self.views.items() if h in self.live}
        self.save_for_leaving(seen)
        if self.agreement is not None:
            decided = self.agree(now)
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
                _say(self.memory.waiting)  # generation even when the leader waits: said either way
            self.said_waiting = self.memory.waiting
            self.remember_peers()
        return self.act(seen)

    def heed_notice(self) -> None:
        """This host's cloud reclaims it (train.agent.preemption): its heartbeat says so from now on, with
        the deadline and the newest save it knows of (the run goes on from a newer one: rank 0's, now)."""
        notice = self.watcher.notice if self.watcher else None
        if notice is None or self.leaving:
            return
        held = [c.update for c in [self.checkpoint, *(v.checkpoint for v in self.views.values())] if c]
        self.leaving = {"leaving": notice.deadline, "leaving_why": notice.words(),
                        "leaving_after": max(held, default=None)}
        _say(f"{self.me}: {notice.words()}: this host leaves the run; the others go on without it from rank 0's save")

    def save_for_leaving(self, seen: dict[str, View]) -> None:
        """The keeper holding rank 0 asks it to save now, once for each notice (its own host's or a peer's)."""
        notices = [(h, v) for h, v in seen.items() if v.leaving is not None and (h, v.leaving) not in self.saved_for
                   and h in self.active_members]
        if not notices or self.active_members[:1] != [self.me] or not run_pids(self.run_dir):
            return
        why = preemption.save_now(self.run_dir)
        if not why:  # that save goes off the cluster at once, not at the interval (every VM may go)
            self.offsite.soon(self.checkpoint.update if self.checkpoint else None, max(v.leaving for _, v in notices)
                              + 60, " and ".join(f"{h}'s notice" for h, _ in notices))
        for host, v in notices:
            self.saved_for.add((host, v.leaving))
            _say(f"{host}: {v.leaving_why}: {f'no save now ({why})' if why else 'saving now'}, going on without {host}")

    def decide(self, now: float, agreed: Generation | None = None) -> Generation | None:
        # every view, the silent hosts' last ones too: a lost rank 0's last update is in its own
        return decide(self.me, self.order, dict(self.views), set(self.live), now, self.memory,
                      self.lost_after_s, float(self.spec.get("ended_grace_s", 25)),
                      int(self.spec.get("max_restarts", 3)), bool(self.spec.get("elastic", True)), agreed=agreed)

    def agree(self, now: float) -> Generation | None:
        """Three hosts or more: the generation is etcd's. A start `fab train` asked for is proposed
        once; the keeper holding etcd's `leader` lease decides and compare-and-swaps the next one.
        Returns the generation to record, or None. A side cut off from etcd's majority learns nothing
        and starts no ranks (`agreed_now`)."""
        try:
            held = self.agreement.current()
            if self.start_to_propose is not None:
                start = self.start_to_propose
                if held.generation is None or held.generation.start != start.start:
                    start = replace(start, number=max(start.number, (held.generation.number if held.generation
                                                                     else 0) + 1))
                    if self.agreement.propose(start, held.revision):
                        _say(f"start {start.start} proposed as generation {start.number}")
                    held = self.agreement.current()
                self.start_to_propose = None
            leads = self.agreement.leads()
        except agreement.Unavailable as err:
            self.agreed_now = False
            if not self.said_unavailable:
                _say(f"etcd answers without a majority of the run's hosts from here: no ranks start ({err})")
            self.said_unavailable = str(err)
            self.fence(self.ticks())
            return None
        if self.said_unavailable:
            _say("etcd answers again")
        self.agreed_now, self.said_unavailable, self.unavailable_since = True, "", None
        gen = held.generation
        if not leads or gen is None:
            return gen
        with self.lock:
            decided = self.decide(now, agreed=gen)
        if decided is None:
            return gen
        try:
            if self.agreement.propose(decided, held.revision):
                return decided
        except agreement.Unavailable:
            pass
        return gen  # another generation was agreed meanwhile: the next round reads it

    def fence(self, tick: float) -> None:
        """Cut off from etcd's majority as long as a peer takes to be declared lost: the others go on
        without this host, so its ranks stop instead of waiting in a collective (and, were the link
        back, meeting a newer generation's rendezvous)."""
        self.unavailable_since = self.unavailable_since if self.unavailable_since is not None else tick
        if tick - self.unavailable_since >= self.lost_after_s and run_pids(self.run_dir):
            _say(f"cut off from the run's majority for {tick - self.unavailable_since:.0f} s: this host's ranks of "
                 f"generation {self.active} stop (the others go on without it)")
            stop_ranks(self.run_dir, mark=False)

    def remember_peers(self) -> None:
        """What each peer held when last heard, on disk: a keeper started again (a reboot) still knows
        that a silent peer holds the run's training, and does not start it from nothing."""
        held = {p: v.checkpoint.to_dict() for p, v in self.views.items() if p != self.me and v.checkpoint}
        if held != self.peers_held:
            _write_json(self.dir / "peers.json", held)
            self.peers_held = held

    def serves(self) -> bool:
        """Whether the snapshot a peer asks for still matches its manifest (hashed once a file)."""
        held = replica.manifest(self.run_dir)
        if held is not None and replica.verify(self.run_dir, held, cached=True):
            return True
        self.corrupt = True
        return False

    def snapshot(self) -> None:
        """On rank 0's host, each new save becomes the snapshot peers fetch."""
        if self.active is None or self.active_members[:1] != [self.me]:
            return
        self.seen, made = replica.snapshot(self.run_dir, self.active, self.seen, self.lineage)
        if made:
            self.checkpoint = Checkpoint.of(made)
            _say(f"checkpoint of update {made['update']} ({made['size']:,} bytes) ready for the peers")

    def act(self, seen: dict[str, View]) -> str | None:
        gen = self.generation
        stopping = [h for h, v in seen.items() if v.stopping and gen and h in gen.members and h != self.me]
        if (self.dir / "stop").exists() or stopping:
            stop_ranks(self.run_dir, mark=True)
            return f"stopped ({'fab stop' if not stopping else 'fab stop on ' + ', '.join(stopping)})"
        if any(v.ranks == FINISHED for v in seen.values()):
            self.wait_for_ranks(60)
            return None if self.final_copy_pending(gen, seen) else "finished"
        if gen is None or gen.pending:
            return None
        if gen.stopped:
            stop_ranks(self.run_dir, mark=False)
            return f"stopped: {gen.reason}"
        if self.me in gen.members:
            if (self.active, tuple(self.active_members)) != (gen.number, gen.members):
                if self.agreed_now:  # never on a generation this side could not confirm with etcd
                    self.start(gen)
            else:
                self.replicate(gen, seen)
        elif self.active is not None and self.active <= gen.number and run_pids(self.run_dir) \
                and set(self.active_members) & set(gen.members) - {self.me}:
            _say(f"generation {gen.number} goes on without this host: its ranks of generation {self.active} stop")
            stop_ranks(self.run_dir, mark=False)
        return None

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

    def wait_for_ranks(self, seconds: float) -> None:
        """The run is done: this host's ranks end by themselves, or are stopped after `seconds`."""
        deadline = time.monotonic() + seconds
        while run_pids(self.run_dir) and time.monotonic() < deadline:
            time.sleep(1)
        if run_pids(self.run_dir):
            stop_ranks(self.run_dir, mark=False)

    def start(self, gen: Generation) -> None:
        """Join generation `gen`: this host's old ranks stopped, its checkpoint the one `gen` starts
        from (fetched and verified where it differs), then its ranks started."""
        if run_pids(self.run_dir):
            _say(f"stopping this host's ranks of generation {self.active} for generation {gen.number}")
            stop_ranks(self.run_dir, mark=False)
        if not self.ready_checkpoint(gen):
            return
        command = rendezvous_moved(self.spec["commands"][",".join(gen.members)][self.me], gen.number)
        try:
            self.log_offset = self.log().stat().st_size
        except OSError:
            self.log_offset = 0
        env = tracker.rank_environment(command, os.environ)
        if env.get("WANDB_MODE") == "offline" and "WANDB_MODE" not in os.environ:
            _say("W&B logs offline (no key here: this keeper was started without the controller, e.g. at boot)")
        done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, env=env)
        if done.returncode != 0:
            _say(f"could not start this host's ranks: {done.stderr.strip()[-300:]}")
            return
        self.active, self.active_members = gen.number, list(gen.members)
        self.lineage = lineage_after(self.checkpoint.to_dict() if self.checkpoint else None, gen.number,
                                     gen.members[0])
        self.seen = replica.seen_now(self.run_dir)  # what it resumes from: no save of this generation
        self._save_active()
        source = gen.source or {}
        _say(f"ranks of generation {gen.number} started (rank {gen.members.index(self.me)} host of "
             f"{len(gen.members)}; from update {source.get('update', 0)})")

    def ready_checkpoint(self, gen: Generation) -> bool:
        """This host holds `gen`'s checkpoint (or none, when it starts from none); False while a fetch runs."""
        want = self.newest_of_holder(gen.source)
        mine = self.checkpoint
        if want is None:
            if mine is not None:  # ranks elsewhere start from scratch: one finding a checkpoint would hang
                aside = replica.set_aside(self.run_dir, mine.to_dict(), keep=self.set_aside_kept())
                _say(f"generation {gen.number} starts from no checkpoint: this host's is set aside at {aside}")
                self.checkpoint = None
            replica.clear(self.run_dir)
            return True
        if mine is not None and mine.sha256 == want["sha256"]:
            if not replica.verify(self.run_dir, mine.to_dict()):  # hashed before it is resumed from
                self.checkpoint = Checkpoint.of(self.verified())
                # this host cannot get the source whole (its own copy is it): its heartbeat says so, and the
                # leader starts from the next best instead of waiting for a copy that no longer exists
                self.fetch_failures[want["sha256"]] = FETCH_TRIES
                self.fetch_error = f"{self.me}'s copy of update {want['update']} does not match its manifest"
                return False
            replica.restore(self.run_dir)
            return True
        if self.fetching is not None and self.fetching.is_alive():
            return False
        if want["host"] == self.me:  # its snapshot moved on since: the newest it holds is the one now
            return mine is not None and replica.restore(self.run_dir) is None
        if mine is not None and not descends_from(want, mine):
            aside = replica.set_aside(self.run_dir, mine.to_dict(), keep=self.set_aside_kept())
            _say(f"checkpoint of generation {mine.generation}, update {mine.update}: another history than the one "
                 f"generation {gen.number} goes on with (update {want['update']}), set aside whole at {aside}")
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
        the next try, and after FETCH_TRIES this host's heartbeat says it cannot get it (the leader
        then starts from the next best checkpoint)."""
        if self.ticks() < self.fetch_after or want["sha256"] in self.refused():
            return
        url = f"http://{self.spec['addresses'][want['host']]}:{self.spec['port']}/checkpoint"

        def fetch() -> None:
            started = time.monotonic()
            try:
                got = replica.fetch(url, self.spec["token"], self.run_dir, want)
                self.checkpoint, self.fetch_error = Checkpoint.of(got), ""
                self.fetch_failures.pop(want["sha256"], None)
                self.seen = replica.seen_now(self.run_dir)
                _say(f"checkpoint of update {want['update']} from {want['host']}: {want['size']:,} bytes, "
                     f"sha256 checked, in {time.monotonic() - started:.1f} s")
            except replica.FetchError as err:
                failures = self.fetch_failures[want["sha256"]] = self.fetch_failures.get(want["sha256"], 0) + 1
                self.fetch_error = str(err)
                self.fetch_after = self.ticks() + min(60.0, 2.0 ** (failures - 1))
                gave_up = f"; {failures} tries: this host cannot get it" if failures >= FETCH_TRIES else ""
                _say(f"checkpoint copy failed (the previous one is kept): {err}{gave_up}")

        self.fetching = threading.Thread(target=fetch, daemon=True, name="fetch")
        self.fetching.start()

    def replicate(self, gen: Generation, seen: dict[str, View]) -> None:
        """Each new checkpoint of rank 0's is held by a majority of the generation's hosts: the next
        len // 2 hosts after rank 0's fetch it, each from the one before it (one copy a link, over the
        cluster network; every host at every save would send GBs x hosts beside the all-reduce)."""
        holder = copies_from(gen.members, self.me)
        before = seen.get(holder) if holder else None
        theirs = before.checkpoint if before else None
        if theirs is None or (self.checkpoint and theirs.key() <= self.checkpoint.key()) \
                or (self.fetching is not None and self.fetching.is_alive()):
            return
        self.fetch_from({"host": holder, **theirs.to_dict()})


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
    keeper.watcher = preemption.watch(keeper.me, say=_say)  # None off a cloud: nothing polls
    member = etcd_member(run_dir, spec) if keeper.agreement is not None else None
    server = keeper.listen()
    _say(f"keeper of {spec['run_id']} on {keeper.me}: peers {', '.join(keeper.peers) or 'none'}, "
         f"lost after {keeper.lost_after_s:g} s of silence")
    poll = poll_s or float(spec.get("poll_s", 2))
    wake = threading.Event()  # SIGUSR1 (`keeper stop`): a round now, not at the next poll
    signal.signal(signal.SIGUSR1, lambda *_: wake.set())
    supervisor, spec_file = os.getppid(), keeper_dir(run_dir) / "spec.json"
    spec_seen = spec_file.stat().st_mtime_ns
    try:
        while True:
            ended = keeper.step()
            if ended:
                keeper.snapshot()  # a save rank 0 made before `fab stop` stopped it
                keeper.offsite.closing()  # its final copy off the cluster is to come: `keeper stop` waits for it
                (keeper.dir / "ended").write_text(ended + "\n")
                _say(f"the keeper ends: {ended}")
                keeper.offsite.finish(keeper.active_members if keeper.active is not None else [], ended)
                time.sleep(linger_s(spec))  # its heartbeat says so a while longer: every peer hears it
                return 0
            if spec_file.stat().st_mtime_ns != spec_seen:  # fab train started the run again: its token, its start
                _say("fab train wrote a new spec: the keeper starts again to take it")
                return RESPEC
            # its supervisor was killed (not systemd's unit): a new one takes over, this keeper leaves
            if os.getppid() != supervisor and not os.environ.get(supervision.UNIT_ENV):
                server.shutdown()
                server.server_close()
                _say(f"the keeper's supervisor is gone: a new one ({launch(run_dir)}) takes over")
                return 0
            wake.wait(poll)
            wake.clear()
    finally:
        server.shutdown()
        server.server_close()
        if member is not None:
            stop_etcd_member(member)


def etcd_member(run_dir: str, spec: dict) -> int | None:
    """This host's etcd member of the run (its data in RUN/keeper/etcd/, kept across restarts: Raft's
    log is the agreement's memory): started, or the one a killed keeper left running taken over.
    Its pid, or None on a host that is not a member."""
    if spec["me"] not in agreement.members(spec["order"]):
        return None
    kdir = keeper_dir(run_dir)
    data = kdir / "etcd" / agreement.start_key(spec)
    for older in (kdir / "etcd").glob("*"):  # an earlier start's cluster: this start formed its own
        if older != data:
            shutil.rmtree(older, ignore_errors=True)
    data.parent.mkdir(exist_ok=True)
    with contextlib.suppress(OSError, ValueError):
        pid = int((kdir / "etcd.pid").read_text())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        if str(data).encode() in cmdline:
            return pid  # left running by a keeper killed with SIGKILL: taken over
        if str(kdir / "etcd").encode() in cmdline:
            stop_etcd_member(pid)  # an earlier start's member left running: it holds the ports
    binary = shutil.which("etcd") or "/usr/bin/etcd"
    if not os.path.exists(binary):
        _say("etcd is not installed on this host: provisioning installs it (etcd-server); the run's agreement "
             "waits for a majority of its etcd members")
        return None
    log = (kdir / "etcd.log").open("ab")
    proc = subprocess.Popen(agreement.member_command(spec, str(data), binary), stdin=subprocess.DEVNULL,
                            stdout=log, stderr=log)
    (kdir / "etcd.pid").write_text(str(proc.pid))
    _say(f"etcd member of the run started (pid {proc.pid}; members {', '.join(agreement.members(spec['order']))})")
    return proc.pid


def stop_etcd_member(pid: int, wait_s: float = 10) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(pid, os.WNOHANG)[0]:
                return
        if not Path(f"/proc/{pid}").exists():
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


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
        child = subprocess.Popen([sys.executable, "-m", "train.agent.keeper", "run", "--run", run_dir])
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
            _say(why)
            (kdir / "ended").write_text(why + "\n")
            return 1
        _say(f"the keeper exited with status {code}: started again in {delay:g} s")
        time.sleep(delay)
    return 0


def launch(run_dir: str, user: tuple[int, int] | None = None, keys: dict[str, str] | None = None) -> int:
    """Start the keeper's supervisor, detached; a no-op where it runs. Returns its pid. `keys`: the
    experiment trackers' (train.agent.tracker), in its environment only."""
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
        _say(f"systemd-run could not start the keeper's unit ({why}): tandem's supervisor keeps it instead")
    log = (kdir / "keeper.log").open("ab")
    proc = subprocess.Popen([sys.executable, "-m", "train.agent.keeper", "supervise", "--run", run_dir],
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
    ends; then every rank confirmed stopped (train.agent.stop), and the keeper's final copy off the cluster
    waited for within the same time (an upload still under way goes on; `fab status` says when it is
    done). Returns train.agent.stop's word. The keeper's heartbeat says "stopping" a while longer (its
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
    while offsite_schedule.newest_copy(run_dir)["closing"] and supervisor_pid(run_dir) \
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
    p = argparse.ArgumentParser(prog="python -m train.agent.keeper", description=__doc__.split("\n\n")[0])
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
