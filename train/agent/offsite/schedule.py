"""When the keeper of rank 0's host uploads the run's checkpoints off the cluster (train.agent.offsite.upload).

The spec's `offsite` ({"url": ..., "every_s": 1800}, from `fab train --checkpoints-to URL`) turns it on.
Only the keeper of the generation's first host uploads (its checkpoint is the source: one host a copy):
checkpoint_last every `every_s` (its snapshot, train.agent.keeper.replica's: whole and hashed), and
checkpoint_best when it changed; at once, whatever the interval, the save rank 0 made for a host's
notice (`soon`, train.agent.keeper.preemption) and, when the run ends (finished, `fab stop`), its newest save
before the keeper ends (`finish`, within `final_s`). Each upload is a child process, `python -m
train.agent.offsite.upload upload`, niced, in a session of its own (`fab stop` signals the keeper's process
group, never it), started and watched from the keeper's rounds (never its heartbeat thread); the files
it sends are hard links in RUN/checkpoints/.offsite/ (a save meanwhile does not change them). What was
uploaded, and the upload under way, are kept in RUN/keeper/offsite.json: a keeper started again adopts
a child still running, or redoes a job whose child died; `fab status` reads the newest copy there.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from train.agent.keeper import replica
from train.agent.offsite.upload import JOB, RESULT
from train.agent.trainer import checkpoint_info

STATE = "offsite.json"
STAGED = ".offsite"  # in RUN/checkpoints/: the files an upload sends, hard links
RETRY_S = (30, 60, 120, 300, 600)  # a failed upload is tried again later and later
NOTICE_RETRY_S = 5  # a notice's save that failed: tried again soon (AWS gives 2 min, GCP 30 s)
FINAL_S = 1800.0  # the longest an ending keeper waits for its last copies (the spec's offsite.final_s)


def read_json(path: Path, default=None):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return default


def _write_json(path: Path, data) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _stamp(path: Path) -> list[int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return [st.st_ino, st.st_mtime_ns, st.st_size]


def uploader_alive(pid: int | None, run_dir: str) -> bool:
    """Whether `pid` is this run's upload child still (not a pid reused since)."""
    try:
        line = Path(f"/proc/{pid}/cmdline").read_bytes() if pid else b""
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split() if pid else []
    except OSError:
        return False
    return b"train.agent.offsite.upload" in line and run_dir.encode() in line and stat[:1] != ["Z"]


