"""What `fab init` asks each host before provisioning, in one shell line, and its answers as Facts.

Nothing of tandem's is on a fresh host yet (train.agent.measure.probe, which `fab train`'s preflight runs,
lives in the training venv), so the questions are plain POSIX shell, as roles/preflight and
roles/network ask them: passwordless sudo (`sudo -n true`), /etc/os-release, train_env_python's
version, `nvidia-smi -L` (and the NVIDIA GPUs on the PCI bus, which need no driver), whether the
cluster address is on one of the host's NICs, the route toward the first peer (`ip route get`, the
NIC roles/network picks when the inventory names none), its addresses and routes (`ip -j addr show`,
`ip -j route show`: where its peers reach it, train.onboard.peer_address), free disk on /data or /, the data device.
The script prints `key=value` lines; `parse` reads them. Pure but for what the host answers.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from ..cluster import Host
from . import peer_address


@dataclass(frozen=True)
class Facts:
    """One host's answers."""

    root: bool = False  # logged in as root: no sudo needed
    sudo_error: str = ""  # what `sudo -n true` said when it failed; "" when it works
    os_id: str = ""  # /etc/os-release ID: ubuntu, debian, ...
    os_version: str = ""  # VERSION_ID: 22.04, 12
    os_name: str = ""  # PRETTY_NAME
    python: str = ""  # train_env_python's version, "" when it does not run
    smi: str = "absent"  # nvidia-smi: absent, ok or failed
    smi_gpus: int = 0  # GPUs `nvidia-smi -L` lists
    smi_error: str = ""
    pci_gpus: int = 0  # NVIDIA display / 3D controllers on the PCI bus
    address_local: bool = False  # the cluster address is on one of the host's NICs
    route: str = ""  # `ip route get PEER` (or the default route): "10.0.0.11 dev ens5 src 10.0.0.10 uid 1000"
    nics: tuple[str, ...] = ()
    addresses: tuple[peer_address.Address, ...] = ()  # `ip -j addr show`'s that can carry cluster traffic
    routes: tuple[peer_address.Route, ...] = ()  # `ip -j route show`'s
    disk_path: str = "/"  # the data volume's mount point when mounted, else /
    free_gb: float | None = None
    device_gb: float | None = None  # data_device's size; None when it is no block device (or none is named)
    disks: tuple[str, ...] = ()  # the host's disks: "nvme1n1 500G"

    @property
    def route_nic(self) -> str:
        found = re.search(r"\bdev (\S+)", self.route)
        return found[1] if found else ""

    @property
    def route_source(self) -> str:
        """The local address the host reaches its peers from: its private address on a cloud VM."""
        found = re.search(r"\bsrc (\S+)", self.route)
        return found[1] if found else ""

    def holds(self, address: str) -> bool:
        """Whether `address` is on one of the host's NICs: from `ip -j addr show` when it is an IP address
        the host listed addresses for, else the probe's own answer (a name, resolved there)."""
        if self.addresses and peer_address.nic_of(self.addresses, address) is not None:
            return True
        return self.address_local

    @property
    def gpus_seen(self) -> int | None:
        """GPUs nvidia-smi lists; None when it cannot (no driver yet)."""
        return self.smi_gpus if self.smi == "ok" else None


def device_of(host: Host) -> str:
    """The inventory's data_device when it names a device (not `none`), else ""."""
    device = str(host.var("data_device") or "")
    return device if device.startswith("/dev/") else ""


