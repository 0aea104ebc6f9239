"""Fixtures of the training tests beside the session's lab (tests/conftest.py): `three_hosts`, a lab
of three hosts (tdm3, 10.82.0.0/24) provisioned for training, brought up by each module that takes it
(the agreement's in `make test`, the older three-host runs in `make test-labs`)."""

from __future__ import annotations

import os

import pytest
from labtools import Provisioned, lab_cli

from lab.config import LabConfig


@pytest.fixture(scope="module")
def three_hosts(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("the lab needs root")
    # LAB_THREE_PREFIX / LAB_THREE_SUBNET: another three-host lab (two checkouts testing side by side)
    cfg = LabConfig(hosts=3, prefix=os.environ.get("LAB_THREE_PREFIX", "tdm3"),
                    subnet=os.environ.get("LAB_THREE_SUBNET", "10.82.0.0/24"))
    try:
        lab_cli("up", "--hosts", "3", "--subnet", cfg.subnet, prefix=cfg.prefix)
        p = Provisioned(cfg=cfg, inventory=cfg.default_inventory, reports=tmp_path_factory.mktemp("three"))
        # The full verification runs on the pair; here what training needs.
        run = p.playbook("--skip-tags", "verify", "-e", "network_measure=false")
        assert run.rc == 0, run.output[-6000:]
        yield p
    finally:
        if os.environ.get("TANDEM_KEEP_LAB") != "1":  # as tests/conftest.py's lab
            lab_cli("down", prefix=cfg.prefix, check=False)
