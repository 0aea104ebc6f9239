"""Provisioning tests: one lab provisioned once per module, shared by every test here.

The lab itself comes from the session fixture `lab` (tests/conftest.py: LAB_PREFIX, LAB_SUBNET,
always torn down). `provisioned` runs provision.yml on it once; the failure cases reuse that
state with --limit / --tags / -e instead of provisioning again.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from labtools import TOP, lab_cli

from lab.config import LabConfig

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
    code: Path | None = None
    first: Run | None = None

    def playbook(self, *args: str, timeout: float = 900) -> Run:
        """ansible-playbook provision.yml on this lab; reports go to a temporary directory."""
        start = time.monotonic()
        proc = subprocess.run(
            [ANSIBLE_PLAYBOOK, "-i", str(self.inventory), "provision.yml",
             "-e", f"tandem_report_dir={self.reports}", "-e", f"train_env_code_src={self.code}", *args],
            cwd=TOP, capture_output=True, text=True, timeout=timeout,
            env={**os.environ, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0"},
        )
        return Run(proc.returncode, proc.stdout + proc.stderr, time.monotonic() - start)

    def shape(self, rate: str) -> None:
        lab_cli("shape", rate, prefix=self.cfg.prefix)

    def testinfra_host(self, name: str):
        import testinfra

        return testinfra.get_host(f"ansible://{name}?ansible_inventory={self.inventory}")


@pytest.fixture(scope="module")
def provisioned(lab, tmp_path_factory) -> Provisioned:
    """The lab after one full provision.yml run (which must succeed)."""
    # testinfra's ansible backend runs ansible-inventory: the controller venv's bin must be on PATH.
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    # A snapshot of tandem's code, so that edits in the working tree during the tests do not
    # count as changes between the first and the second run.
    code = tmp_path_factory.mktemp("code")
    for package in ("train", "benchmarks"):
        shutil.copytree(TOP / package, code / package, ignore=shutil.ignore_patterns("__pycache__"))
    p = Provisioned(cfg=lab, inventory=lab.default_inventory, reports=tmp_path_factory.mktemp("provision"),
                    code=code)
    p.first = p.playbook()
    assert p.first.rc == 0, p.first.output[-6000:]
    return p
