"""tandem is not limited to a pair: provision and train on a lab of three hosts."""

from __future__ import annotations

import os

import pytest
from labtools import Provisioned, lab_cli, ssh
from test_train import fab, latest_run_id, log_of, training_processes

from lab.config import LabConfig


@pytest.fixture(scope="module")
def three_hosts(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("the lab needs root")
    cfg = LabConfig(hosts=3, prefix="tdm3", subnet="10.82.0.0/24")
    try:
        lab_cli("up", "--hosts", "3", "--subnet", cfg.subnet, prefix=cfg.prefix)
        p = Provisioned(cfg=cfg, inventory=cfg.default_inventory, reports=tmp_path_factory.mktemp("three"))
        # The full verification runs on the pair; here what training needs.
        run = p.playbook("--skip-tags", "verify", "-e", "network_measure=false")
        assert run.rc == 0, run.output[-6000:]
        yield p
    finally:
        lab_cli("down", prefix=cfg.prefix, check=False)


def test_three_hosts_train_together(three_hosts):
    cfg = three_hosts.cfg
    assert "identical on every host (v100a, v100b, v100c)" in fab(three_hosts, "prepare-data").stdout
    out = fab(three_hosts, "train", "--new", "--set", "max_update=20").stdout
    assert "20/20" in out
    run_id = latest_run_id()
    assert "training on 3 devices" in log_of(cfg, "v100a", run_id)
    assert "initialized host v100c as rank 2" in log_of(cfg, "v100c", run_id)
    for name in cfg.names:
        assert training_processes(cfg, name) == [], name
    assert ssh(cfg, "v100c", f"test -s /data/tandem/runs/{run_id}/checkpoints/checkpoint_last.pt").returncode == 0
