"""Checkpoint copies off the cluster to an sftp:// target, against a real sshd: v100b stands in for the
machine with a disk that outlives the VMs (train.agent.offsite.upload, paramiko under fsspec), reached with
the training user's own key. The check names the host and the fix when the target cannot be reached."""

from __future__ import annotations

import json
import shlex

import pytest
from labtools import ssh

PYTHON = "/opt/tandem/venv/bin/python"
STORE = "/data/tandem/offsite-sftp"
RUN_DIR = "/data/tandem/runs/sftp-test"


def offsite(cfg, host: str, *args: str):
    return ssh(cfg, host, shlex.join([PYTHON, "-m", "train.agent.offsite.upload", *args]))


@pytest.fixture
def sftp_target(provisioned):
    """sftp://USER@v100b's cluster address/STORE, v100a's training user let in with its own key (the
    cluster's, as the key a user would give it)."""
    cfg = provisioned.cfg
    key_in_place = "cp ~/.ssh/tandem_cluster ~/.ssh/id_ed25519 && chmod 600 ~/.ssh/id_ed25519"
    try:
        assert ssh(cfg, "v100a", key_in_place).returncode == 0
        assert ssh(cfg, "v100b", f"mkdir -p {STORE}").returncode == 0
        yield cfg, f"sftp://{cfg.login_user}@{cfg.cluster_ip('v100b')}{STORE}"
    finally:
        ssh(cfg, "v100a", f"rm -f ~/.ssh/id_ed25519; rm -rf {RUN_DIR} /tmp/sftp-fetched")
        ssh(cfg, "v100b", f"rm -rf {STORE}")


def test_a_checkpoint_goes_whole_to_an_sftp_target_and_comes_back_checked(sftp_target):
    cfg, url = sftp_target
    checked = offsite(cfg, "v100a", "check", url, "--host", "v100a")
    assert checked.returncode == 0 and json.loads(checked.stdout)["ok"], checked.stdout + checked.stderr
    made = ssh(cfg, "v100a", f"mkdir -p {RUN_DIR} && head -c 20000000 /dev/urandom > {RUN_DIR}/checkpoint_last.pt "
                             f"&& sha256sum {RUN_DIR}/checkpoint_last.pt")
    local_sum = made.stdout.split()[0]
    upload = (f"from pathlib import Path; from train.agent.offsite import copies as c, target as t; "
              f"c.upload(t.parse({url!r}), 'sftp-test', 'last', 40, "
              f"{{'checkpoint_last.pt': Path({RUN_DIR!r}) / 'checkpoint_last.pt'}})")
    uploaded = ssh(cfg, "v100a", f"{PYTHON} -c {shlex.quote(upload)}")
    assert uploaded.returncode == 0, uploaded.stderr[-2000:]
    listed = json.loads(offsite(cfg, "v100a", "runs", url).stdout)
    assert [(r["run"], r["update"]) for r in listed] == [("sftp-test", 40)]
    fetched = offsite(cfg, "v100a", "fetch", url, "sftp-test", "/tmp/sftp-fetched")
    assert fetched.returncode == 0, fetched.stdout + fetched.stderr
    newest = json.loads(fetched.stdout)
    assert newest["update"] == 40 and newest["files"]["checkpoint_last.pt"]["sha256"] == local_sum
    assert ssh(cfg, "v100a", "sha256sum /tmp/sftp-fetched/checkpoint_last.pt").stdout.split()[0] == local_sum
    held = ssh(cfg, "v100b", f"ls {STORE}/sftp-test/u40").stdout.split()
    assert set(held) == {"checkpoint_last.pt", "manifest.json"}, held


def test_an_sftp_target_that_cannot_be_reached_is_refused_naming_the_host_and_the_fix(sftp_target):
    cfg, url = sftp_target
    closed = url.replace(f"@{cfg.cluster_ip('v100b')}", f"@{cfg.cluster_ip('v100b')}:2")  # nothing listens there
    refused = offsite(cfg, "v100a", "check", closed, "--host", "v100a")
    said = json.loads(refused.stdout)["error"]
    assert refused.returncode == 1 and "v100a" in said and "sftp://" in said, said
