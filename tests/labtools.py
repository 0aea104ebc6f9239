"""Helpers for tests that drive the lab the way a user does: its CLI, ssh."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from lab.config import LabConfig

TOP = Path(__file__).resolve().parent.parent


def lab_cli(*args: str, prefix: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "lab", "--prefix", prefix, *args],
                          cwd=TOP, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise AssertionError(f"lab {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc


def ssh(cfg: LabConfig, name: str, command: str) -> subprocess.CompletedProcess:
    """Plain OpenSSH with host key checking on, as a user would connect."""
    return subprocess.run(
        ["ssh", "-i", str(cfg.key), "-o", f"UserKnownHostsFile={cfg.known_hosts}",
         "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", f"root@{cfg.host_ip(name)}", command],
        capture_output=True, text=True, timeout=60,
    )
