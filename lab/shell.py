"""Running the commands the lab is made of, with errors that say what failed."""

from __future__ import annotations

import subprocess


class LabError(RuntimeError):
    """Something the user must fix; the message says what and how."""


def run(*args: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run(args, capture_output=True, text=True, input=input)
    if check and proc.returncode != 0:
        raise LabError(f"`{' '.join(args)}` failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def ok(*args: str) -> bool:
    return subprocess.run(args, capture_output=True).returncode == 0


def in_netns(netns: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return run("ip", "netns", "exec", netns, *args, check=check)
