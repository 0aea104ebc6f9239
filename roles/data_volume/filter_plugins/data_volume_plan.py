"""What the data_volume role does with a host's data device, decided in one place.

`data_volume_force_format` names the devices that may be erased, each with its host and by a name that
stays that device's: `v100b:/dev/disk/by-id/nvme-...` or `v100b:UUID=...` (the filesystem's, or the
partition table's, UUID the refusal shows), several comma-separated. Refused: `true` and a device
without a host (a value given with -e reaches every host: `/dev/nvme1n1` erased that name everywhere),
and a kernel name (/dev/nvme1n1 names another disk after a stop/start, so one left in host_vars would
erase whatever has that name then).
"""

from __future__ import annotations

DOCUMENTATION = """
name: data_volume_plan
short_description: keep, create, erase or refuse a data device, and how to describe what it holds
"""

EMPTY = (None, False, "", "none", "false", "False", "no")


STABLE = "/dev/disk/by-id/"


def _entries(value) -> list[str]:
    if value in EMPTY:
        return []
    items = value if isinstance(value, list) else str(value).split(",")
    return [str(item).strip() for item in items if str(item).strip()]


def _split(entry: str) -> tuple[str, str]:
    """'v100b:/dev/disk/by-id/usb-X-0:0' -> ('v100b', '/dev/disk/by-id/usb-X-0:0'): the first ':' ends the
    host (by-id names may hold one)."""
    host, sep, device = entry.partition(":")
    return (host, device) if sep and not host.startswith("/") else ("", entry)


def force_format_problem(value) -> str:
    """'' when `data_volume_force_format` is well formed, else what is wrong with it."""
    if value is True or str(value).lower() in ("true", "yes", "1"):
        return ("data_volume_force_format: true would erase every host's data device; name the host and "
                "device instead, e.g. -e data_volume_force_format=v100b:/dev/disk/by-id/nvme-...")
    for entry in _entries(value):
        host, device = _split(entry)
        if not host:
            return (f"data_volume_force_format: {entry} names no host, so it would erase that device on every "
                    "host; write HOST:DEVICE, e.g. v100b:/dev/disk/by-id/nvme-... or v100b:UUID=...")
        if not (device.startswith(STABLE) or (device.upper().startswith("UUID=") and len(device) > 5)):
            return (f"data_volume_force_format: {entry} does not name the device by a name that stays its own "
                    f"({device} may be another disk after a stop/start); write {host}:/dev/disk/by-id/... or "
                    f"{host}:UUID=... (the UUID the refusal shows)")
    return ""


def force_named(value, host: str) -> str:
    """The device (a /dev/disk/by-id/ path, or UUID=...) `data_volume_force_format` names for `host`; ''."""
    return next((device for name, device in map(_split, _entries(value)) if name == host), "")


def forced(named: str, holds: dict, device_number=None, named_number=None) -> bool:
    """Whether `named` (force_named's) is this device: the UUID it holds now (the filesystem's or the partition
    table's), or a by-id link to the same block device (`*_number`: block_number's, of each path)."""
    if named.upper().startswith("UUID="):
        now = {str(holds.get(k, "")).lower() for k in ("UUID", "PTUUID")} - {""}
        return named[5:].lower() in now
    return bool(named) and named_number is not None and named_number == device_number


def block_number(stat: dict):
    """The block device ansible.builtin.stat (follow: true) found there, as its device number; None for
    anything else (nothing there, a file): two names of one disk, /dev/disk/by-id/... and /dev/nvme1n1, agree."""
    return stat.get("device_type") if stat.get("exists") and stat.get("isblk") else None


def stable_name(device: str, holds: dict) -> str:
    """How data_volume_force_format names this device: its by-id path as given, else the UUID it holds; ''."""
    if device.startswith(STABLE):
        return device
    uuid = holds.get("UUID") or holds.get("PTUUID")
    return f"UUID={uuid}" if uuid else ""


def mounted_elsewhere(lsblk: dict, mount: str) -> list[str]:
    """'/dev/vda1 at /' for each mount of the device or a partition of it (lsblk --json --paths --output
    NAME,MOUNTPOINTS) that is not `mount`; swap said as swap."""
    found = []

    def walk(devices):
        for dev in devices or []:
            for at in dev.get("mountpoints") or []:
                if at and at != mount:
                    found.append(f"{dev['name']} {'as swap' if at == '[SWAP]' else 'at ' + at}")
            walk(dev.get("children"))

    walk(lsblk.get("blockdevices"))
    return found


def volume_action(holds: dict, fstype: str, force: bool) -> str:
    """create (empty device), keep (holds the filesystem tandem makes: never erased, even when
    forced), erase (holds something else and forced) or refuse."""
    if not holds:
        return "create"
    if holds.get("TYPE") == fstype:
        return "keep"
    return "erase" if force else "refuse"


def human_bytes(n) -> str:
    """4294967296 -> '4.3 GB' (decimal units, as df -H and the providers' price lists)."""
    n = float(n)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return ""


def describe_holding(holds: dict, size_bytes=None, used_bytes=None) -> str:
    """blkid's answer and sizes -> 'xfs, label "scratch", 4.3 GB, 1.2 MB used'."""
    if "TYPE" in holds:
        parts = [holds["TYPE"]]
    elif "PTTYPE" in holds:
        parts = [f"a {holds['PTTYPE']} partition table"]
    else:
        parts = ["something blkid recognises"]
    if holds.get("LABEL"):
        parts.append(f'label "{holds["LABEL"]}"')
    if holds.get("UUID") or holds.get("PTUUID"):
        parts.append(f"UUID {holds.get('UUID') or holds.get('PTUUID')}")
    if size_bytes not in (None, ""):
        parts.append(human_bytes(size_bytes))
    if used_bytes not in (None, ""):
        parts.append(f"{human_bytes(used_bytes)} used")
    elif "TYPE" in holds:
        parts.append("used space unknown")
    return ", ".join(parts)


def force_format_value(hosts: list, hostvars, var: str) -> str:
    """'v100b:UUID=...,v100c:/dev/disk/by-id/...': the value that erases exactly the refused devices."""
    return ",".join(f"{h}:{hostvars[h][var]}" for h in hosts if hostvars[h].get(var))


class FilterModule:
    def filters(self):
        return {"force_format_problem": force_format_problem, "force_named": force_named, "forced": forced,
                "block_number": block_number, "stable_name": stable_name, "mounted_elsewhere": mounted_elsewhere,
                "volume_action": volume_action, "describe_holding": describe_holding,
                "force_format_value": force_format_value, "human_bytes": human_bytes}
