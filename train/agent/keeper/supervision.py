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

The experiment trackers' keys (train.agent.trainer.tracker) reach the unit through a file systemd
reads at each start (`EnvironmentFile=`), 0600 in the runtime directory (tmpfs: /run/user/UID, /run
as root): a `--setenv` would put them on systemd-run's command line, which every user of the host
can read in /proc while it runs.
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


def unit_command(run_dir: str, user: tuple[int, int] | None = None, key_file: Path | None = None,
                 as_root: bool = False, python: str = sys.executable) -> list[str]:
    """The systemd-run line that makes the run's keeper a supervised unit; `key_file`: the trackers'
    keys (write_key_file), read by systemd at each start (none there: the ranks log offline)."""
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
    for name in ("PATH", "PYTHONPATH"):
        if name in os.environ:
            argv += ["--setenv", f"{name}={os.environ[name]}"]
    if key_file is not None:
        argv += ["-p", f"EnvironmentFile=-{key_file}"]  # '-': a file gone (a reboot's tmpfs) is no failure
    return [*argv, python, "-m", "train.agent.keeper.loop", "run", "--run", run_dir]


def key_file_path(run_dir: str, as_root: bool, environ: dict[str, str] | None = None) -> Path:
    """Where the unit's keys wait for systemd: the runtime directory, in memory and the user's alone
    (as root /run/tandem); the run's keeper folder where there is none."""
    environ = os.environ if environ is None else environ  # type: ignore[assignment]
    name = f"{unit_name(run_dir)}.env"
    if as_root:
        return Path("/run/tandem") / name
    runtime = environ.get("XDG_RUNTIME_DIR") or f"/run/user/{os.geteuid()}"
    return Path(runtime) / name if Path(runtime).is_dir() else Path(run_dir) / "keeper" / name


def write_key_file(path: Path, keys: dict[str, str]) -> None:
    """`keys` as systemd's EnvironmentFile reads them (single quotes: every character literal),
    readable by the file's owner alone from its first byte."""
    for name, value in keys.items():
        if not re.fullmatch(r"[A-Z_][A-Z0-9_]*", name) or any(c in value for c in "'\n\r\0"):
            raise ValueError(f"{name}: a key systemd's environment file cannot hold as it is")
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        os.fchmod(fd, 0o600)  # a file left by an earlier launch keeps its own mode through O_CREAT
        f.write("".join(f"{name}='{value}'\n" for name, value in keys.items()))


def start_unit(run_dir: str, user: tuple[int, int] | None = None, keys: dict[str, str] | None = None) -> str | None:
    """Start the keeper as a systemd unit; None when it started, else why not (then the caller
    supervises it itself)."""
    as_root = os.geteuid() == 0
    subprocess.run(["systemctl", *([] if as_root else ["--user"]), "reset-failed", unit_name(run_dir)],
                   capture_output=True)  # a unit that gave up earlier (its start limit) may start again
    key_file = key_file_path(run_dir, as_root)
    try:
        if keys:
            write_key_file(key_file, keys)
        else:  # an earlier launch's keys go with it
            key_file.unlink(missing_ok=True)
    except (ValueError, OSError) as error:
        return f"the trackers' keys: {error}"
    done = subprocess.run(unit_command(run_dir, user, key_file if keys else None, as_root), capture_output=True,
                          text=True)
    return None if done.returncode == 0 else (done.stderr.strip() or f"systemd-run exited {done.returncode}")
