"""The training ranks of one host's keeper (train.agent.keeper.loop): started for a generation with the
command `fab train` built for its membership, how they are (running, finished, ended and why), and
which generation they belong to, kept in RUN/keeper/active.json across the keeper's restarts."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

from train.agent.keeper.files import keeper_dir, read_json, say, write_json
from train.agent.keeper.generation import (
    ENDED,
    FINISHED,
    IDLE,
    RUNNING,
    STOPPED,
    Checkpoint,
    Generation,
    lineage_after,
)
from train.agent.keeper.state import last_update, run_pids, tail
from train.agent.keeper.stop import stop as stop_ranks
from train.agent.trainer import tracker

DONE = "done training in"  # fairseq's last line on rank 0 (fairseq_cli/train.py)
RENDEZVOUS_PORTS = 4  # generations take turns on the run's port .. +3 (the firewall opens 29500-29510)
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


class Ranks:
    """This host's ranks: the generation they run (`active`, None before any), its hosts, where their
    log began when they started, and the lineage of the saves they make."""

    def __init__(self, run_dir: str, spec: dict):
        self.run_dir, self.spec, self.say = run_dir, spec, say
        self.me: str = spec["me"]
        self.file = keeper_dir(run_dir) / "active.json"
        saved = read_json(self.file, {})
        self.active: int | None = saved.get("active")
        self.members: list[str] = saved.get("members", [])
        self.log_offset: int = saved.get("log_offset", 0)
        self.lineage = tuple(tuple(step) for step in saved.get("lineage") or ())  # of the saves its ranks make
        self.started_for: str | None = saved.get("start")  # the `fab train` start they were recorded for
        self.stopped: bool = bool(saved.get("stopped"))  # this keeper stopped them (not a crash)

    def save(self, start: str | None = None) -> None:
        data = read_json(self.file, {})
        data.update({"active": self.active, "members": self.members, "log_offset": self.log_offset,
                     "stopped": self.stopped,
                     "lineage": [list(step) for step in self.lineage]})
        if start is not None:
            data["start"] = start
        write_json(self.file, data)

    def forget(self, start: str) -> None:
        """A new start of the run: nothing runs for it yet (a finished run resumed for more updates is
        not finished)."""
        self.active, self.members, self.log_offset, self.stopped = None, [], 0, False
        self.save(start=start)

    def running_members(self) -> list[str]:
        """The hosts of the generation this host's ranks belong to; none before any."""
        return self.members if self.active is not None else []

    def rank0_here(self) -> bool:
        return self.members[:1] == [self.me]

    def alive(self) -> list[int]:
        return run_pids(self.run_dir)

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

    def state(self) -> str:
        if self.alive():
            return RUNNING
        if self.active is None:
            return IDLE
        if self.rank0_here() and self.finished():
            return FINISHED
        return STOPPED if self.stopped else ENDED

    def how(self, state: str) -> str:
        return how_ranks_ended(tail(self.log(), 80)) if state == ENDED else ""

    def last_update(self) -> int | None:
        return last_update(self.log()) if self.rank0_here() else None

    def stop(self, mark: bool = False) -> None:
        """Stop this host's ranks. Ranks this keeper stopped (a fence, a new membership, `fab stop`) read
        as STOPPED, never as ENDED: only a crash spends the run's restart budget."""
        if self.active is not None and not self.stopped and self.alive():
            self.stopped = True
            self.save()
        self.end_processes(mark)

    def end_processes(self, mark: bool) -> None:
        stop_ranks(self.run_dir, mark=mark)

    def wait(self, seconds: float) -> None:
        """The run is done: this host's ranks end by themselves, or are stopped after `seconds`."""
        deadline = time.monotonic() + seconds
        while self.alive() and time.monotonic() < deadline:
            time.sleep(1)
        if self.alive():
            self.stop()

    def start(self, gen: Generation, checkpoint: Checkpoint | None) -> bool:
        """This host's ranks of generation `gen`, resuming from `checkpoint`; False when they could not start."""
        command = rendezvous_moved(self.spec["commands"][",".join(gen.members)][self.me], gen.number)
        if not self.launch(command):
            return False
        self.active, self.members, self.stopped = gen.number, list(gen.members), False
        self.lineage = lineage_after(checkpoint.to_dict() if checkpoint else None, gen.number, gen.members[0])
        return True

    def launch(self, command: str) -> bool:
        """Run the training command (it starts the ranks in the background); False when it failed."""
        try:
            self.log_offset = self.log().stat().st_size
        except OSError:
            self.log_offset = 0
        env = tracker.rank_environment(command, os.environ)
        if env.get("WANDB_MODE") == "offline" and "WANDB_MODE" not in os.environ:
            say("W&B logs offline (no key here: this keeper was started without the controller, e.g. at boot)")
        done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, env=env)
        if done.returncode != 0:
            say(f"could not start this host's ranks: {done.stderr.strip()[-300:]}")
            return False
        return True
