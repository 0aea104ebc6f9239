"""A run's processes on the cluster: each host's command, start, state, stop.

`train.run.command` builds each host's command; this module only moves it between machines.
The run record is train.recipe.record, the preflight train.run.preflight, checkpoints
train.run.checkpoints.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from ..cluster import ClusterError, Host, connect, rank_layout, ranks_label, run_all, run_each
from ..hosts import paths
from ..hosts.remote import agent_command, train_threads, venv_of
from ..recipe import logformat
from ..recipe.presets import Preset
from ..recipe.record import Run
from . import command
from .preflight import answer


def launches_for(run: Run, hosts: list[Host]) -> list[command.Launch]:
    return command.launches(
        run.run_id,
        [{"address": h.cluster_address, "gpus": h.gpus, "ranks": h.ranks, "nic": h.nic or "",
          "threads": train_threads(h)} for h in hosts],
        master_port=run.master_port, data_dir=run.data_dir, run_dir=run.remote_dir,
        venv=venv_of(hosts[0]), update_freq=run.update_freq, precision=run.precision, comm=run.comm,
    )


def host_commands(run: Run, hosts: list[Host], preset: Preset | None = None) -> dict[str, str]:
    """Each host's exact training command: what `--dry-run` prints and `start` runs. `preset`: the
    run's, already resolved (train.run.start); default: resolved here."""
    preset = preset or run.resolved_preset()
    pairs = zip(hosts, launches_for(run, hosts), strict=True)
    return {h.name: command.training_command(preset, launch) for h, launch in pairs}


def start(run: Run, hosts: list[Host]) -> None:
    commands = host_commands(run, hosts)
    problems = run_each(hosts, commands).problems()
    if problems:
        stop(run, hosts)
        raise ClusterError("could not start every rank (the others were stopped):\n  " + "\n  ".join(problems))


def read_log(host: Host, run: Run, lines: int = 5000) -> str:
    with connect(host) as conn:
        result = conn.run(f"tail -n {int(lines)} {shlex.quote(run.remote_dir + '/train.log')} 2>/dev/null", hide=True,
                          warn=True, in_stream=False)
    return result.stdout


@dataclass
class HostState:
    name: str
    running: bool
    reachable: bool
    progress: logformat.Progress | None
    tail: list[str]
    error: str | None = None
    ended: logformat.RankEnd | None = None  # torchrun's word on a rank that failed
    stopped_by_user: bool = False  # `fab stop` ended it (train.agent.keeper.stop's mark)
    ranks: str = ""  # the global ranks this host runs: "0", "2-3" (train.cluster.ranks_label)
    keeper: dict | None = None  # what its keeper knows (train.agent.keeper.loop.show): generation, timeline, ended

    def describe(self, finished: bool) -> str:
        """This rank's state in a word or three: running, finished, stopped by fab stop, died: how."""
        if not self.reachable:
            return "unreachable"
        if self.running:
            return "running"
        if finished:
            return "finished"
        if self.stopped_by_user:
            return "stopped by fab stop"
        return f"died: {self.ended.how}" if self.ended else "stopped"


def states(run: Run, hosts: list[Host]) -> list[HostState]:
    """Each host's train.agent.keeper.state: its processes alive?, and its log's last lines parsed."""
    # a host whose sshd answers but hangs (frozen VM) must not hold up `fab status`: 15 s at most
    state = agent_command(hosts[0], "keeper.state", "--run", run.remote_dir, "--tail", 400)
    results = run_all(hosts, state, timeout=15)
    out = []
    for host, span in zip(hosts, rank_layout([h.ranks for h in hosts]), strict=True):
        result = results[host.name]
        said = answer(result) if result.reachable else None
        if said is None:
            why = result.error if not result.reachable else f"no answer: {result.stderr.strip()[-300:]}"
            out.append(HostState(host.name, False, result.reachable, None, [], error=str(why), ranks=ranks_label(span)))
            continue
        log = said["tail"]
        prog = logformat.progress(logformat.parse_log(log), run.max_update) if log else None
        out.append(HostState(host.name, said["running"], True, prog, logformat.meaningful(log)[-8:],
                             ended=logformat.rank_end(log), stopped_by_user=bool(said.get("stopped_by_user")),
                             ranks=ranks_label(span), keeper=said.get("keeper")))
    return out


