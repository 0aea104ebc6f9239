"""Preflight's check of the inventory's numbers, as a filter and as a user meets it: ansible-playbook
against the example inventory stops in preflight, before any host is reached."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

TOP = Path(__file__).resolve().parents[3]
spec = importlib.util.spec_from_file_location("preflight_numbers",
                                              TOP / "roles/preflight/filter_plugins/preflight_numbers.py")
numbers = importlib.util.module_from_spec(spec)
spec.loader.exec_module(numbers)


def test_a_zero_link_speed_is_named_once_with_its_hosts_and_the_explicit_way_off():
    hostvars = {"v100a": {"network_expected_mbps": "0"}, "v100b": {"network_expected_mbps": "0"}}
    assert numbers.number_problems(["v100a", "v100b"], hostvars) == [
        "network_expected_mbps is 0 on v100a, v100b: must be a whole number above 0 (the link speed you pay for, Mb/s; "
        "to turn the link check off say so: network_check_link: false)"]


@pytest.mark.parametrize("var, value", [("network_expected_mbps", "fast"), ("network_expected_mbps", -100),
                                        ("network_expected_mbps", True), ("train_threads", 1.5),
                                        ("train_threads", 0), ("cpu_ranks", 0), ("cpu_ranks", "two"),
                                        ("network_min_ratio", 1.2),
                                        ("network_iperf_port", 70000), ("data_volume_min_free_gb", "")])
def test_bad_numbers_are_refused(var, value):
    [line] = numbers.number_problems(["v100a"], {"v100a": {var: value}})
    assert line.startswith(f"{var} is ") and " on v100a: must be " in line


@pytest.mark.parametrize("var, value", [("network_expected_mbps", 1000), ("network_expected_mbps", "100"),
                                        ("network_expected_mbps", 2500.0), ("train_threads", "4"), ("cpu_ranks", 2),
                                        ("data_volume_min_free_gb", 0), ("network_min_ratio", 1)])
def test_good_numbers_pass(var, value):
    assert numbers.number_problems(["v100a"], {"v100a": {var: value}}) == []


@pytest.mark.parametrize("value", ["0", "fast"])
def test_provisioning_stops_in_preflight_with_one_line(value):
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "inventory/hosts.yml", "provision.yml",
         "-e", f"network_expected_mbps={value}"],
        cwd=TOP, capture_output=True, text=True, timeout=120,
        env={**os.environ, "ANSIBLE_NOCOLOR": "1", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"})
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert f"network_expected_mbps is {value} on v100a, v100b: must be a whole number above 0" in out
    assert "Reach the host" not in out and "argument_spec" not in out and "common :" not in out


def test_hosts_sharing_an_address_are_named():
    spec = importlib.util.spec_from_file_location("preflight_addresses",
                                                  TOP / "roles/preflight/filter_plugins/preflight_addresses.py")
    addresses = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(addresses)
    hostvars = {"a": {"ansible_host": "10.0.0.1"}, "b": {"ansible_host": "10.0.0.1"}, "c": {"ansible_host": "10.0.0.3"}}
    assert addresses.shared_addresses(["a", "b", "c"], hostvars) == [
        "a and b are both 10.0.0.1 (cluster address)",
        "a and b are both reached over SSH at 10.0.0.1:22 (ansible_host:ansible_port)"]
    assert addresses.shared_addresses(["a", "c"], hostvars) == []
    # rented VMs behind one NAT'd public IP: SSH on different ports, a private address each
    natted = {"a": {"ansible_host": "203.0.113.9", "ansible_port": 40022, "cluster_address": "10.1.0.1"},
              "b": {"ansible_host": "203.0.113.9", "ansible_port": 40023, "cluster_address": "10.1.0.2"}}
    assert addresses.shared_addresses(["a", "b"], natted) == []
    natted["b"]["cluster_address"] = "10.1.0.1"
    assert addresses.shared_addresses(["a", "b"], natted) == ["a and b are both 10.1.0.1 (cluster address)"]
