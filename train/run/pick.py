"""Which run a task acts on: without --run, the run the hosts started last; with it, this controller's
record of it (reports/<id>/run.json), else the hosts'.

`fab train` leaves its run record on every host it starts, beside the keepers' spec
(RUN/run.json, written again at each start), so that a run can be followed from anywhere: a
checkout that did not start it finds it on the hosts, copies the record into its own reports/
and says so in one line. Without --run every task asks the hosts which run they started last (the
newest spec or record any host holds) and acts on it; this checkout's latest (reports/latest) only
when it is that run, or when no host answers, or when no host holds it and it was made after the
hosts' newest start (a run started here whose record did not reach them). A teammate's newer run is
said in one line and becomes this checkout's latest.

The SSH side is one command on every host (`listing`): a line per run directory,

    run-20261126-080102<TAB>1795680062<TAB>{"run_id": "run-20261126-080102", "hosts": [...], ...}

(its id, the newest modification time of its keeper/spec.json and run.json in seconds since the
epoch, the record or nothing where a tandem before this one wrote none). Reading and choosing are
pure (`known_runs`, `choose`), tested on recorded answers.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime

from ..cluster import ClusterError, Host, require_reachable, run_all
from ..errors import OptionError
from ..hosts import paths
from ..recipe import record
from ..recipe.record import Run

LIST_TIMEOUT_S = 10


@dataclass(frozen=True)
class KnownRun:
    """A run the hosts know: when it last started there, its record (None: none on any host), who holds it."""

    run_id: str
    started: float  # seconds since the epoch: the newest spec or record of it on any host
    record: dict | None
    hosts: tuple[str, ...]
    held_by: str = ""  # the host whose record it is


def listing() -> str:
    """The shell line that lists a host's runs (the module docstring's format); nothing without RUNS_ROOT."""
    return (f"cd {shlex.quote(paths.RUNS_ROOT)} 2>/dev/null || exit 0; "
            "for d in */; do d=${d%/}; "
            '[ -f "$d/keeper/spec.json" ] || [ -f "$d/run.json" ] || continue; '
            'printf "%s\\t%s\\t" "$d" "$(stat -c %Y "$d/keeper/spec.json" "$d/run.json" 2>/dev/null '
            '| sort -n | tail -1)"; '
            '[ -f "$d/run.json" ] && tr -d "\\n" < "$d/run.json"; echo; done')


def known_runs(answers: dict[str, str]) -> list[KnownRun]:
    """The runs the hosts' answers name ({host: what `listing` printed}), newest first; each with the
    record of the host that started it last (a record that is not JSON counts as none)."""
    seen: dict[str, list[tuple[float, dict | None, str]]] = {}
    for host, said in answers.items():
        for line in said.splitlines():
            parts = line.split("\t", 2)
            if len(parts) < 2 or not parts[0]:
                continue
            try:
                started = float(parts[1])
            except ValueError:
                started = 0.0
            try:
                held = json.loads(parts[2]) if len(parts) == 3 and parts[2].strip() else None
            except ValueError:
                held = None
            seen.setdefault(parts[0], []).append((started, held if isinstance(held, dict) else None, host))
    runs = []
    for run_id, copies in seen.items():
        copies.sort(key=lambda c: c[0], reverse=True)
        held, held_by = next(((r, h) for _, r, h in copies if r is not None), (None, ""))
        runs.append(KnownRun(run_id, copies[0][0], held, tuple(h for _, _, h in copies), held_by))
    return sorted(runs, key=lambda r: (r.started, r.run_id), reverse=True)


def choose(run_id: str | None, runs: list[KnownRun], asked: list[str], silent: dict[str, str]) -> Run:
    """The run `run_id` names (None: the newest) among those the hosts know, as a record; raises saying
    what the hosts do know. `asked`: the hosts asked; `silent`: {host: why} of those that did not answer."""
    which = run_id or "(latest)"
    if silent and len(silent) == len(asked):
        try:
            require_reachable(silent)
        except ClusterError as err:
            raise ClusterError(f"no run {which} on this controller, and no host could be asked for it: {err}") from None
    found = next((r for r in runs if r.run_id == run_id), None) if run_id else (runs[0] if runs else None)
    unasked = f" ({', '.join(silent)} did not answer)" if silent else ""
    if found is None:
        named = [r.run_id if record.NAME.fullmatch(r.run_id) else repr(r.run_id) for r in runs[:3]]
        others = ", ".join(named) + (", ..." if len(runs) > 3 else "")
        where = f"on this controller nor on {', '.join(n for n in asked if n not in silent)}{unasked}"
        if run_id:
            raise OptionError("run", f"no run {run_id} {where}: the hosts know {others or 'none'}")
        raise ClusterError(f"no run {where}: start one with `fab train`")
    if not record.NAME.fullmatch(found.run_id):  # a folder tandem never makes: its name goes nowhere
        raise ClusterError(f"{found.held_by or found.hosts[0]}: a run folder in {paths.RUNS_ROOT} refused: expected "
                           f"{record.NAMED}, found {found.run_id!r}")
    if found.record is None:
        raise ClusterError(f"{found.run_id} is on {', '.join(found.hosts)}, without a run record there (a tandem "
                           f"before this one left it only on the controller that started it): follow it from "
                           f"there, or `fab stop` there and `fab train --run {found.run_id} --new` here")
    # read as user input: one host's record names the directories every host's commands act on
    record.check_record(found.record, f"{found.held_by}: {paths.RUNS_ROOT}/{found.run_id}/run.json", found.run_id)
    try:
        return Run(**found.record)
    except TypeError as err:  # a record of another tandem version: fields this one does not know
        raise ClusterError(f"{found.run_id}'s record on {found.held_by} is not one this tandem reads ({err}): "
                           "follow it from the controller that started it") from None


def asked(hosts: list[Host]) -> tuple[list[KnownRun], list[str], dict[str, str]]:
    """What the hosts know, asked of all at once (one SSH round): their runs newest first, the hosts
    asked, and {host: why} of those that did not answer."""
    said = run_all(hosts, listing(), timeout=LIST_TIMEOUT_S)
    silent = {name: str(r.error) if r.error is not None else r.why for name, r in said.items() if not r.ok}
    answers = {name: r.stdout for name, r in said.items() if r.ok}
    return known_runs(answers), [h.name for h in hosts], silent


def on_hosts(run_id: str | None, hosts: list[Host]) -> Run:
    """The run the hosts know by that id (None: the newest), asked of all at once."""
    return choose(run_id, *asked(hosts))


def here(run_id: str | None) -> bool:
    """Whether this controller holds that run's record (None: any latest run)."""
    return (record.REPORTS / (run_id or "latest") / "run.json").exists()


