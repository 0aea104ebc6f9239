"""Helpers for tests that drive the lab the way a user does: its CLI, ssh."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from lab.config import LabConfig

TOP = Path(__file__).resolve().parent.parent


def wait_for(what, timeout: float = 40.0, every: float = 0.25):
    """`what()`'s first truthy value within `timeout` s; else an AssertionError naming it (its docstring)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := what():
            return value
        time.sleep(every)
    raise AssertionError(f"not within {timeout:.0f} s: {what.__doc__ or what}")


def as_at_a_terminal() -> None:
    """A child's `preexec_fn`: Ctrl-C (SIGINT) reaches it as from a terminal, even where the tests' own
    shell ignores SIGINT (started as a background job, `cmd &`: its children inherit the ignored signal,
    and Python keeps it ignored)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def lab_cli(*args: str, prefix: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "lab", "--prefix", prefix, *args],
                          cwd=TOP, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise AssertionError(f"lab {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc


def set_links(cfg: LabConfig, name: str, state: str) -> None:
    """Pull (state="down") or plug back ("up") every cable of `name`: both networks of a two-network host."""
    for link in cfg.links(name):
        subprocess.run(["ip", "link", "set", link, state], check=True)


def ssh(cfg: LabConfig, name: str, command: str, *, sudo: bool = False,
        user: str | None = None) -> subprocess.CompletedProcess:
    """Plain OpenSSH with host key checking on, as a user would connect: as the lab's login user (a cloud
    image's `debian`), or `user`. `sudo=True`: the command runs as root through `sudo -n` (what a
    test needs root on a host for: root's files, /opt/tandem, another user's processes)."""
    if sudo:
        command = f"sudo -n sh -c {shlex.quote(command)}"
    return subprocess.run(
        ["ssh", "-i", str(cfg.key), "-o", f"UserKnownHostsFile={cfg.known_hosts}",
         "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", f"{user or cfg.login_user}@{cfg.host_ip(name)}",
         command],
        capture_output=True, text=True, timeout=60,
    )


@contextmanager
def user_without_sudo(cfg: LabConfig, name: str = "nosudo"):
    """A second login user on every host, with the lab's key and no sudo (an image whose user sudo asks
    a password of, or a colleague's account): yields its name; removed afterwards."""
    key = cfg.key.with_suffix(".pub").read_text().strip()
    make = (f"useradd --create-home --shell /bin/bash {name} && install -d -m 700 -o {name} -g {name} "
            f"/home/{name}/.ssh && echo {shlex.quote(key)} > /home/{name}/.ssh/authorized_keys && "
            f"chown {name}: /home/{name}/.ssh/authorized_keys && chmod 600 /home/{name}/.ssh/authorized_keys")
    try:
        for host in cfg.names:
            made = ssh(cfg, host, make, sudo=True)
            assert made.returncode == 0, made.stderr
            assert ssh(cfg, host, "sudo -n true", user=name).returncode != 0, f"{name} has sudo on {host}"
        yield name
    finally:
        for host in cfg.names:
            ssh(cfg, host, f"pkill -u {name}; userdel --remove {name} 2>/dev/null", sudo=True)


ANSIBLE_PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")


@dataclass
class Run:
    rc: int
    output: str
    seconds: float

    def recap(self) -> dict[str, dict[str, int]]:
        """PLAY RECAP -> {host: {ok: .., changed: .., failed: .., ...}}."""
        hosts = {}
        for line in self.output.split("PLAY RECAP")[-1].splitlines():
            m = re.match(r"^(\S+)\s+:\s+(.*)$", line.strip())
            if m:
                hosts[m.group(1)] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(2))}
        return hosts


@dataclass
class Provisioned:
    cfg: LabConfig
    inventory: Path
    reports: Path
    code: Path | None = None  # a snapshot of train/ and benchmarks/ to install (default: the tree)
    first: Run | None = None

    def playbook(self, *args: str, timeout: float = 900) -> Run:
        """ansible-playbook provision.yml on this lab; reports go to a temporary directory."""
        start = time.monotonic()
        proc = subprocess.run(
            [ANSIBLE_PLAYBOOK, "-i", str(self.inventory), "provision.yml",
             "-e", f"tandem_report_dir={self.reports}",
             *(["-e", f"train_env_code_src={self.code}"] if self.code else []), *args],
            cwd=TOP, capture_output=True, text=True, timeout=timeout,
            env={**os.environ, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0"},
        )
        return Run(proc.returncode, proc.stdout + proc.stderr, time.monotonic() - start)

    def shape(self, rate: str) -> None:
        lab_cli("shape", rate, prefix=self.cfg.prefix)

    def testinfra_host(self, name: str):
        """testinfra through the inventory: as its login user, with sudo where the inventory has
        ansible_become (the lab's does, as a cloud inventory would)."""
        import testinfra

        return testinfra.get_host(f"ansible://{name}?ansible_inventory={self.inventory}")


FAB = str(Path(sys.executable).parent / "fab")


def processes(cfg: LabConfig, name: str, pattern: str) -> str:
    """The lines of `pgrep -af PATTERN` on a lab host, without pgrep's own shell."""
    out = ssh(cfg, name, f"pgrep -af '{pattern}' || true").stdout
    return "\n".join(line for line in out.splitlines() if "pgrep" not in line)


def fab(provisioned, *args: str, timeout: float = 900, check: bool = True,
        columns: int | None = 200) -> subprocess.CompletedProcess:
    """`fab ARGS` against the lab's inventory, as a user runs it. `columns=None`: no COLUMNS, as
    under `| tee` (rich then assumes 80)."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env["FABRIC_INVENTORY"] = str(provisioned.inventory)
    if columns:
        env["COLUMNS"] = str(columns)
    proc = subprocess.run([FAB, *args], cwd=TOP, capture_output=True, text=True, timeout=timeout, env=env)
    if check and proc.returncode != 0:
        raise AssertionError(f"fab {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc
