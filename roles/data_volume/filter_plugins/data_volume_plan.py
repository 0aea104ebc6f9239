"""What the data_volume role does with a host's data device, decided in one place.

`data_volume_force_format` names the devices that may be erased, per host: `v100b:/dev/loop1`
(several comma-separated), or a bare `/dev/loop1` in that host's host_vars. A bare `true` is
refused: it used to erase every host's device at once, healthy volumes included.
"""

from __future__ import annotations

DOCUMENTATION = """
name: data_volume_plan
short_description: keep, create, erase or refuse a data device, and how to describe what it holds
"""

EMPTY = (None, False, "", "none", "false", "False", "no")


def _entries(value) -> list[str]:
    if value in EMPTY:
        return []
    items = value if isinstance(value, list) else str(value).split(",")
    return [str(item).strip() for item in items if str(item).strip()]


def force_format_problem(value) -> str:
    """'' when `data_volume_force_format` is well formed, else what is wrong with it."""
    if value is True or str(value).lower() in ("true", "yes", "1"):
        return ("data_volume_force_format: true would erase every host's data device; name the host and "
                "device instead, e.g. -e data_volume_force_format=v100b:/dev/vdb")
    bad = [e for e in _entries(value) if not e.split(":", 1)[-1].startswith("/dev/")]
    if bad:
        return (f"data_volume_force_format: {', '.join(bad)} is not HOST:/dev/DEVICE or /dev/DEVICE "
                "(e.g. v100b:/dev/vdb)")
    return ""


def forced(value, host: str, device: str) -> bool:
    """Whether `data_volume_force_format` allows erasing this host's device."""
    for entry in _entries(value):
        name, _, dev = entry.rpartition(":")
        if dev == device and name in ("", host):
            return True
    return False


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
    if size_bytes not in (None, ""):
        parts.append(human_bytes(size_bytes))
    if used_bytes not in (None, ""):
        parts.append(f"{human_bytes(used_bytes)} used")
    elif "TYPE" in holds:
        parts.append("used space unknown")
    return ", ".join(parts)


def force_format_value(hosts: list, hostvars, var: str) -> str:
    """'v100b:/dev/loop1,v100c:/dev/vdb': the value that erases exactly the refused devices."""
    return ",".join(f"{h}:{hostvars[h][var]}" for h in hosts if hostvars[h].get(var))


class FilterModule:
    def filters(self):
        return {"force_format_problem": force_format_problem, "forced": forced,
                "volume_action": volume_action, "describe_holding": describe_holding,
                "force_format_value": force_format_value, "human_bytes": human_bytes}