def to_stop(run: Run, hosts: list[Host]) -> tuple[list[Host], frozenset[str]]:
    """The hosts `fab stop` tells: every one of `hosts` the run's keepers know (its record's `order`), not
    only those the record names (a host taken back after `fab train --rejoin` trains before the record
    hears of it); and those of them it may have lost (`stop`'s `spare`: unreachable is no error there)."""
    known, training = run.known_of(hosts), {h.name for h in run.hosts_of(hosts)}
    return known, frozenset(h.name for h in known) - training


LEFT_MARK = "--- training processes left"  # in stop's answer: what follows is still_training()'s


def still_training() -> str:
    """The shell line that lists this host's training processes of any run, `PID COMMAND LINE` each (a rank
    names its run's save dir; train.agent.keeper.state.run_pids); `[-]` keeps the shell running it from
    matching itself."""
    return f"pgrep -af -- {shlex.quote('[-]-save-dir ' + paths.RUNS_ROOT + '/')} || true"


def left_runs(listed: str) -> dict[str, list[int]]:
    """{run id: pids} of what still_training() printed."""
    rank = re.compile(rf"^(\d+) .*?--save-dir {re.escape(paths.RUNS_ROOT)}/([^/\s'\"]+)")
    out: dict[str, list[int]] = {}
    for line in listed.splitlines():
        if found := rank.match(line.strip()):
            out.setdefault(found[2], []).append(int(found[1]))
    return out


class Stopped(dict[str, str]):
    """stop's {host: stopped|killed|none|unreachable}, with what still trained on each host it reached
    right after (`left`: {host: {run id: pids}}), asked in the same SSH round."""

    left: dict[str, dict[str, list[int]]]

    def __init__(self, outcome=(), left: dict[str, dict[str, list[int]]] | None = None):
        super().__init__(outcome)
        self.left = left or {}


def stop(run: Run, hosts: list[Host], wait_s: float = 20, spare: frozenset[str] = frozenset()) -> Stopped:
    """Stop every rank on every host (train.agent.keeper.stop: every process naming the run's save dir);
    confirm none is left, then list each host's training processes of any run (Stopped.left). Returns
    {host: stopped|killed|none|unreachable}; raises naming the hosts that could not be reached or stopped,
    but for those in `spare` (hosts the run may have lost: one that cannot be reached is reported
    "unreachable", not an error)."""
    # the keeper first (it would start the ranks again), told on every host: its peers hear it too
    stop_keeper = agent_command(hosts[0], "keeper.loop", "stop", "--run", run.remote_dir, "--wait", f"{wait_s:g}")
    then_left = f"{stop_keeper}; said=$?; echo {shlex.quote(LEFT_MARK)}; {still_training()}; exit $said"
    results = run_all(hosts, then_left, timeout=wait_s + 30)
    outcome, left, problems = Stopped(), {}, []
    for host in hosts:
        result = results[host.name]
        word, _, listed = result.stdout.partition(LEFT_MARK)
        if not result.reachable and host.name in spare:
            outcome[host.name] = "unreachable"
        elif not result.reachable:
            problems.append(f"{host.name}: unreachable ({result.error}); its ranks may still run")
        elif not result.ok:
            said = word.strip() or result.stderr.strip()[-300:]
            problems.append(f"{host.name}: training processes still alive after SIGKILL ({said})" if said == "alive"
                            else f"{host.name}: could not stop its ranks: {said}")
        else:
            outcome[host.name] = word.strip()
            left[host.name] = left_runs(listed)
    if problems:
        raise ClusterError("stop incomplete:\n  " + "\n  ".join(problems))
    outcome.left = left
    return outcome
