"""Provisioning tests: one lab provisioned once per module, shared by every test here.

The lab itself comes from the session fixture `lab` (tests/conftest.py: LAB_PREFIX, LAB_SUBNET,
always torn down). `provisioned` runs provision.yml on it once; the failure cases reuse that
state with --limit / --tags / -e instead of provisioning again.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
from labtools import TOP, Provisioned


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
