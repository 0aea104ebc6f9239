"""Who restarts a run's keeper when it fails: systemd where it is the init, tandem's supervisor elsewhere.

On a VM (systemd is PID 1) `keeper launch` makes the keeper a transient systemd unit,
`tandem-keeper-RUN`, with `systemd-run`: Restart=on-failure after RestartSec, at most StartLimitBurst
failed starts in StartLimitIntervalSec (then the unit stays failed: `journalctl -u` says why), and
KillMode=process, so a keeper's restart never takes the training ranks with it (they run in the
unit's cgroup, in sessions of their own). As root (tandem-boot after a reboot) it is a system unit
running as the run's owner; as the login user a unit of that user's manager, which provisioning keeps
running without a login session (`loginctl enable-linger`, roles/common). Where systemd is not
the init (the lab's hosts, containers) or `systemd-run` fails, train.agent.keeper.loop.supervise does the
same in a process of its own: the same backoff and start limit, and the keeper starts a new
supervisor when its own is killed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

RESTART_SEC = 2
START_LIMIT_BURST, START_LIMIT_INTERVAL_S = 10, 600
UNIT_ENV = "TANDEM_KEEPER_UNIT"  # set in the keeper's environment when systemd supervises it


def systemd_is_init() -> bool:
    return Path("/run/systemd/system").is_dir() and shutil.which("systemd-run") is not None


def unit_name(run_dir: str) -> str:
    return "tandem-keeper-" + re.sub(r"[^A-Za-z0-9_.-]", "_", Path(run_dir).name)


def unit_command(run_dir: str, user: tuple[int, int] | None = None, keys: dict[str, str] | None = None,
                 as_root: bool = False, python: str = sys.executable) -> list[str]:
    """The systemd-run line that makes the run's keeper a supervised unit."""
    unit = unit_name(run_dir)
    argv = ["systemd-run", *([] if as_root else ["--user"]), "--unit", unit, "--collect", "--quiet",
            "--working-directory", run_dir,
            "-p", "Restart=on-failure", "-p", f"RestartSec={RESTART_SEC}",
            "-p", f"StartLimitBurst={START_LIMIT_BURST}", "-p", f"StartLimitIntervalSec={START_LIMIT_INTERVAL_S}",
            "-p", "KillMode=process",
            "-p", f"StandardOutput=append:{run_dir}/keeper/keeper.log",
            "-p", f"StandardError=append:{run_dir}/keeper/keeper.log",
            "--setenv", f"{UNIT_ENV}={unit}"]
    if as_root and user:
        argv += ["--uid", str(user[0]), "--gid", str(user[1])]
    for name in ("PATH", "PYTHONPATH", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"):
        if name in os.environ:
            argv += ["--setenv", f"{name}={os.environ[name]}"]
    for name, value in (keys or {}).items():  # the unit's environment: readable by its owner only
        argv += ["--setenv", f"{name}={value}"]
    return [*argv, python, "-m", "train.agent.keeper.loop", "run", "--run", run_dir]


def start_unit(run_dir: str, user: tuple[int, int] | None = None, keys: dict[str, str] | None = None) -> str | None:
    """Start the keeper as a systemd unit; None when it started, else why not (then the caller
    supervises it itself)."""
    as_root = os.geteuid() == 0
    subprocess.run(["systemctl", *([] if as_root else ["--user"]), "reset-failed", unit_name(run_dir)],
                   capture_output=True)  # a unit that gave up earlier (its start limit) may start again
    done = subprocess.run(unit_command(run_dir, user, keys, as_root), capture_output=True, text=True)
    return None if done.returncode == 0 else (done.stderr.strip() or f"systemd-run exited {done.returncode}")
