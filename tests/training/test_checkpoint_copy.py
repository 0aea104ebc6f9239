"""Checkpoints travel host to host over the cluster network, with the cluster's own key."""

from __future__ import annotations

import subprocess

import pytest
from labtools import ssh

from train.cluster import ClusterError, Host, load_hosts
from train.run import checkpoints

SAVE_DIR = "/data/tandem/runs/copy-test/checkpoints"


def test_hosts_copy_checkpoints_to_each_other_and_nobody_else_holds_the_key(provisioned):
    cfg = provisioned.cfg
    hosts = load_hosts(provisioned.inventory)
    try:
        # a 40 MB stand-in for rank 0's checkpoint, and nothing yet on the peer
        ssh(cfg, "v100a", f"mkdir -p {SAVE_DIR} && head -c 40000000 /dev/urandom > {SAVE_DIR}/checkpoint_last.pt")
        checkpoints.push_between_hosts(hosts[0], hosts[1:], SAVE_DIR)
        sums = {h.name: ssh(cfg, h.name, f"sha256sum {SAVE_DIR}/checkpoint_last.pt").stdout.split()[:1]
                for h in hosts}
        assert sums["v100a"] and sums["v100a"] == sums["v100b"], sums
        # the second copy is only what changed: nothing
        checkpoints.push_between_hosts(hosts[0], hosts[1:], SAVE_DIR)

        # the key opens a peer only from a cluster address: not from the controller that made it
        key = provisioned.inventory.parent / ".tandem_cluster_key"
        from_controller = subprocess.run(
            ["ssh", "-i", str(key), "-o", "IdentitiesOnly=yes", "-o", f"UserKnownHostsFile={cfg.known_hosts}",
             "-o", "BatchMode=yes", f"{cfg.login_user}@{cfg.host_ip('v100b')}", "true"], capture_output=True, text=True,
            timeout=60)
        assert from_controller.returncode == 255 and "Permission denied" in from_controller.stderr

        # a peer that does not answer (an unused address on the network the hosts reach each other on) is named
        gone = Host("v100z", str((cfg.cluster_network if cfg.cluster_net else cfg.network)[99]), user=cfg.login_user)
        # rsync exits 255 or 12 for the same refused ssh, depending on which side reports first
        with pytest.raises(ClusterError, match=r"failed for: v100z (255|12)\b.*(No route to host|timed out)"):
            checkpoints.push_between_hosts(hosts[0], [gone], SAVE_DIR)
    finally:
        for name in cfg.names:
            ssh(cfg, name, "rm -rf /data/tandem/runs/copy-test")
