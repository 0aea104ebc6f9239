"""What a lab is: its hosts, addresses and where its files live. Pure data."""

from __future__ import annotations

import ipaddress
import os
import string
from dataclasses import dataclass, field
from pathlib import Path

CLUSTER_SUBNET = "172.30.0.0/24"
CLUSTER_NIC = "ens5"  # what a cloud VM's second NIC is called: not eth0, on purpose
# The Debian releases a lab host can run: their Python, and the torch build the lab's wheelhouse gives
# them. Debian 13's Python 3.13 has no CPU build of torch on PyPI (only on download.pytorch.org, which
# this machine cannot reach): its hosts get PyPI's build, CUDA 13.0, which runs on a CPU as well and
# puts the wheelhouse's CUDA build through provisioning for real.
DISTROS = {"bookworm": ("3.11", "cpu"), "trixie": ("3.13", "cu130")}
# Who tandem logs in as, with the uid the lab's root filesystem gives them (lab/rootfs.py). A Debian
# cloud image's shape is the default: `debian`, passwordless sudo, sshd refusing root. `root` is the old
# lab's shape (a provider that hands out root logins).
LOGIN_USERS = {"debian": 1000, "root": 0}


def default_cache() -> Path:
    return Path(os.environ.get("TANDEM_CACHE", Path.home() / ".cache" / "tandem"))


def host_names(count: int) -> list[str]:
    """v100a, v100b, ... : the lab's hosts are named like the field reports' VMs."""
    if not 1 <= count <= 26:
        raise ValueError(f"a lab has 1 to 26 hosts, not {count}")
    return [f"v100{letter}" for letter in string.ascii_lowercase[:count]]


@dataclass(frozen=True)
class LabConfig:
    hosts: int = 2
    subnet: str = "10.77.0.0/24"
    # Names the namespaces, bridge and links, so two labs can live side by side.
    prefix: str = "tandem"
    cache: Path = field(default_factory=default_cache)
    state_root: Path = Path("/var/lib/tandem-lab")
    http_port: int = 8080
    data_disk_gb: int = 4
    # Hosts that also get eth1, a NIC that reports 100 Mb/s to ethtool.
    slow_nic_hosts: tuple[str, ...] = ()
    # A cloud VM's shape (the default): eth0 on the management network (SSH, ansible_host), ens5 on a
    # private cluster network (cluster_address) that the controller cannot reach.
    cluster_net: bool = True
    # The hosts' Debian release (DISTROS): bookworm is the controller's own, trixie another Python.
    distro: str = "bookworm"
    # The user tandem logs in as (LOGIN_USERS): `debian` with passwordless sudo and root login refused,
    # as on Debian's cloud images (the default); `root`: a provider that gives root logins.
    login_user: str = "debian"
    # Training ranks on each host (the inventory's cpu_ranks): 2 runs the multi-rank path that GPU
    # hosts with several GPUs take (torchrun starting several workers a host).
    ranks: int = 1

    def __post_init__(self) -> None:
        if len(self.prefix) > 8 or not self.prefix.isalnum():
            raise ValueError(f"lab prefix must be 1-8 letters or digits, got {self.prefix!r}")
        net = ipaddress.ip_network(self.subnet)
        if net.num_addresses < 16 + self.hosts:
            raise ValueError(f"subnet {self.subnet} is too small for {self.hosts} hosts")
        if not 1 <= self.ranks <= 16:
            raise ValueError(f"a lab host runs 1 to 16 ranks, not {self.ranks}")
        if self.distro not in DISTROS:
            raise ValueError(f"the lab's hosts run Debian {' or '.join(DISTROS)}, not {self.distro!r}")
        if self.login_user not in LOGIN_USERS:
            raise ValueError(f"the lab's hosts log in as {' or '.join(LOGIN_USERS)}, not {self.login_user!r}")
        unknown = set(self.slow_nic_hosts) - set(host_names(self.hosts))
        if unknown:
            raise ValueError(f"slow NIC for unknown host {', '.join(sorted(unknown))}: the lab has "
                             f"{', '.join(host_names(self.hosts))}")

    @property
    def python(self) -> str:
        return DISTROS[self.distro][0]

    @property
    def accelerator(self) -> str:
        return DISTROS[self.distro][1]

    @property
    def login_home(self) -> str:
        return "/root" if self.login_user == "root" else f"/home/{self.login_user}"

    @property
    def network(self) -> ipaddress.IPv4Network:
        return ipaddress.ip_network(self.subnet)

    @property
    def threads_per_rank(self) -> int:
        """This machine's cores shared out between every rank of every host (at least one each):
        the inventory's train_threads, which each rank gets."""
        return max(1, (os.cpu_count() or 1) // (self.hosts * self.ranks))

    @property
    def names(self) -> list[str]:
        return host_names(self.hosts)

    @property
    def bridge(self) -> str:
        return f"{self.prefix}-br"

    @property
    def bridge_ip(self) -> str:
        return str(self.network[1])

    def host_ip(self, name: str) -> str:
        return str(self.network[11 + self.names.index(name)])

    @property
    def cluster_bridge(self) -> str:
        return f"{self.prefix}-cbr"

    @property
    def cluster_network(self) -> ipaddress.IPv4Network:
        """Exists only inside the hosts' namespaces (the controller's side of the bridge has no
        address, so no route): it cannot clash with this machine's networks or another lab's."""
        return ipaddress.ip_network(CLUSTER_SUBNET)

    def cluster_ip(self, name: str) -> str:
        return str(self.cluster_network[11 + self.names.index(name)])

    def cluster_veth(self, name: str) -> str:
        return f"{self.prefix}-{name}c"

    def peer_ip(self, name: str) -> str:
        """The address the other hosts reach `name` at: its cluster address where there is one."""
        return self.cluster_ip(name) if self.cluster_net else self.host_ip(name)

    def links(self, name: str) -> list[str]:
        """Every link that joins `name` to the others, as seen from the controller (its cable(s))."""
        return [self.veth(name)] + ([self.cluster_veth(name)] if self.cluster_net else [])

    def netns(self, name: str) -> str:
        return f"{self.prefix}-{name}"

    def veth(self, name: str) -> str:
        """The host's link as seen from the controller (the host itself sees eth0)."""
        return f"{self.prefix}-{name}"

    @property
    def state(self) -> Path:
        return self.state_root / self.prefix

    def host_dir(self, name: str) -> Path:
        return self.state / "hosts" / name

    @property
    def key(self) -> Path:
        return self.state / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.state / "known_hosts"

    @property
    def repo_url(self) -> str:
        return f"http://{self.bridge_ip}:{self.http_port}"

    @property
    def default_inventory(self) -> Path:
        name = "lab.yml" if self.prefix == "tandem" else f"lab-{self.prefix}.yml"
        return Path(__file__).resolve().parent.parent / "inventory" / name
