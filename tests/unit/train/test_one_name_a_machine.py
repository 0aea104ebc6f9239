"""An inventory naming one machine twice is refused when it is read: that machine would train as
two hosts, and every parallel call would answer for one of its names only."""

from __future__ import annotations

import pytest

from train.cluster import ClusterError, load_hosts

TWICE = """
all:
  children:
    cluster:
      hosts:
        gpu1: {ansible_host: 203.0.113.10, ansible_user: ubuntu, gpus: 1}
        gpu2: {ansible_host: 203.0.113.20, ansible_user: ubuntu, gpus: 1}
        gpu1-again: {ansible_host: 203.0.113.10, ansible_user: ubuntu, gpus: 1}
"""

# one public address, NAT'd to two VMs by port: two machines
BY_PORT = """
all:
  children:
    cluster:
      hosts:
        gpu1: {ansible_host: 203.0.113.10, ansible_port: 2201, ansible_user: ubuntu}
        gpu2: {ansible_host: 203.0.113.10, ansible_port: 2202, ansible_user: ubuntu}
"""


def test_one_machine_under_two_names_is_refused_naming_both(tmp_path):
    path = tmp_path / "hosts.yml"
    path.write_text(TWICE)
    with pytest.raises(ClusterError, match="gpu1 and gpu1-again are both ubuntu@203.0.113.10:22, one machine"):
        load_hosts(path)


def test_two_machines_behind_one_address_by_port_are_two_hosts(tmp_path):
    path = tmp_path / "hosts.yml"
    path.write_text(BY_PORT)
    assert [h.name for h in load_hosts(path)] == ["gpu1", "gpu2"]
