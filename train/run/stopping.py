"""`fab stop`: the run's keepers and ranks stopped on every host its keepers know, then what still trains
there, asked in the same SSH round (train.run.launch.stop), and one line naming the run and its hosts.

It never ends well while a host still trains: the run's own ranks left (a keeper that started them
again) fail it, naming the host; so do another run's ranks on those hosts when the user named no run
(`fab stop` then means "stop the training": a run this checkout did not pick still bills). With --run,
another run's ranks are said, not a failure: the user chose which run to stop.
"""

from __future__ import annotations

from collections.abc import Callable

from ..cluster import ClusterError, Host
from ..recipe.record import Run
from . import launch

SAID = {"stopped": "stopped", "killed": "killed (did not stop on SIGTERM)", "none": "was not running",
        "unreachable": "unreachable, and out of the run when this controller last heard; should it train "
                       "again, `fab stop` once it answers ends it"}


def stop(run: Run, hosts: list[Host], named: bool, say: Callable[[str], object]) -> launch.Stopped:
    """Stop `run` on `hosts` (the inventory's, or --hosts'), say each host's outcome and the run stopped;
    raises ClusterError (exit 1) naming a host that still trains, as the module says. `named`: the user
    gave --run."""
    known, spare = launch.to_stop(run, hosts)
    outcome = launch.stop(run, known, spare=spare)
    for name, what in outcome.items():
        left = "" if what == "unreachable" else "; " + (", ".join(
            f"{r} still trains here (pids {listed(pids)})" for r, pids in outcome.left.get(name, {}).items())
            or "no training process left")
        say(f"{name}: {SAID.get(what, what)}{left}")
    training = by_run(outcome.left)
    if own := training.pop(run.run_id, None):
        raise ClusterError(f"{run.run_id} still trains on {on(own)} after the stop (a keeper started its ranks "
                           "again?): `fab stop` again; `fab status` says which host runs what")
    lost = [name for name, what in outcome.items() if what == "unreachable"]
    said = f"stopped {run.run_id} on {', '.join(n for n in outcome if n not in lost)}" + (
        f" ({', '.join(lost)} unreachable)" if lost else "")
    if training and not named:
        raise ClusterError(f"{said}, but " + "; ".join(f"{r} still trains on {on(where)}: `fab stop --run {r}` stops "
                                                       "it" for r, where in training.items()))
    say(said)
    return outcome


def by_run(left: dict[str, dict[str, list[int]]]) -> dict[str, dict[str, list[int]]]:
    """{host: {run: pids}} turned into {run: {host: pids}}, runs in name order."""
    out: dict[str, dict[str, list[int]]] = {}
    for host, runs in left.items():
        for run_id, pids in runs.items():
            out.setdefault(run_id, {})[host] = pids
    return dict(sorted(out.items()))


def on(where: dict[str, list[int]]) -> str:
    """`v100a (pids 41, 42), v100b (pids 7)`."""
    return ", ".join(f"{host} (pids {listed(pids)})" for host, pids in where.items())


def listed(pids: list[int]) -> str:
    return ", ".join(map(str, pids))