def started_since(mine: Run, runs: list[KnownRun]) -> KnownRun | None:
    """The run the hosts started after this checkout's latest, `mine` (None: mine is the newest they
    know, or they know none). A `mine` no host holds counts from when it was made: a run started here
    whose record did not reach the hosts is not older than what they hold."""
    if not runs or runs[0].run_id == mine.run_id:
        return None
    if not any(r.run_id == mine.run_id for r in runs) and runs[0].started <= made(mine):
        return None
    return runs[0]


def made(run: Run) -> float:
    """When the run was made, in seconds since the epoch (0 for a record without a readable time)."""
    try:
        return datetime.fromisoformat(run.created).timestamp()
    except (TypeError, ValueError):
        return 0.0


def find(run_id: str | None, hosts: list[Host], say: Callable[[str], object]) -> Run:
    """The run a task acts on, as the module says: a named one this controller holds, else the hosts'
    run of that name; unnamed, the run the hosts started last. A record taken from the hosts is copied to
    reports/<id>/ (and reports/latest) and `say`d in one line."""
    if run_id and here(run_id):
        return Run.load(run_id)
    if run_id or not here(None):
        return copied(on_hosts(run_id, hosts), say)
    mine = Run.load(None)
    runs, names, silent = asked(hosts)
    if (theirs := started_since(mine, runs)) is None:  # no host answering knows a newer one
        return mine
    run = choose(theirs.run_id, runs, names, silent)
    run.save()
    say(f"reports/latest is {mine.run_id}; the hosts started {run.run_id} since: acting on {run.run_id} "
        f"(--run {mine.run_id} for the other; its record copied to reports/{run.run_id})")
    return run


def resumable(hosts: list[Host], say: Callable[[str], object]) -> None:
    """Before `fab train` resumes "the latest run" (reports/latest): made the run the hosts started last,
    as `find` picks it and says it; nothing when neither this checkout nor a host knows a run (fab train
    then starts one)."""
    if here(None):
        find(None, hosts, say)
    elif (known := asked(hosts))[0]:
        copied(choose(None, *known), say)


def copied(run: Run, say: Callable[[str], object]) -> Run:
    """A run record found on the hosts, saved here and said."""
    run.save()
    say(f"{run.run_id} found on the hosts (started from another controller): its record copied to "
        f"reports/{run.run_id}")
    return run


def record_on_hosts(run: Run, hosts: list[Host]) -> list[str]:
    """The run record written on every host for another controller to find; `host: why` for each host
    that did not take it."""
    return run_all(hosts, record_line(run), timeout=LIST_TIMEOUT_S).problems()


def record_line(run: Run) -> str:
    """The shell line that writes the run record on a host: RUN/run.json, one line of JSON, whole or not at all."""
    path = shlex.quote(f"{run.remote_dir}/run.json")
    text = shlex.quote(json.dumps(asdict(run), separators=(",", ":")))
    return f"mkdir -p {shlex.quote(run.remote_dir)} && printf %s {text} > {path}.new && mv {path}.new {path}"