class Uploads:
    """The off-cluster copies of one host's keeper: `tick` once a round."""

    def __init__(self, run_dir: str, spec: dict, say, clock=time.time):
        self.run_dir, self.spec, self.say, self.clock = run_dir, spec, say, clock
        self.config = spec.get("offsite") or None
        self.kdir = Path(run_dir) / "keeper"
        self.state: dict = read_json(self.kdir / STATE, {})
        self.state.pop("closing", None)  # an ending keeper's mark: this one is not ending
        self.child: subprocess.Popen | None = None
        self.members: list[str] = []

    def save(self) -> None:
        _write_json(self.kdir / STATE, self.state)

    def tick(self, members: list[str]) -> None:
        """Collect a finished upload; on the generation's first host, start the next one that is due."""
        if not self.config:
            return
        self.members = list(members)
        try:
            urgent = self.notice_save()  # a notice's save goes first: before a routine upload, any back-off
            job = self.state.get("pending")
            if job and job.get("pid"):  # started: still running, or its result to collect
                if self.running(job) and (not urgent or job.get("notice")):
                    return
                if self.running(job):
                    self.say(f"the save for {self.state['soon']['why']} (update {urgent}) goes first: the copy "
                             "under way is stopped (no manifest: it never counts)")
                    self.stop(job)
                    self.collect(job, failed=False)
                else:
                    self.collect(job)
            if members[:1] != [self.spec["me"]] or (not urgent and self.clock() < self.state.get("retry_at", 0)):
                return
            job = (None if urgent else self.state.get("pending")) or self.due()
            if job:
                self.start(job)
        except Exception as err:  # an upload's trouble never ends the keeper
            self.say(f"checkpoint copy off the cluster: {type(err).__name__}: {err}")

    def running(self, job: dict) -> bool:
        if self.child is not None:
            return self.child.poll() is None
        return uploader_alive(job.get("pid"), self.run_dir)  # a keeper before this one started it

    def notice_save(self) -> int | None:
        """The update of the save rank 0 made for a notice, when it is not off the cluster yet (or None)."""
        soon, held = self.state.get("soon"), replica.manifest(self.run_dir)
        if not soon or not held or self.clock() > soon["until"] or held["update"] <= soon["after"]:
            return None
        uploaded = (self.state.get("uploaded", {}).get("last") or {}).get("update", -1)
        return held["update"] if held["update"] > uploaded else None

    def collect(self, job: dict, again: bool = True, failed: bool = True) -> None:
        """The child ended: its result recorded (the newest copy), or the job kept to be redone later
        (`again`: by this keeper, after a wait; else by the next keeper of the run); a job stopped for a
        notice's save (`failed` False) is dropped, what it held staged again with the notice's."""
        self.child = None
        result = read_json(self.kdir / RESULT, {})
        if result.get("id") == job["id"] and not result.get("error"):
            for item, done in zip(job["items"], result["done"], strict=False):
                self.state.setdefault("uploaded", {})[item["kind"]] = {**done, "stamp": item.get("stamp")}
                self.say(f"checkpoint_{item['kind']} of update {done['update']} copied off the cluster: "
                         f"{done['where']} ({time.time() - job['started']:.0f} s)")
            self.state.update(pending=None, error="", failures=0, retry_at=0)
            newest = [d for d in result["done"] if d["kind"] == "last"]
            if newest:
                self.state["newest"] = newest[-1]
            for name in job.get("staged", []):
                Path(name).unlink(missing_ok=True)
        elif not failed:
            self.state.update(pending=None)
        else:
            why = result.get("error") if result.get("id") == job["id"] else "the upload ended before it finished"
            failures = self.state.get("failures", 0) + 1
            # a notice's save is tried again soon: the VMs may be gone within minutes
            delay = NOTICE_RETRY_S if job.get("notice") else RETRY_S[min(failures, len(RETRY_S)) - 1]
            self.state.update(error=why, failures=failures, retry_at=self.clock() + delay,
                              pending={**job, "pid": None})  # redone as it was: the same files, staged
            newest = self.state.get("newest")
            self.say(f"checkpoint copy off the cluster failed ({why}); the previous copy stays the newest"
                     + (f"; tried again in {delay} s" if again else
                        f" (update {newest['update']}: {newest['where']})" if newest else " (none)"))
        self.save()

    def due(self, final: bool = False) -> dict | None:
        """The job to start now (checkpoint_last when its interval passed, or a notice's save is held, or
        the run ended (`final`), and a newer one exists; checkpoint_best when it changed), its files
        staged; None when nothing is due."""
        uploaded = self.state.get("uploaded", {})
        items, staged = [], []
        folder = Path(self.run_dir) / "checkpoints" / STAGED
        held = replica.manifest(self.run_dir)
        last_at = self.state.get("last_started", 0)
        soon = self.state.get("soon")
        soon = soon if soon and self.clock() <= soon["until"] else None
        now = final or (held and soon and held["update"] > soon["after"])
        if held and held["update"] > (uploaded.get("last") or {}).get("update", -1) \
                and (now or self.clock() - last_at >= float(self.config.get("every_s", 1800))):
            items.append(self.stage(folder, "last", replica.paths(self.run_dir)[1], held["update"],
                                    {"checkpoint_last.pt": held["sha256"]}, staged))
            self.state["last_started"] = self.clock()
            if now and soon:
                soon["after"] = held["update"]
                items[-1]["notice"] = True
                self.say(f"the save for {soon['why']} (update {held['update']}) goes off the cluster at once")
        best = Path(self.run_dir) / "checkpoints" / "checkpoint_best.pt"
        stamp = _stamp(best)
        # checkpoint_best at most once an interval too (it changes at most every validation; a copy of
        # GBs each time would fill the store and the link: 10 in 90 min at a 30-min interval before)
        best_due = final or self.clock() - self.state.get("best_started", 0) >= float(self.config.get("every_s", 1800))
        if stamp and stamp != (uploaded.get("best") or {}).get("stamp") and best_due:
            update = checkpoint_info.read(best, tries=1).get("update")
            if update is not None:
                items.append(self.stage(folder, "best", best, update, {}, staged) | {"stamp": stamp})
                self.state["best_started"] = self.clock()
        if not items:
            return None
        return {"id": f"{self.spec['run_id']}-{self.clock():.3f}", "url": self.config["url"],
                "run_id": self.spec["run_id"], "items": items, "staged": staged, "facts": self.facts(held),
                "notice": any(i.get("notice") for i in items)}

    def stage(self, folder: Path, kind: str, source: Path, update: int, expected: dict, staged: list) -> dict:
        folder.mkdir(parents=True, exist_ok=True)
        name = f"checkpoint_{kind}.pt"
        link = folder / name
        link.unlink(missing_ok=True)
        os.link(source, link)
        record = folder / f"run.{kind}.json"
        record.write_bytes((Path(self.run_dir) / "run.json").read_bytes() if (Path(self.run_dir) / "run.json")
                           .exists() else b"{}")
        staged += [str(link), str(record)]
        return {"kind": kind, "update": update, "files": {name: str(link), "run.json": str(record)},
                "expected": expected}

    def facts(self, held: dict | None) -> dict:
        """What a resume on fresh hosts needs beside the file: the run's model, data and batch."""
        run = read_json(Path(self.run_dir) / "run.json", {})
        members = self.members
        world = (self.spec.get("ranks") or {}).get(",".join(members)) or \
            len(run.get("hosts") or []) * int(run.get("ranks_per_host") or 1)
        update_freq = (self.spec.get("update_freq") or {}).get(",".join(members)) or run.get("update_freq")
        tokens = (run.get("max_tokens") or 0) * (update_freq or 1) * (world or 1) or None
        return {"host": self.spec["me"], "hosts": members, "preset": run.get("preset"), "dataset": run.get("dataset"),
                "world_size": world, "update_freq": update_freq, "max_tokens": run.get("max_tokens"),
                "tokens_per_update": tokens, "generation": (held or {}).get("generation"),
                "lineage": (held or {}).get("lineage")}

    def start(self, job: dict) -> None:
        _write_json(self.kdir / JOB, {k: v for k, v in job.items() if k != "pid"})
        (self.kdir / RESULT).unlink(missing_ok=True)
        log = (self.kdir / "offsite.log").open("ab")
        self.child = subprocess.Popen([sys.executable, "-m", "train.agent.offsite.upload", "upload", "--run",
                                       self.run_dir],
                                      stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=self.run_dir,
                                      start_new_session=True)  # `fab stop` signals the keeper's group: not it
        log.close()
        self.state["pending"] = {**job, "pid": self.child.pid, "started": self.clock()}
        self.save()
        kinds = ", ".join(f"checkpoint_{i['kind']} of update {i['update']}" for i in job["items"])
        self.say(f"copying {kinds} off the cluster to {job['url']} (pid {self.child.pid})")

    def soon(self, after: int | None, until: float, why: str) -> None:
        """A host's notice: rank 0 was asked to save now; each save newer than update `after` goes off the
        cluster at once until `until` (the notice's deadline, wall clock), whatever the interval: every VM
        may be gone soon after."""
        if self.config:
            self.state["soon"] = {"after": -1 if after is None else after, "until": until, "why": why}
            self.save()

    def closing(self) -> None:
        """The run ended: the final copies are to come (`finish`); `fab stop` on this host waits for them."""
        if self.config:
            self.state["closing"] = self.clock()
            self.save()

    def finish(self, members: list[str], ended: str) -> None:
        """The run ended (finished, stopped): before the keeper ends, the upload under way finishes and, on
        the generation's first host, its newest save (and a changed checkpoint_best) is copied off the
        cluster whatever the interval says; all within `final_s` (FINAL_S), then an upload still under way
        is stopped. Each step said in the keeper's log."""
        if not self.config:
            return
        self.members = list(members)
        bound = float(self.config.get("final_s", FINAL_S))
        deadline = time.monotonic() + bound
        try:
            job = self.state.get("pending")
            if job and job.get("pid"):
                self.wait(job, deadline, bound)
            if members[:1] != [self.spec["me"]] or time.monotonic() >= deadline:
                return
            job = self.due(final=True)
            newest = self.state.get("newest")
            if job is None:
                if newest:
                    self.say(f"the run {ended}: its newest save is off the cluster already (update "
                             f"{newest['update']}: {newest['where']})")
                return
            self.say(f"the run {ended}: its newest save goes off the cluster before the keeper ends "
                     f"(at most {bound:g} s)")
            self.start(job)
            self.wait(self.state["pending"], deadline, bound)
        except Exception as err:  # an upload's trouble never keeps the keeper from ending
            self.say(f"checkpoint copy off the cluster: {type(err).__name__}: {err}")
        finally:
            self.state["closing"] = None
            self.save()

    def wait(self, job: dict, deadline: float, bound: float) -> None:
        """The upload under way, finished and collected; or stopped at `deadline` (monotonic), said."""
        while self.running(job) and time.monotonic() < deadline:
            time.sleep(0.2)
        if self.running(job):
            kinds = ", ".join(f"checkpoint_{i['kind']} of update {i['update']}" for i in job["items"])
            self.say(f"the copy off the cluster of {kinds} did not finish within {bound:g} s: stopped")
            self.stop(job)
        self.collect(job, again=False)

    def stop(self, job: dict) -> None:
        """The upload under way ended (SIGTERM to its session), waited for 10 s at most."""
        try:
            os.killpg(job["pid"], signal.SIGTERM)  # its session: the uploader and what it started
        except OSError:
            with contextlib.suppress(OSError):
                os.kill(job["pid"], signal.SIGTERM)
        ends = time.monotonic() + 10
        while self.running(job) and time.monotonic() < ends:
            time.sleep(0.1)


def newest_copy(run_dir: str) -> dict:
    """What `fab status` shows of this host's uploads: the newest copy, the upload under way, the last
    error, and whether an ending keeper still makes its final copies (`closing`)."""
    state = read_json(Path(run_dir) / "keeper" / STATE, {})
    pending = state.get("pending") or {}
    alive = bool(pending) and uploader_alive(pending.get("pid"), run_dir)
    return {"newest": state.get("newest"), "error": state.get("error") or "",
            "uploading": [i["update"] for i in pending.get("items", [])] if alive else [],
            "closing": bool(state.get("closing"))}
