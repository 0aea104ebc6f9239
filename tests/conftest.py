"""The lab, brought up once for the whole test session and always torn down.

LAB_PREFIX / LAB_SUBNET pick another lab (so two checkouts can test side by side);
TANDEM_KEEP_LAB=1 leaves it running afterwards for a look around.
"""

from __future__ import annotations

import os

import pytest
from labtools import Provisioned, lab_cli

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


@pytest.fixture(scope="session")
def provisioned(lab, tmp_path_factory) -> Provisioned:
    """The lab after one full provision.yml run (which must succeed), shared by the session.
    TANDEM_ASSUME_PROVISIONED=1 skips the run on a lab you provisioned yourself."""
    p = Provisioned(cfg=lab, inventory=lab.default_inventory, reports=tmp_path_factory.mktemp("provision"))
    if os.environ.get("TANDEM_ASSUME_PROVISIONED") != "1":
        p.first = p.playbook()
        assert p.first.rc == 0, p.first.output[-6000:]
    return p
