"""Fixtures of the training tests beside the session's lab (tests/conftest.py): `three_hosts`, a lab
of three hosts (tdm3, 10.82.0.0/24) provisioned for training, brought up by each module that takes it
(the agreement's in `make test`, the older three-host runs in `make test-labs`)."""

from __future__ import annotations

import os

import pytest
from labtools import Provisioned, lab_cli, ssh

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


NEWEST_RUN = ("d=$(ls -td /data/tandem/runs/*/ 2>/dev/null | head -1); [ -n \"$d\" ] || exit 0; echo \"$d\"; "
              "cat \"$d/keeper/timeline.jsonl\" 2>/dev/null; tail -n 60 \"$d/keeper/keeper.log\" 2>/dev/null")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A lab test that fails says what each host's keeper recorded of the newest run (its timeline and
    the last lines of its log): a lab is torn down with its module, and CI keeps only what was printed."""
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    for name in ("data_ready", "three_hosts", "two_by_two", "provisioned"):
        lab = item.funcargs.get(name)
        if lab is None:
            continue
        for host in lab.cfg.names:
            try:
                said = ssh(lab.cfg, host, NEWEST_RUN).stdout
            except Exception as err:  # the report must never fail the report
                said = f"({type(err).__name__}: {err})"
            report.sections.append((f"keepers: {host}", said[-6000:]))
        return

