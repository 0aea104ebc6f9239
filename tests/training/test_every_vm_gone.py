"""Every VM of a run gone, disks included: the run goes on on two fresh VMs (other addresses) from the
copies its hosts uploaded to a bucket, and its loss goes on from where it was.

The bucket is an S3-compatible server on a storage host of its own (tests/training/storage_host.py:
moto's server, the one s3fs's own test suite runs against; the real S3 code path, botocore's requests
over the lab's network, with the endpoint and credentials in each host's ~/.aws). A lab of its own:
`make test-labs` (docs/lab.md has its last figures)."""

from __future__ import annotations

import json
import os
import shutil
import time

import pytest
from labtools import TOP, Provisioned, fab, lab_cli, ssh, wait_for
from storage_host import StorageHost
from test_train import QUICK_HEARTBEAT, inner_records, log_of

from lab.config import LabConfig

pytestmark = pytest.mark.own_lab

PREFIX = os.environ.get("LAB_GONE_PREFIX", "tdmgone")
SUBNETS = ("10.83.0.0/24", "10.84.0.0/24")  # the first VMs', then the fresh ones' (other addresses)
BUCKET = "tandem-runs"
URL = f"s3://{BUCKET}/lab"
SETTINGS = f"max_update=100000,save_interval_updates=25,max_tokens=1024,{QUICK_HEARTBEAT}"


def provisioned_lab(subnet: str, reports) -> Provisioned:
    cfg = LabConfig(hosts=2, prefix=PREFIX, subnet=subnet)
    lab_cli("up", "--hosts", "2", "--subnet", subnet, prefix=PREFIX)
    lab = Provisioned(cfg=cfg, inventory=cfg.default_inventory, reports=reports)
    run = lab.playbook("--skip-tags", "verify", "-e", "network_measure=false")
    assert run.rc == 0, run.output[-6000:]
    return lab


def give_the_hosts_the_bucket(lab: Provisioned, store: StorageHost) -> None:
    for name in lab.cfg.names:
        made = ssh(lab.cfg, name, store.aws_config())
        assert made.returncode == 0, f"{name}: {made.stderr}"


def copies(store: StorageHost, run_id: str) -> list[dict]:
    """The manifests of the run's copies of checkpoint_last in the bucket, newest first."""
    keys = [k for k in store.objects(BUCKET) if k.endswith("/manifest.json") and f"/{run_id}/u" in k]
    found = [json.loads(store.read(k)) for k in keys]
    return sorted(found, key=lambda m: m["update"], reverse=True)


def loss_at(records: list[dict], update: int) -> float:
    return float(min(records, key=lambda r: abs(int(r["num_updates"]) - update))["loss"])


def test_a_run_whose_vms_are_all_gone_goes_on_on_fresh_vms_from_its_bucket(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("the lab needs root")
    store = StorageHost(f"{PREFIX}st")
    try:
        first = provisioned_lab(SUBNETS[0], tmp_path_factory.mktemp("first"))
        store.start(first.cfg)
        store.make_bucket(BUCKET)
        give_the_hosts_the_bucket(first, store)
        fab(first, "prepare-data")
        run_id = time.strftime("run-gone-%Y%m%d-%H%M%S")
        started = fab(first, "train", "--new", "--detach", "--run", run_id, "--checkpoints-to", URL,
                      "--checkpoints-every", "0.5", "--set", SETTINGS).stdout
        assert URL in started, started  # fab train says where the copies go

        def a_copy_past_update_50():
            """a whole copy of update 50 or later in the bucket"""
            held = copies(store, run_id)
            return held[0] if held and held[0]["update"] >= 50 else None

        copy = wait_for(a_copy_past_update_50, timeout=600, every=5)
        shown = fab(first, "status", "--run", run_id).stdout
        assert URL in shown, shown  # fab status shows the newest off-cluster copy
        before = inner_records(log_of(first.cfg, "v100a", run_id))
        at_copy, at_start = loss_at(before, copy["update"]), float(before[0]["loss"])
        print(f"copy of update {copy['update']} in the bucket; loss {at_start:.2f} at update "
              f"{before[0]['num_updates']}, {at_copy:.2f} at the copy")

        lab_cli("down", prefix=PREFIX)  # both VMs gone, disks included
        shutil.rmtree(TOP / "reports" / run_id)  # and a controller that never saw the run
        second = provisioned_lab(SUBNETS[1], tmp_path_factory.mktemp("second"))
        store.plug(second.cfg)
        give_the_hosts_the_bucket(second, store)
        moved_at = time.monotonic()
        out = fab(second, "train", "--resume-from", URL, "--run", run_id, "--hosts", "v100a,v100b",
                  "--detach").stdout
        assert f"update {copy['update']:,}" in out and "moved to v100a, v100b" in out, out

        def trained_past_the_copy():
            """rank 0's new host trained 20 updates past the copy"""
            records = inner_records(log_of(second.cfg, "v100a", run_id))
            return records if records and int(records[-1]["num_updates"]) >= copy["update"] + 20 else None

        after = wait_for(trained_past_the_copy, timeout=600, every=5)
        print(f"fresh VMs trained past update {copy['update']} {time.monotonic() - moved_at:.0f} s after "
              "fab train --resume-from")
        assert int(after[0]["num_updates"]) > copy["update"]  # not from update 0
        resumed = float(after[0]["loss"])
        assert resumed < at_start - 0.5 * (at_start - at_copy), (resumed, at_start, at_copy)  # from where it was
        fab(second, "stop", "--run", run_id)
    finally:
        lab_cli("down", prefix=PREFIX, check=False)
        store.close()
