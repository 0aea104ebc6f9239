"""Where a host's peers reach it: its cluster NIC and address, from what `ip -j addr show` and
`ip -j route show` print on every host (train.onboard.probe asks them). Pure: recorded outputs in, a choice out.

On a cloud VM the address SSH reaches is often a public one NAT'd onto the VM (on none of its NICs), and
the VMs reach each other at their private addresses. A host's cluster address is the source address of
its route toward a peer's private address, its cluster NIC that route's device:

    peer v100b has 10.0.0.11 on ens5      v100a's route to it: 10.0.0.0/24 dev ens5 src 10.0.0.10
    -> v100a: cluster_nic ens5, cluster_address 10.0.0.10

A peer's addresses are tried in this order: its private ones other than its SSH address (a network of
its own for the cluster: the controller reaches the host on another), its SSH address when it is one
of its own, its other addresses, then the SSH address as given (an unanswered peer's). The first one
the host has a route to decides, toward the first peer (rank order), as roles/network picks the NIC.
An address both hosts hold (docker0's 172.17.0.1) is nobody's peer address. IPv4 only.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Sequence
from dataclasses import dataclass

IPv4 = ipaddress.IPv4Address


@dataclass(frozen=True)
class Address:
    """One IPv4 address on one of the host's NICs (up, not loopback, global scope)."""

    nic: str
    address: IPv4
    prefix: int

    @property
    def network(self) -> ipaddress.IPv4Network:
        return ipaddress.ip_network(f"{self.address}/{self.prefix}", strict=False)


@dataclass(frozen=True)
class Route:
    """One route of the host's main IPv4 table."""

    dst: ipaddress.IPv4Network  # default: 0.0.0.0/0
    dev: str
    gateway: IPv4 | None = None
    prefsrc: IPv4 | None = None
    metric: int = 0


@dataclass(frozen=True)
class Side:
    """Where the peers reach a host: the NIC and its address there."""

    nic: str
    address: str


def _ip(text: object) -> IPv4 | None:
    try:
        found = ipaddress.ip_address(str(text))
    except ValueError:
        return None
    return found if isinstance(found, IPv4) else None


def _json_list(text: str) -> list:
    try:
        found = json.loads(text or "[]")
    except ValueError:
        return []
    return [e for e in found if isinstance(e, dict)] if isinstance(found, list) else []


def addresses(addr_json: str) -> tuple[Address, ...]:
    """`ip -j addr show`'s IPv4 addresses that can carry cluster traffic: on a NIC that is up (not a DOWN
    docker0 without containers), not loopback, of global scope. An answer that is no JSON: none."""
    found = []
    for link in _json_list(addr_json):
        if link.get("link_type") == "loopback" or "UP" not in (link.get("flags") or []) \
                or link.get("operstate") == "DOWN":
            continue
        for info in link.get("addr_info") or []:
            ip = _ip(info.get("local"))
            if info.get("family") == "inet" and info.get("scope", "global") == "global" and ip is not None:
                found.append(Address(str(link.get("ifname", "")), ip, int(info.get("prefixlen", 32))))
    return tuple(found)


def routes(route_json: str) -> tuple[Route, ...]:
    """`ip -j route show`'s unicast routes (a blackhole or unreachable route carries nothing)."""
    found = []
    for entry in _json_list(route_json):
        if entry.get("type", "unicast") != "unicast" or not entry.get("dev"):
            continue
        dst = str(entry.get("dst", ""))
        try:
            network = ipaddress.ip_network("0.0.0.0/0" if dst == "default" else dst, strict=False)
        except ValueError:
            continue
        if isinstance(network, ipaddress.IPv4Network):
            found.append(Route(network, str(entry["dev"]), _ip(entry.get("gateway")), _ip(entry.get("prefsrc")),
                               int(entry.get("metric", 0) or 0)))
    return tuple(found)


def route_to(table: Sequence[Route], destination: IPv4) -> Route | None:
    """The route the kernel takes toward `destination`: the longest prefix that holds it, then the lowest metric."""
    holding = [r for r in table if destination in r.dst]
    return min(holding, key=lambda r: (-r.dst.prefixlen, r.metric)) if holding else None


def source(route: Route, own: Sequence[Address], destination: IPv4) -> IPv4 | None:
    """The address the host sends from on `route`: its preferred source, else the NIC's address on the
    destination's (or the gateway's) network, else the NIC's first address."""
    if route.prefsrc is not None:
        return route.prefsrc
    on_nic = [a for a in own if a.nic == route.dev]
    near = [a for a in on_nic if destination in a.network or (route.gateway and route.gateway in a.network)]
    return (near + on_nic)[0].address if on_nic else None


def candidates(peer: Sequence[Address], ssh_address: str, own: Sequence[Address]) -> list[IPv4]:
    """A peer's addresses in the order tried (the module's docstring), less those the host holds itself."""
    ssh, mine = _ip(ssh_address), {a.address for a in own}
    theirs = [a.address for a in peer if a.address not in mine]
    ordered = [a for a in theirs if a.is_private and a != ssh] + [a for a in theirs if a == ssh] \
        + [a for a in theirs if not a.is_private and a != ssh] + ([ssh] if ssh is not None else [])
    return list(dict.fromkeys(a for a in ordered if a not in mine))


def cluster_side(own: Sequence[Address], table: Sequence[Route],
                 peers: Sequence[tuple[Sequence[Address], str]]) -> Side | None:
    """Where the peers reach a host: `own` its addresses, `table` its routes, `peers` each other host's
    (addresses, SSH address) in rank order (no addresses: it did not answer). Toward a peer, an address
    a route of its own leads to (its subnet's, a private network's) goes before one only the default
    route leads to. A host without peers: its default route's. None when the host answered no
    addresses, or no route leads to any peer."""
    if not own:
        return None
    nics = {a.nic for a in own}
    tried = False
    for addrs, ssh in peers:
        routed = [(t, route_to(table, t)) for t in candidates(addrs, ssh, own)]
        tried = tried or bool(routed)
        for target, route in sorted(routed, key=lambda tr: tr[1] is None or tr[1].dst.prefixlen == 0):
            sent_from = source(route, own, target) if route else None
            if route and sent_from is not None and route.dev in nics:
                return Side(route.dev, str(sent_from))
    if tried:
        return None
    default = route_to(table, IPv4("0.0.0.0"))
    sent_from = source(default, own, IPv4("0.0.0.0")) if default else None
    return Side(default.dev, str(sent_from)) if default and sent_from and default.dev in nics else None


def nic_of(own: Sequence[Address], address: str) -> str | None:
    """The NIC that holds `address` (an address given with --cluster-at), None when none does."""
    ip = _ip(address)
    return next((a.nic for a in own if a.address == ip), None)
