"""data_volume's decisions: which device may be erased, on which host, and how it is described."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

PLUGIN = Path(__file__).resolve().parents[3] / "roles/data_volume/filter_plugins/data_volume_plan.py"
spec = importlib.util.spec_from_file_location("data_volume_plan", PLUGIN)
plan = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plan)


@pytest.mark.parametrize("value", [True, "true", "yes", "True"])
def test_force_format_true_is_refused_because_it_names_every_host(value):
    assert "would erase every host's data device" in plan.force_format_problem(value)


@pytest.mark.parametrize("value", [False, "", None, "v100b:/dev/vdb", "/dev/vdb", "v100b:/dev/vdb,v100c:/dev/sdb",
                                   ["v100b:/dev/vdb"]])
def test_force_format_per_host_and_device_is_accepted(value):
    assert plan.force_format_problem(value) == ""


def test_force_format_of_a_host_name_alone_is_refused():
    assert "v100b is not HOST:/dev/DEVICE" in plan.force_format_problem("v100b")


def test_force_format_names_one_host_and_one_device_only():
    value = "v100b:/dev/loop1"
    assert plan.forced(value, "v100b", "/dev/loop1")
    assert not plan.forced(value, "v100a", "/dev/loop1")  # the same device name on another host
    assert not plan.forced(value, "v100b", "/dev/loop2")
    assert plan.forced("/dev/vdb", "v100c", "/dev/vdb")  # a bare device: the host_vars form
    assert not plan.forced(False, "v100b", "/dev/loop1")


@pytest.mark.parametrize("holds, force, action", [
    ({}, False, "create"),
    ({"TYPE": "ext4"}, False, "keep"),
    ({"TYPE": "ext4", "LABEL": "data"}, True, "keep"),  # what tandem makes is never erased
    ({"TYPE": "xfs"}, False, "refuse"),
    ({"TYPE": "xfs"}, True, "erase"),
    ({"PTTYPE": "gpt"}, False, "refuse"),
])
def test_volume_action(holds, force, action):
    assert plan.volume_action(holds, "ext4", force) == action


def test_what_a_device_holds_is_described_with_sizes():
    assert plan.describe_holding({"TYPE": "xfs", "LABEL": "scratch"}, "4294967296", "1234567") == \
        'xfs, label "scratch", 4.3 GB, 1.2 MB used'
    assert plan.describe_holding({"TYPE": "xfs"}, "335544320", None) == "xfs, 335.5 MB, used space unknown"
    assert plan.describe_holding({"PTTYPE": "gpt"}, "1000", None) == "a gpt partition table, 1.0 kB"


def test_the_advised_value_erases_exactly_the_refused_devices():
    hostvars = {"v100a": {"r": ""}, "v100b": {"r": "/dev/loop1"}, "v100c": {"r": "/dev/vdb"}, "v100d": {}}
    assert plan.force_format_value(["v100a", "v100b", "v100c", "v100d"], hostvars, "r") == \
        "v100b:/dev/loop1,v100c:/dev/vdb"
