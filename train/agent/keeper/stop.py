"""Stop every process of a run on this host and confirm none is left.

    python -m train.agent.keeper.stop --run /data/tandem/runs/RUN [--wait 20]

Marks the run as stopped on purpose (RUN/stopped; the next start removes it), then SIGTERM to
every process that names the run's save directory (train.agent.keeper.state.run_pids),
up to `--wait` seconds for them to end, then SIGKILL. Prints one word: `none` (nothing was
running), `stopped` (ended on SIGTERM), `killed` (needed SIGKILL); exit 1 with `alive` when a
process outlived SIGKILL. A login user may signal only its own processes: a run another user
started (root, or a colleague on a shared VM) is named with its owners instead (exit 1), nothing
signalled.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pwd
import signal
import time

from train.agent.keeper.state import run_pids, save_dir


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):  # ended meanwhile
            os.kill(pid, sig)


def others(pids: list[int], proc: str = "/proc") -> dict[int, str]:
    """{pid: its user} of the processes this one may not signal (root may signal any)."""
    if os.geteuid() == 0:
        return {}
    out = {}
    for pid in pids:
        try:
            uid = os.stat(f"{proc}/{pid}").st_uid
        except OSError:  # ended meanwhile
            continue
        if uid != os.geteuid():
            try:
                out[pid] = pwd.getpwuid(uid).pw_name
            except KeyError:
                out[pid] = str(uid)
    return out


def not_ours(foreign: dict[int, str]) -> str:
    """What `stop` says of a run another user's processes make up, and what to do."""
    me = pwd.getpwuid(os.geteuid()).pw_name
    listed = ", ".join(f"pid {pid} ({user})" for pid, user in sorted(foreign.items()))
    return (f"another user's processes: {listed}; {me} may not signal them: stop the run as "
            f"{' or '.join(sorted(set(foreign.values())))}, or `sudo kill -- {' '.join(map(str, sorted(foreign)))}`")


STOPPED_MARK = "stopped"  # in the run's directory: `fab status` says "stopped by fab stop", not "died"


def monitor_pids(run_dir: str, proc: str = "/proc") -> list[int]:
    """The run's samplers (train.agent.measure.monitor --watch RUN/checkpoints), this user's."""
    wanted = f"--watch {save_dir(run_dir)}".encode()
    pids = []
    for entry in os.listdir(proc):
        try:
            with open(f"{proc}/{entry}/cmdline", "rb") as f:
                line = f.read().replace(b"\0", b" ")
        except (OSError, ValueError):
            continue
        if (b"train.agent.measure.monitor" in line and wanted in line
                and os.stat(f"{proc}/{entry}").st_uid == os.geteuid()):
            pids.append(int(entry))
    return pids


def stop(run_dir: str, wait_s: float = 20, poll_s: float = 0.1, mark: bool = True) -> str:
    """`mark`: the user asked (`fab stop`); the keeper stopping ranks for a new membership does not.
    The run's sampler ends with its ranks (it would see them gone within its interval, or, for ranks
    stopped before it first saw them, only after its start grace)."""
    try:
        return _stop(run_dir, wait_s, poll_s, mark)
    finally:
        if not run_pids(run_dir):
            with contextlib.suppress(OSError):
                _signal(monitor_pids(run_dir), signal.SIGTERM)


def _stop(run_dir: str, wait_s: float, poll_s: float, mark: bool) -> str:
    pids = run_pids(run_dir)
    if not pids:
        return "none"
    foreign = others(pids)
    if foreign:
        return not_ours(foreign)
    # a missing run directory still gets its processes stopped
    if mark:
        with contextlib.suppress(OSError), open(os.path.join(run_dir, STOPPED_MARK), "w") as f:
            f.write(time.strftime("%Y-%m-%dT%H:%M:%S%z\n"))
    _signal(pids, signal.SIGTERM)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if not run_pids(run_dir):
            return "stopped"
        time.sleep(poll_s)
    _signal(run_pids(run_dir), signal.SIGKILL)
    time.sleep(1)
    return "alive" if run_pids(run_dir) else "killed"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m train.agent.keeper.stop", description=__doc__.split("\n\n")[0])
    p.add_argument("--run", required=True, help="the run's directory on this host (/data/tandem/runs/RUN)")
    p.add_argument("--wait", type=float, default=20, help="seconds between SIGTERM and SIGKILL")
    args = p.parse_args(argv)
    outcome = stop(args.run, args.wait)
    print(outcome)
    return 0 if outcome in ("none", "stopped", "killed") else 1


if __name__ == "__main__":
    raise SystemExit(main())
