"""Each problem `fab init` finds on a host, said with its fix: `gpu2: sudo asks for a password: add ...`.

Pure: a host (its inventory entry) and its Facts, or the error SSH raised, in; lines out. The
thresholds are provisioning's own (roles/preflight's supported systems, roles/train_env's minimum
Python), read from the roles' defaults so that the two never disagree.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence

import yaml

from .. import hostvars
from ..cluster import TOP, ClusterError, Host
from ..reachability import explain
from ..run.preflight import layout_problems
from .probe import Facts, device_of


@functools.cache
def role_default(role: str, name: str) -> object:
    """A role's default (roles/ROLE/defaults/main.yml), where provisioning's own thresholds live."""
    return yaml.safe_load((TOP / "roles" / role / "defaults" / "main.yml").read_text())[name]


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


ssh = explain  # why fab cannot log in, and what to do: every task says it the same way (train.reachability)


def inventory(host: Host) -> list[str]:
    """What provisioning requires of the entry itself (roles/preflight/tasks/inventory.yml)."""
    found = []
    if not hostvars.given(host, "gpus"):
        found.append(f"{host.name}: the inventory gives no `gpus`: set how many GPUs the VM has (0 for a CPU host)")
    if not hostvars.given(host, "data_device"):
        found.append(f"{host.name}: the inventory gives no `data_device`: set the attached volume's device "
                     "(e.g. /dev/nvme1n1) or `data_device: none` to keep /data on the root disk")
    return found


def sudo(host: Host, facts: Facts) -> list[str]:
    if facts.root or not facts.sudo_error:
        return []
    user = host.user
    grant = (f"add `{user} ALL=(ALL) NOPASSWD:ALL` to /etc/sudoers.d/{user} (as root: "
             f"`visudo -f /etc/sudoers.d/{user}`)")
    said = facts.sudo_error.lower()
    if "not found" in said:
        return [f"{host.name}: sudo is not installed: as root, `apt-get install sudo`, then {grant}"]
    if "password" in said:
        return [f"{host.name}: sudo asks for a password: {grant}, or set ansible_become_password (in an "
                "ansible-vault file) for provisioning; fab bench-step's tc caps still need passwordless sudo"]
    return [f"{host.name}: {user} cannot use sudo ({facts.sudo_error}): {grant}"]


def system(host: Host, facts: Facts) -> list[str]:
    supported: list[str] = role_default("preflight", "preflight_supported_os")  # type: ignore[assignment]
    found = []
    distribution = f"{facts.os_id.capitalize()} {facts.os_version.split('.')[0]}"
    if distribution not in supported:
        found.append(f"{host.name}: {facts.os_name or 'an unknown system'} is not one provisioning supports "
                     f"({', '.join(supported)}): start the VM from one of those images")
    python = str(host.var("train_env_python"))
    minimum = str(role_default("train_env", "train_env_python_min"))
    if not facts.python:
        found.append(f"{host.name}: no Python at {python} (train_env_python): install python3 "
                     "(`sudo apt-get install python3 python3-venv`), or set train_env_python to the one it has")
    elif _minor(facts.python) < _minor(minimum):
        found.append(f"{host.name}: {python} is Python {facts.python}; tandem needs {minimum} or newer: "
                     f"`sudo apt-get install python{minimum} python{minimum}-venv python{minimum}-dev`, then set "
                     f"train_env_python: /usr/bin/python{minimum} in the inventory")
    return found


def _minor(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split(".")[:2] if p.isdigit())


def gpus(host: Host, facts: Facts) -> list[str]:
    """The GPUs the inventory promises against nvidia-smi's list, else (no driver yet) the PCI bus's."""
    want, seen = host.gpus, facts.gpus_seen
    if seen is not None and seen != want:
        return [f"{host.name}: nvidia-smi lists {_plural(seen, 'GPU')}, the inventory says gpus: {want}: set "
                f"gpus: {seen}, or get the VM you ordered"]
    if seen is not None:
        return []
    if want > 0 and facts.pci_gpus == 0:
        return [f"{host.name}: no NVIDIA GPU on its PCI bus, the inventory says gpus: {want}: a CPU VM? set gpus: 0 "
                "for a CPU host, or check the VM's type"]
    if facts.pci_gpus != want:
        return [f"{host.name}: its PCI bus shows {_plural(facts.pci_gpus, 'NVIDIA GPU')}, the inventory says "
                f"gpus: {want}: set gpus: {facts.pci_gpus}"]
    return []


def network(host: Host, facts: Facts, cluster_size: int) -> list[str]:
    """The cluster address must be the host's own (the peers connect to it), the NIC must exist."""
    found = []
    source = facts.route_source
    if not facts.holds(host.cluster_address) and cluster_size > 1:
        better = f"set cluster_address: {source} (the address it reaches its peers from)" if source else \
            "set cluster_address to its private address (`ip -4 addr` on the host)"
        if hostvars.given(host, "cluster_address"):
            found.append(f"{host.name}: cluster_address {host.cluster_address} is not on any of its NICs: {better}")
        else:
            found.append(f"{host.name}: its peers would reach it at {host.address}, its SSH address, which is not on "
                         f"any of its NICs (a NAT'd public address): {better}")
    if host.nic and facts.nics and host.nic not in facts.nics:
        instead = f"set cluster_nic: {facts.route_nic}, or " if facts.route_nic else ""
        found.append(f"{host.name}: cluster_nic {host.nic} does not exist (its NICs: {', '.join(facts.nics)}): "
                     f"{instead}leave cluster_nic unset to use the NIC of the route to the peers")
    elif not host.nic and not facts.route_nic:
        found.append(f"{host.name}: no route toward its peers ({facts.route or 'ip route said nothing'}): "
                     "set cluster_nic in the inventory")
    return found