def command(host: Host, peer: str | None) -> str:
    """The shell line that asks `host` everything; `peer`: the address of another host of the cluster
    (its cluster address), None for a cluster of one. Always exits 0: a failure is an answer."""
    q = shlex.quote
    python = str(host.var("train_env_python"))
    mount = str(host.var("data_volume_mount"))
    device = device_of(host)
    route = (f'p=$(getent ahosts {q(peer)} 2>/dev/null | awk "NR==1{{print \\$1}}"); '
             f'echo "route=$(ip route get "${{p:-{peer}}}" 2>&1 | head -n 1)"' if peer
             else 'echo "route=$(ip route show default 2>&1 | head -n 1)"')
    lines = [
        'echo "uid=$(id -u)"',
        'if [ "$(id -u)" != 0 ]; then if out=$(sudo -n true 2>&1); then :; '
        'else echo "sudo_error=$(printf "%s" "${out:-sudo failed}" | head -n 1)"; fi; fi',
        "if [ -r /etc/os-release ]; then . /etc/os-release; fi",
        'echo "os_id=${ID:-}"; echo "os_version=${VERSION_ID:-}"; echo "os_name=${PRETTY_NAME:-}"',
        f'echo "python=$({q(python)} -c "import sys; print(\'%d.%d.%d\' % sys.version_info[:3])" 2>/dev/null)"',
        'if command -v nvidia-smi >/dev/null 2>&1; then '
        'if out=$(nvidia-smi -L 2>&1); then echo smi=ok; echo "smi_gpus=$(printf "%s\\n" "$out" | grep -c "^GPU ")"; '
        'else echo smi=failed; echo "smi_error=$(printf "%s" "$out" | head -n 1)"; fi; else echo smi=absent; fi',
        'n=0; for d in /sys/bus/pci/devices/*; do [ "$(cat "$d/vendor" 2>/dev/null)" = 0x10de ] || continue; '
        'case "$(cat "$d/class" 2>/dev/null)" in 0x0300*|0x0302*) n=$((n+1));; esac; done; echo "pci_gpus=$n"',
        'echo "nics=$(ls /sys/class/net 2>/dev/null | tr "\\n" " ")"',
        'echo "ip_addr=$(ip -j addr show 2>/dev/null | tr -d "\\n")"',
        'echo "ip_route=$(ip -j route show 2>/dev/null | tr -d "\\n")"',
        f'a=$(getent ahosts {q(host.cluster_address)} 2>/dev/null | awk "NR==1{{print \\$1}}"); '
        'if [ -n "$a" ] && ip -o addr show to "$a" 2>/dev/null | grep -q .; then echo address_local=yes; fi',
        route,
        f"if mountpoint -q {q(mount)} 2>/dev/null; then d={q(mount)}; else d=/; fi",
        'echo "disk_path=$d"; echo "disk_free_kb=$(df -Pk "$d" | awk "NR==2{print \\$4}")"',
        (f'if [ -b {q(device)} ]; then echo "device_bytes=$(lsblk -bdno SIZE {q(device)})"; fi' if device else ":"),
        'echo "disks=$(lsblk -dno NAME,SIZE,TYPE 2>/dev/null | '
        'awk "\\$3 == \\"disk\\" {printf \\"%s %s,\\", \\$1, \\$2}")"',
        "exit 0",
    ]
    return f"sh -c {q('; '.join(lines))}"


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def parse(stdout: str) -> Facts:
    """The probe's `key=value` lines as Facts (a line it does not know is left out)."""
    said: dict[str, str] = {}
    for line in stdout.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            said[key.strip()] = value.strip()
    free_kb, device_bytes = _number(said.get("disk_free_kb", "")), _number(said.get("device_bytes", ""))
    return Facts(
        root=said.get("uid") == "0",
        sudo_error=said.get("sudo_error", ""),
        os_id=said.get("os_id", ""), os_version=said.get("os_version", ""), os_name=said.get("os_name", ""),
        python=said.get("python", ""),
        smi=said.get("smi", "absent"), smi_gpus=int(_number(said.get("smi_gpus", "")) or 0),
        smi_error=said.get("smi_error", ""),
        pci_gpus=int(_number(said.get("pci_gpus", "")) or 0),
        address_local=said.get("address_local") == "yes",
        route=said.get("route", ""),
        nics=tuple(said.get("nics", "").split()),
        addresses=peer_address.addresses(said.get("ip_addr", "")),
        routes=peer_address.routes(said.get("ip_route", "")),
        disk_path=said.get("disk_path", "/") or "/",
        free_gb=free_kb * 1024 / 1e9 if free_kb is not None else None,
        device_gb=device_bytes / 1e9 if device_bytes is not None else None,
        disks=tuple(d.strip() for d in said.get("disks", "").split(",") if d.strip()),
    )
