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


BY_ID = "/dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_vol0abc"
UUID = "0b7f7c1e-4a2d-4c3e-9f7a-2d1c5e6f7a8b"


@pytest.mark.parametrize("value", [False, "", None, f"v100b:{BY_ID}", f"v100b:UUID={UUID}",
                                   f"v100b:{BY_ID},v100c:UUID={UUID}", [f"v100b:{BY_ID}"],
                                   "v100b:/dev/disk/by-id/usb-Disk_1234-0:0"])
def test_force_format_per_host_and_stable_device_is_accepted(value):
    assert plan.force_format_problem(value) == ""


@pytest.mark.parametrize("value", ["/dev/nvme1n1", BY_ID, f"UUID={UUID}", "v100b"])
def test_force_format_without_a_host_is_refused_because_with_e_it_reaches_every_host(value):
    """`-e data_volume_force_format=/dev/nvme1n1` used to erase that name on every host (issue 54)."""
    assert f"data_volume_force_format: {value} names no host, so it would erase that device on every host" in \
        plan.force_format_problem(value)


@pytest.mark.parametrize("device", ["/dev/nvme1n1", "/dev/vdb", "/dev/loop1", "UUID="])
def test_force_format_by_a_kernel_name_is_refused_because_it_names_another_disk_after_a_stop_start(device):
    said = plan.force_format_problem(f"v100b:{device}")
    assert said.startswith(f"data_volume_force_format: v100b:{device} does not name the device by a name that stays")
    assert "v100b:/dev/disk/by-id/... or v100b:UUID=..." in said


def test_force_format_names_one_host_and_one_device_only():
    """Only the named host, and only the device the name stands for now: the UUID it holds, or a by-id link to it."""
    assert plan.force_named(f"v100b:UUID={UUID},v100c:{BY_ID}", "v100b") == f"UUID={UUID}"
    assert plan.force_named(f"v100b:UUID={UUID}", "v100a") == ""  # another host: nothing named
    assert plan.force_named(BY_ID, "v100b") == ""  # no host (refused before): never this host's
    assert plan.forced(f"UUID={UUID}", {"TYPE": "xfs", "UUID": UUID.upper()})
    assert plan.forced(f"UUID={UUID}", {"PTTYPE": "gpt", "PTUUID": UUID})  # a partition table's
    assert not plan.forced(f"UUID={UUID}", {"TYPE": "xfs", "UUID": "another"})  # the name now holds another disk
    assert plan.forced(BY_ID, {"TYPE": "xfs"}, device_number=66305, named_number=66305)
    assert not plan.forced(BY_ID, {"TYPE": "xfs"}, device_number=66305, named_number=66306)
    assert not plan.forced(BY_ID, {"TYPE": "xfs"}, device_number=66305, named_number=None)  # no such link
    assert not plan.forced("", {"TYPE": "xfs", "UUID": UUID})


def test_a_device_is_known_by_its_number_whatever_its_name():
    disk = {"exists": True, "isblk": True, "device_type": 66305, "path": BY_ID}
    assert plan.block_number(disk) == 66305
    assert plan.block_number({"exists": False}) is None
    assert plan.block_number({"exists": True, "isblk": False, "isreg": True, "device_type": 0}) is None


def test_the_refusal_names_the_device_by_what_stays_its_own():
    assert plan.stable_name("/dev/nvme1n1", {"TYPE": "xfs", "UUID": UUID}) == f"UUID={UUID}"
    assert plan.stable_name("/dev/nvme1n1", {"PTTYPE": "gpt", "PTUUID": "ab-cd"}) == "UUID=ab-cd"
    assert plan.stable_name(BY_ID, {"TYPE": "xfs", "UUID": UUID}) == BY_ID
    assert plan.stable_name("/dev/nvme1n1", {"TYPE": "weird"}) == ""  # then the message asks for its by-id link


def lsblk(name: str, mountpoints: list, children: list | None = None) -> dict:
    device = {"name": name, "mountpoints": mountpoints}
    return {**device, "children": children} if children else device


def test_a_device_mounted_anywhere_but_the_data_mount_is_found():
    """A data_device typo naming the root partition mounted / again at /data (issue 54)."""
    root = {"blockdevices": [lsblk("/dev/vda1", ["/"])]}
    assert plan.mounted_elsewhere(root, "/data") == ["/dev/vda1 at /"]
    disk = {"blockdevices": [lsblk("/dev/vda", [None], [lsblk("/dev/vda1", ["/", "/run/x"]),
                                                         lsblk("/dev/vda2", ["[SWAP]"])])]}
    assert plan.mounted_elsewhere(disk, "/data") == ["/dev/vda1 at /", "/dev/vda1 at /run/x", "/dev/vda2 as swap"]
    assert plan.mounted_elsewhere({"blockdevices": [lsblk("/dev/vdb", ["/data"])]}, "/data") == []  # a rerun
    assert plan.mounted_elsewhere({"blockdevices": [lsblk("/dev/vdb", [None])]}, "/data") == []


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
    assert plan.describe_holding({"TYPE": "xfs", "UUID": UUID}, "4294967296", "1234567") == \
        f"xfs, UUID {UUID}, 4.3 GB, 1.2 MB used"  # the UUID data_volume_force_format may name
    assert plan.describe_holding({"TYPE": "xfs"}, "335544320", None) == "xfs, 335.5 MB, used space unknown"
    assert plan.describe_holding({"PTTYPE": "gpt"}, "1000", None) == "a gpt partition table, 1.0 kB"


def test_the_advised_value_erases_exactly_the_refused_devices():
    hostvars = {"v100a": {"r": ""}, "v100b": {"r": f"UUID={UUID}"}, "v100c": {"r": BY_ID}, "v100d": {}}
    value = plan.force_format_value(["v100a", "v100b", "v100c", "v100d"], hostvars, "r")
    assert value == f"v100b:UUID={UUID},v100c:{BY_ID}" and plan.force_format_problem(value) == ""