def disk(host: Host, facts: Facts) -> list[str]:
    device = device_of(host)
    disks = f"its disks: {', '.join(facts.disks)}" if facts.disks else "lsblk lists its disks"
    if device and facts.device_gb is None:
        return [f"{host.name}: data_device {device} is not a block device there ({disks}): set data_device to the "
                "attached volume's device, or `none` to keep /data on the root disk"]
    need = float(host.var("data_volume_min_free_gb"))  # type: ignore[arg-type]
    if device and facts.disk_path == "/":
        have, where = facts.device_gb, device  # provisioning formats it whole, the next run uses it
    else:
        have, where = facts.free_gb, facts.disk_path
    if have is not None and have < need:
        return [f"{host.name}: {have:.0f} GB free on {where}, training needs {need:g} GB (data_volume_min_free_gb): "
                "attach a larger volume and set data_device, or grow the disk"]
    return []


def host_problems(host: Host, facts: Facts, cluster_size: int) -> list[str]:
    """Every problem of one reachable host, each with its fix."""
    return [*sudo(host, facts), *system(host, facts), *gpus(host, facts), *network(host, facts, cluster_size),
            *disk(host, facts)]


def cluster_problems(hosts: Sequence[Host], facts: Mapping[str, Facts]) -> list[str]:
    """What only the hosts that answered show together: two Pythons (one environment needs one), ranks
    that differ (an unreachable host's GPUs are not known)."""
    found = []
    pythons = {h.name: facts[h.name].python for h in hosts if h.name in facts and facts[h.name].python}
    if len({_minor(v) for v in pythons.values()}) > 1:
        found.append(f"the hosts' Pythons differ ({', '.join(f'{n} {v}' for n, v in pythons.items())}): one cluster "
                     "trains in one environment; set train_env_python to the same version on every host")
    try:
        found += layout_problems([h for h in hosts if h.name in facts])  # fab train's own check
    except ClusterError as err:
        found.append(str(err))
    return found
