"""One host's keeper (train.agent.keeper.loop) in a run of three hosts or more, where the generation is
etcd's (train.agent.keeper.etcd): its etcd member, started or taken over; its rounds (a start `fab
train` asked for proposed once; the keeper holding etcd's `leader` lease decides and
compare-and-swaps the next generation); and its fence: a host cut off from etcd's majority for as
long as a peer takes to be declared lost stops its ranks, since the others go on without it."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from dataclasses import replace
from pathlib import Path

from train.agent.keeper import etcd
from train.agent.keeper.files import keeper_dir, say
from train.agent.keeper.generation import Generation
from train.agent.keeper.ranks import Ranks


class Fence:
    """Cut off from etcd's majority as long as a peer takes to be declared lost (`lost_after_s`): the
    others go on without this host, so its ranks stop instead of waiting in a collective (and, were
    the link back, meeting a newer generation's rendezvous)."""

    def __init__(self, ranks: Ranks, lost_after_s: float):
        self.ranks, self.lost_after_s = ranks, lost_after_s
        self.since: float | None = None  # ticks: etcd's majority out of reach since

    def cut_off(self, tick: float) -> None:
        """etcd's majority is out of reach at `tick` (monotonic)."""
        self.since = self.since if self.since is not None else tick
        if tick - self.since >= self.lost_after_s and self.ranks.alive():
            say(f"cut off from the run's majority for {tick - self.since:.0f} s: this host's ranks "
                f"of generation {self.ranks.active} stop (the others go on without it)")
            self.ranks.stop()

    def lifted(self) -> None:
        self.since = None


class Consensus:
    """The keeper's side of etcd's agreement: `agreed_now` says whether etcd answered this round."""

    def __init__(self, spec: dict, start: Generation | None, fence: Fence, ticks=time.monotonic, agreement=None):
        self.agreement = agreement or etcd.Agreement(spec)  # the fault simulator's store stands in for etcd
        self.fence, self.ticks = fence, ticks
        self.agreed_now = False  # etcd answered this round
        self.start_to_propose = start  # a start fab train asked for, proposed at the first round
        self.said_unavailable = ""
        self.leads_now = False
        self.followed_at: float | None = None  # ticks: the leader's last look at etcd's membership
        self.replace_after_s = float(spec.get("etcd_replace_after_s", max(60.0, 3 * fence.lost_after_s)))

    def agree(self, decide) -> Generation | None:
        """The generation to record, or None. `decide(agreed)`: the leader's next generation after etcd's
        `agreed` (train.agent.keeper.generation.decide), or None. A side cut off from etcd's majority learns
        nothing and starts no ranks (`agreed_now`)."""
        try:
            held = self.agreement.current()
            if self.start_to_propose is not None:
                start = self.start_to_propose
                if held.generation is None or held.generation.start != start.start:
                    start = replace(start, number=max(start.number, (held.generation.number if held.generation
                                                                     else 0) + 1))
                    if self.agreement.propose(start, held.revision):
                        say(f"start {start.start} proposed as generation {start.number}")
                    held = self.agreement.current()
                self.start_to_propose = None
            leads = self.agreement.leads()
        except etcd.Unavailable as err:
            self.agreed_now = False
            if not self.said_unavailable:
                say(f"etcd answers without a majority of the run's hosts from here: no ranks start ({err})")
            self.said_unavailable = str(err)
            self.fence.cut_off(self.ticks())
            return None
        if self.said_unavailable:
            say("etcd answers again")
        self.agreed_now, self.said_unavailable = True, ""
        self.fence.lifted()
        gen = held.generation
        self.leads_now = leads
        if not leads or gen is None:
            return gen
        decided = decide(gen)
        if decided is None:
            return gen
        try:
            if self.agreement.propose(decided, held.revision):
                return decided
        except etcd.Unavailable:
            pass
        return gen  # another generation was agreed meanwhile: the next round reads it


    def follow_hosts(self, heard: dict[str, float], me: str) -> None:
        """The leader, every 10 s: etcd's members follow the run's hosts (etcd.Agreement.follow). `heard`:
        each peer's last heartbeat (ticks); one unheard for `replace_after_s` (a minute, three times
        lost_after_s: a flapping link never churns the members) is gone."""
        tick = self.ticks()
        if not self.leads_now or (self.followed_at is not None and tick - self.followed_at < 10):
            return
        self.followed_at = tick
        live = {me} | {h for h, t in heard.items() if tick - t < self.fence.lost_after_s}
        gone = {h for h, t in heard.items() if tick - t >= self.replace_after_s}
        said = self.agreement.follow(live, gone)
        if said:
            say(said)


def etcd_member(run_dir: str, spec: dict) -> int | None:
    """This host's etcd member of the run (its data in RUN/keeper/etcd/, kept across restarts: Raft's
    log is the agreement's memory): started, or the one a killed keeper left running taken over.
    Its pid, or None where this host is no member now (etcd says so: `etcd.how_to_join`)."""
    kdir = keeper_dir(run_dir)
    data = kdir / "etcd" / etcd.start_key(spec)
    with contextlib.suppress(OSError, ValueError):
        pid = int((kdir / "etcd.pid").read_text())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        if str(data).encode() in cmdline:
            return pid  # left running by a keeper killed with SIGKILL: taken over
        if str(kdir / "etcd").encode() in cmdline:
            stop_etcd_member(pid)  # an earlier start's member left running: it holds the ports
    try:
        runs, joining = etcd.how_to_join(spec, (data / "member").exists())
    except etcd.Unavailable as err:
        say(f"etcd: this host's member cannot join the run's cluster yet ({err}): tried again soon")
        return None
    if not runs:
        return None
    for older in (kdir / "etcd").glob("*"):  # an earlier start's cluster: this start formed its own
        if older != data:
            shutil.rmtree(older, ignore_errors=True)
    data.parent.mkdir(exist_ok=True)
    binary = shutil.which("etcd") or "/usr/bin/etcd"
    if not os.path.exists(binary):
        say("etcd is not installed on this host: provisioning installs it (etcd-server); the run's agreement "
            "waits for a majority of its etcd members")
        return None
    if joining:  # a new member of the run's cluster: whatever data an older one of this host left is void
        shutil.rmtree(data, ignore_errors=True)
        say(f"etcd: this host joins the run's cluster as a new member ({joining})")
    log = (kdir / "etcd.log").open("ab")
    proc = subprocess.Popen(etcd.member_command(spec, str(data), binary, joining), stdin=subprocess.DEVNULL,
                            stdout=log, stderr=log)
    (kdir / "etcd.pid").write_text(str(proc.pid))
    say(f"etcd member of the run started (pid {proc.pid})")
    return proc.pid


def member_alive(pid: int) -> bool:
    """Whether this host's etcd member (a child of the keeper) still runs."""
    with contextlib.suppress(ChildProcessError):
        if os.waitpid(pid, os.WNOHANG)[0]:
            return False
    return Path(f"/proc/{pid}").exists()


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
