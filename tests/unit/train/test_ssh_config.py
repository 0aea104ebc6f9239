"""fab honours ~/.ssh/config as ssh and Ansible do (train.ssh_config): an alias's HostName, User, Port,
IdentityFile and ProxyJump; the inventory's ansible_user, ansible_port and key win where it sets them.
A temporary HOME holds the file; the inventory is read by Ansible as every task reads it; nothing connects."""

from __future__ import annotations

import paramiko
import pytest
from fabric import Connection

from train import cluster

SSH_CONFIG = """\
Host v100a-alias
    HostName 10.9.8.7
    User alice
    Port 2222
    IdentityFile ~/keys/from_ssh_config

Host behind
    HostName 10.1.1.1
    ProxyJump hopper@bastion.example:2200

Host *
    User everyone
"""

INVENTORY = """\
all:
  children:
    cluster:
      hosts:
        v100a: {ansible_host: v100a-alias, gpus: 0}
        v100b: {ansible_host: v100a-alias, ansible_user: bob, ansible_port: 22,
                ansible_ssh_private_key_file: /keys/inventory_key, gpus: 0}
        behind: {gpus: 0}
"""


@pytest.fixture
def hosts(tmp_path, monkeypatch):
    """The inventory's hosts, read with ~/.ssh/config (in a temporary HOME) as above."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("TANDEM_CACHE", str(tmp_path / "cache"))
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "config").write_text(SSH_CONFIG)
    inventory = tmp_path / "mine.yml"
    inventory.write_text(INVENTORY)
    return {h.name: h for h in cluster.load_hosts(inventory)}


def resolved(conn: Connection) -> tuple[str, str, int]:
    return conn.host, conn.user, conn.port


def test_an_alias_reaches_the_host_its_ssh_config_names_with_its_user_port_and_key(hosts, tmp_path):
    host = hosts["v100a"]
    assert (host.user, host.port) == ("alice", 2222)  # what rsync and the messages use too
    conn = cluster.connect(host)
    assert resolved(conn) == ("10.9.8.7", "alice", 2222)
    assert f"{tmp_path}/keys/from_ssh_config" in conn.connect_kwargs["key_filename"]


def test_the_inventorys_user_port_and_key_win_over_ssh_config(hosts, tmp_path):
    conn = cluster.connect(hosts["v100b"])
    assert resolved(conn) == ("10.9.8.7", "bob", 22)
    assert conn.connect_kwargs["key_filename"][0] == "/keys/inventory_key"  # tried first, ssh config's after


def test_a_proxyjump_goes_through_its_bastion_whose_key_is_checked_too(hosts):
    conn = cluster.connect(hosts["behind"])
    assert resolved(conn) == ("10.1.1.1", "everyone", 22)
    bastion = conn.gateway
    assert isinstance(bastion, Connection) and resolved(bastion) == ("bastion.example", "hopper", 2200)
    assert isinstance(bastion.client._policy, paramiko.RejectPolicy) and bastion.connect_timeout == cluster.CONNECT_S
    assert isinstance(conn.client._policy, paramiko.RejectPolicy)
