"""The lab, brought up once for the whole test session and always torn down.

LAB_PREFIX / LAB_SUBNET pick another lab (so two checkouts can test side by side);
TANDEM_KEEP_LAB=1 leaves it running afterwards for a look around.
"""

from __future__ import annotations

import os

import pytest
from labtools import lab_cli

from lab.config import LabConfig


def pytest_collection_modifyitems(items):
    """Everything that needs the lab (root, namespaces) is marked `lab`: `pytest -m "not lab"`."""
    for item in items:
        if "lab" in item.fixturenames or "spare_lab" in item.fixturenames:
            item.add_marker(pytest.mark.lab)


@pytest.fixture(scope="session")
def lab():
    """A running lab: its LabConfig, with `inventory` pointing at the inventory it wrote."""
    if os.geteuid() != 0:
        pytest.skip("the lab needs root")
    prefix = os.environ.get("LAB_PREFIX", "tandem")
    cfg = LabConfig(subnet=os.environ.get("LAB_SUBNET", "10.77.0.0/24"), prefix=prefix)
    try:
        lab_cli("up", "--subnet", cfg.subnet, prefix=prefix)
        yield cfg
    finally:
        if os.environ.get("TANDEM_KEEP_LAB") != "1":
            lab_cli("down", prefix=prefix, check=False)
