"""Growing back: a host the run lost answers again, and the run grows back to it at its next checkpoint.

Two ways in, one procedure:

- `fab train` following an elastic run (`Watch`): every 15 s, in the background, it asks the
  hosts the run lost (Run.members) whether their sshd answers, with a 5 s timeout, so a host that
  is still gone never holds up the progress bar.
- `fab train --rejoin` (every host the run lost, back in its first membership's order), or
  `fab train --hosts v100a,v100b,v100c` naming hosts the run lost, on a run that trains on fewer:
  `grow_once`, then following as usual. On a run that is stopped it is a resume on more hosts
  (fabfile's train, with `membership_after` and `record`).

The procedure: a host that answers again gets the preflight every host gets before a start
(`preflight`: its leftover ranks of the run stopped, then preflight.probe + preflight.check against the
current rank 0: the pinned packages, torch/fairseq, the dataset's checksum, free disk, the same
versions). Once it passes, tandem waits for rank 0's next checkpoint (`due`: saved at an update
after the last one seen), stops the run (launch.stop), shares that checkpoint with every host from
the current rank 0 (checkpoints.share_checkpoint: the joiner's own copy is stale) and restarts the run
on the hosts in the order they first trained in (rank 0 is the run's first rank 0 again), with
`--update-freq` scaled back to the effective batch the run started with (elastic.scaled_update_freq
from the first membership's ranks: 2 hosts × 2 ranks → 1 × 2 at update-freq 2 → 2 × 2 at update-freq
1). The membership gets an entry (why: "v100c rejoined at update 60") and one line is said:

    v100c is back: growing to v100a, v100b, v100c from update 60, update-freq 1

The pure parts (which hosts to ask, the order, when to grow, the update-freq, the entry, the line)
take data and return data: tests/unit/train/run/test_rejoin.py.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from ..cluster import ClusterError, Host, connect
from ..report import logparse
from . import batching, checkpoints, launch
from . import preflight as host_checks
from .elastic import scaled_update_freq
from .record import Run

CHECK_EVERY_S = 15.0  # how often a follower asks the hosts the run lost (a connect, bounded: cheap)
SSH_TIMEOUT_S = 5.0  # how long one such question may take


def _trained(members: Sequence[dict] | None) -> list[str]:
    """Every host of every membership (and every host an entry says was lost), in the order they
    first trained in."""
    out: list[str] = []
    for entry in members or []:
        for name in [*entry.get("hosts", []), *(entry.get("lost") or [])]:
            if isinstance(name, str) and name not in out:
                out.append(name)
    return out


def lost_hosts(members: Sequence[dict] | None, current: Sequence[str]) -> list[str]:
    """The hosts the run lost and does not train on now, in the order they first trained in.

    >>> m = [{"hosts": ["v100a", "v100b", "v100c"], "from_update": 0, "why": "start"},
    ...      {"hosts": ["v100a", "v100b"], "from_update": 30, "lost": ["v100c"], "why": "..."}]
    >>> lost_hosts(m, ["v100a", "v100b"])
    ['v100c']
    """
    return [n for n in _trained(members) if n not in current]


def grown_hosts(members: Sequence[dict] | None, current: Sequence[str], joining: Sequence[str]) -> list[str]:
    """The hosts after a rejoin, in rank order: the order they first trained in (so the run's first
    rank 0 is rank 0 again), then any the membership never had."""
    wanted = [*current, *(n for n in joining if n not in current)]
    order = _trained(members)
    return [n for n in order if n in wanted] + [n for n in wanted if n not in order]


def grown_update_freq(members: Sequence[dict] | None, update_freq: int, ranks_now: int, ranks_after: int,
                      ranks_per_host: int = 1) -> int:
    """The update-freq on `ranks_after` ranks that gives back the effective batch the run started
    with: its first membership's ranks × update-freq (elastic.scaled_update_freq: rounded up,
    never a smaller batch). A first entry without `ranks` (recorded before hosts ran several):
    its hosts × `ranks_per_host`. A run whose first entry has no update-freq (tandem recorded none
    before rejoins existed): the current scaling undone, rounded down, at least 1."""
    first = (members or [None])[0]
    if isinstance(first, dict) and isinstance(first.get("update_freq"), int) and first.get("hosts"):
        ranks = first.get("ranks") if isinstance(first.get("ranks"), int) else len(first["hosts"]) * ranks_per_host
        return scaled_update_freq(first["update_freq"], ranks, ranks_after)
    return max(1, update_freq * ranks_now // max(1, ranks_after))


def membership_after(run: Run, joining: Sequence[str], ranks_per_host: int = 1) -> tuple[list[str], int]:
    """The hosts (rank order) and update-freq of `run` once `joining` are back; every host runs
    `ranks_per_host` ranks (train.run.preflight refuses hosts that differ)."""
    names = grown_hosts(run.members, run.hosts, joining)
    scaled = grown_update_freq(run.members, run.update_freq, len(run.hosts) * ranks_per_host,
                               len(names) * ranks_per_host, ranks_per_host)
    return names, batching.update_freq_for(run, len(names) * ranks_per_host, scaled)  # the recipe's batch


def due(progress: logparse.Progress | None, since: int | None) -> bool:
    """Grow now: rank 0 saved a checkpoint after update `since` (the last save seen when the
    joining hosts passed their preflight; None: none seen yet) and the run has updates left."""
    if progress is None or progress.saved is None or progress.finished:
        return False
    if since is not None and progress.saved <= since:
        return False
    return progress.max_update is None or progress.saved < progress.max_update


def entry(hosts: list[str], joined: list[str], at: int, update_freq: int, when: float | None = None,
          ranks: int | None = None) -> dict:
    """The membership entry of a rejoin (train.report.members reads it as a join); `ranks`: the
    world size it trains in (default one rank a host)."""
    return {"hosts": list(hosts), "from_update": at, "why": f"{', '.join(joined)} rejoined at update {at}",
            "joined": list(joined), "update_freq": update_freq, "ranks": len(hosts) if ranks is None else ranks,
            "time": round(time.time() if when is None else when, 1)}


def line(joined: list[str], hosts: list[str], at: int, update_freq: int, ranks: int | None = None) -> str:
    """What tandem says when the run grows back (`ranks`: said where hosts run several)."""
    return (f"{', '.join(joined)} {'is' if len(joined) == 1 else 'are'} back: growing to {', '.join(hosts)} "
            f"from update {at:,}, update-freq {update_freq}"
            + (f" ({ranks} ranks)" if ranks is not None and ranks != len(hosts) else ""))


def record(run: Run, joining: Sequence[str], at: int, ranks_per_host: int = 1) -> str:
    """Grow `run`'s membership by `joining` from update `at` (the entry, its hosts and update-freq;
    not saved, nothing started); returns the line to say. Every host runs `ranks_per_host` ranks."""
    names, update_freq = membership_after(run, joining, ranks_per_host)
    joined = [n for n in names if n not in run.hosts]
    if not run.members:
        run.members.append({"hosts": list(run.hosts), "from_update": 0, "why": "start",
                            "update_freq": run.update_freq, "ranks": len(run.hosts) * ranks_per_host})
    run.members.append(entry(names, joined, at, update_freq, ranks=len(names) * ranks_per_host))
    run.hosts, run.update_freq = names, update_freq
    return line(joined, names, at, update_freq, len(names) * ranks_per_host)


def answering(hosts: Sequence[Host], timeout_s: float = SSH_TIMEOUT_S) -> list[Host]:
    """Those of `hosts` whose sshd runs a no-op within `timeout_s`, asked in parallel."""

    def one(host: Host) -> bool:
        try:
            with connect(host, timeout=timeout_s) as conn:
                return conn.run("true", hide=True, warn=True, in_stream=False, timeout=timeout_s).ok
        except Exception:  # refused, timed out, reset: not back yet
            return False

    if not hosts:
        return []
    with ThreadPoolExecutor(max_workers=len(hosts)) as pool:
        back = list(pool.map(one, hosts))
    return [h for h, ok in zip(hosts, back, strict=True) if ok]


def preflight(run: Run, current: Sequence[Host], joining: Sequence[Host]) -> list[str]:
    """Why `joining` cannot rejoin `run`, each problem naming its host ([]: they can). Ranks of the
    run left on them from before the loss are stopped first (their heartbeat ends them; this makes
    sure); then preflight.probe and preflight.check with the current rank 0 as the reference for the
    dataset and the versions (its own rank, running, is no problem here)."""
    try:
        launch.stop(run, list(joining))
        answers = host_checks.probe(run, [current[0], *joining])
    except ClusterError as err:
        return [str(err)]
    names = {h.name for h in joining}
    return [p for p in host_checks.check(run, [current[0], *joining], answers, reference=current[0].name)
            if p.split(":", 1)[0] in names]


def grow(run: Run, current: Sequence[Host], joining: Sequence[Host], say: Callable[[str], None] = print
         ) -> list[Host]:
    """Stop `run` (rank 0 just saved a checkpoint), share that checkpoint and restart on `current` +
    `joining`; returns the hosts it trains on now. Where the joining hosts fail on the way (gone
    again), the run restarts on `current`, and says so."""
    by_name = {h.name: h for h in [*current, *joining]}
    try:
        launch.stop(run, list(current))
    except ClusterError as err:  # a host of the run is the one gone now: train.run.elastic's turn
        say(f"could not stop the run to grow back to {', '.join(h.name for h in joining)}: {err}")
        return list(current)
    before = (list(run.hosts), run.update_freq, len(run.members), run.max_tokens)
    try:
        copy = checkpoints.share_checkpoint(run, [*current, *joining])  # from the current rank 0
        said = record(run, [h.name for h in joining], checkpoints.checkpoint_update(copy) if copy else 0,
                      current[0].ranks)
        run.save()
        hosts = [by_name[n] for n in run.hosts]
        launch.start(run, hosts)
    except ClusterError as err:
        run.hosts, run.update_freq, run.members[:] = before[0], before[1], run.members[:before[2]]
        run.max_tokens = before[3]
        run.save()
        checkpoints.share_checkpoint(run, list(current))
        launch.start(run, list(current))
        say(f"could not grow back to {', '.join(h.name for h in joining)} ({err}); going on on "
            f"{', '.join(run.hosts)}")
        return list(current)
    say(said)
    return hosts


def grow_once(run: Run, current: Sequence[Host], joining: Sequence[Host],
              say: Callable[[str], None] = print, poll_s: float = 2.0) -> list[Host] | None:
    """`fab train --rejoin` on a run training on fewer hosts: the joining hosts' preflight
    (ClusterError naming the problems), then wait for rank 0's next checkpoint and grow. None when
    the run stopped before it saved one."""
    problems = preflight(run, current, joining)
    if problems:
        raise ClusterError("cannot rejoin, the run goes on as it is:\n  " + "\n  ".join(problems))
    since: int | None = None
    first = True
    while True:
        states = launch.states(run, list(current))
        progress = states[0].progress
        if first:
            since, first = (progress.saved if progress else None), False
            after = f" (after update {since:,})" if since is not None else ""
            say(f"{', '.join(h.name for h in joining)} passed the preflight; growing back at {run.hosts[0]}'s "
                f"next checkpoint{after}")
        elif due(progress, since):
            return grow(run, current, joining, say)
        if not any(s.running for s in states):
            return None
        time.sleep(poll_s)


class Watch:
    """A follower's eye on the hosts the run lost (the module's docstring): `step` on every poll."""

    def __init__(self, run: Run, known: Sequence[Host], say: Callable[[str], None] = print,
                 every_s: float = CHECK_EVERY_S, timeout_s: float = SSH_TIMEOUT_S) -> None:
        self.run, self.known, self.say = run, list(known), say
        self.every_s, self.timeout_s = every_s, timeout_s
        self.ready: list[Host] = []  # back, preflight passed: growing at the next checkpoint
        self.since: int | None = None
        self._asked_at = time.monotonic()
        self._asking: threading.Thread | None = None
        self._back: list[Host] = []
        self._said: set[str] = set()

    def gone(self, hosts: Sequence[Host]) -> list[Host]:
        """The hosts the run lost that the inventory has."""
        lost = lost_hosts(self.run.members, [h.name for h in hosts])
        return [h for h in self.known if h.name in lost]

    def step(self, hosts: Sequence[Host], progress: logparse.Progress | None) -> list[Host] | None:
        """Called while every rank of the run trains on `hosts`; returns the hosts after growing
        back, else None (nothing to do yet)."""
        if self.ready:
            if not due(progress, self.since):
                return None
            joining, self.ready = [h for h in self.ready if h.name not in {x.name for x in hosts}], []
            return grow(self.run, hosts, joining, self.say) if joining else None
        if self._asking is not None:
            if self._asking.is_alive():
                return None
            self._asking, back, self._back = None, self._back, []
            if back:
                self.ready, self.since = back, progress.saved if progress else None
                after = f" (after update {self.since:,})" if self.since is not None else ""
                self.say(f"{', '.join(h.name for h in back)} answers again and passed the preflight; growing "
                         f"back at the next checkpoint{after}")
            return None
        gone = self.gone(hosts)
        if gone and time.monotonic() - self._asked_at >= self.every_s:
            self._asked_at = time.monotonic()
            self._asking = threading.Thread(target=self._ask, args=(list(hosts), gone), daemon=True, name="rejoin")
            self._asking.start()
        return None

    def _ask(self, hosts: list[Host], gone: list[Host]) -> None:
        back = answering(gone, self.timeout_s)
        if not back:
            return
        problems = preflight(self.run, hosts, back)
        for problem in problems:
            if problem not in self._said:  # once each, not at every ask
                self._said.add(problem)
                self.say(f"back but not rejoining: {problem}")
        named = {p.split(":", 1)[0] for p in problems}  # a problem naming no host of `back` holds them all
        self._back = [] if named - {h.name for h in back} else [h for h in back if h.name not in named]
