"""The lab's bridge, the hosts' links, and the checks that keep the lab off real networks."""

from __future__ import annotations

import ipaddress
import json
import os
from pathlib import Path

from lab.config import CLUSTER_NIC, LabConfig
from lab.shell import LabError, in_netns, ok, run
from train.plan.link import cap_command, parse_caps, rate_bits


def preflight(cfg: LabConfig) -> None:
    """Fail at once, saying what to do, when this machine cannot hold the lab."""
    require_privileges()
    require_free_subnet(cfg)


def require_privileges() -> None:
    if os.geteuid() != 0:
        raise LabError("the lab needs root (network namespaces, mounts, loop devices): run `sudo make lab-up`")
    if not Path("/proc/self/ns/net").exists() or not ok("unshare", "--net", "true"):
        raise LabError(
            "this kernel or container does not allow network namespaces (`unshare --net true` failed): "
            "run the lab on a VM or a privileged container"
        )


def require_free_subnet(cfg: LabConfig) -> None:
    busy = subnet_users(cfg)
    if busy:
        raise LabError(
            f"subnet {cfg.subnet} is already used on this machine by {', '.join(busy)}: "
            f"pick a free one, e.g. `make lab-up SUBNET=10.78.0.0/24`"
        )


def subnet_users(cfg: LabConfig) -> list[str]:
    """Interfaces and routes outside this lab that overlap its subnet."""
    ours = {cfg.bridge}
    users = []
    for link in json.loads(run("ip", "-j", "addr", "show").stdout or "[]"):
        for addr in link.get("addr_info", []):
            if addr.get("family") != "inet" or link["ifname"] in ours:
                continue
            net = ipaddress.ip_interface(f"{addr['local']}/{addr['prefixlen']}").network
            if net.overlaps(cfg.network):
                users.append(f"{link['ifname']} ({addr['local']}/{addr['prefixlen']})")
    for route in json.loads(run("ip", "-j", "route", "show").stdout or "[]"):
        dst = route.get("dst")
        if dst in (None, "default") or route.get("dev") in ours:
            continue
        if ipaddress.ip_network(dst, strict=False).overlaps(cfg.network):
            users.append(f"route {dst} via {route.get('dev')}")
    return users


def create_bridge(cfg: LabConfig) -> None:
    run("ip", "link", "add", cfg.bridge, "type", "bridge")
    run("ip", "addr", "add", f"{cfg.bridge_ip}/{cfg.network.prefixlen}", "dev", cfg.bridge)
    run("ip", "link", "set", cfg.bridge, "up")


def attach_host(cfg: LabConfig, name: str) -> None:
    """A namespace for the host and a veth into it: eth0 inside, on the bridge outside.
    No default route: the host can reach its peers and the bridge, nothing else."""
    ns, outside = cfg.netns(name), cfg.veth(name)
    run("ip", "netns", "add", ns)
    run("ip", "link", "add", outside, "type", "veth", "peer", "name", "eth0", "netns", ns)
    run("ip", "link", "set", outside, "master", cfg.bridge, "up")
    in_netns(ns, "ip", "link", "set", "lo", "up")
    in_netns(ns, "ip", "addr", "add", f"{cfg.host_ip(name)}/{cfg.network.prefixlen}", "dev", "eth0")
    in_netns(ns, "ip", "link", "set", "eth0", "up")


def create_cluster_bridge(cfg: LabConfig) -> None:
    """The private cluster network's switch: no address here, so the controller has no way onto it."""
    run("ip", "link", "add", cfg.cluster_bridge, "type", "bridge")
    run("ip", "link", "set", cfg.cluster_bridge, "up")


def attach_cluster_nic(cfg: LabConfig, name: str) -> str:
    """The host's second NIC, ens5, on the cluster bridge with its cluster address."""
    ns, outside = cfg.netns(name), cfg.cluster_veth(name)
    run("ip", "link", "add", outside, "type", "veth", "peer", "name", CLUSTER_NIC, "netns", ns)
    run("ip", "link", "set", outside, "master", cfg.cluster_bridge, "up")
    in_netns(ns, "ip", "addr", "add", f"{cfg.cluster_ip(name)}/{cfg.cluster_network.prefixlen}", "dev", CLUSTER_NIC)
    in_netns(ns, "ip", "link", "set", CLUSTER_NIC, "up")
    return CLUSTER_NIC


def link_nic(cfg: LabConfig) -> str:
    """The NIC the hosts talk to each other over: what `shape` caps."""
    return CLUSTER_NIC if cfg.cluster_net else "eth0"


def attach_slow_nic(cfg: LabConfig, name: str, mbps: int = 100) -> str:
    """A second NIC, eth1, that reports `mbps` to ethtool: the field reports' port trap.

    A veth's speed cannot be set (it always says 10000Mb/s); a tap's can, and a macvlan on
    it reports the same. It carries no traffic: it exists for the link-speed checks, and the
    lab's inventory makes it that host's cluster_nic (`make lab-up SLOW_NIC=v100b`)."""
    tap = f"{cfg.prefix}-{name}s"
    run("ip", "tuntap", "add", "dev", tap, "mode", "tap")
    run("ethtool", "-s", tap, "speed", str(mbps), "duplex", "full", "autoneg", "off")
    run("ip", "link", "set", tap, "up")
    # Created under its final name straight inside the host's namespace.
    run("ip", "link", "add", "link", tap, "name", "eth1", "netns", cfg.netns(name), "type", "macvlan",
        "mode", "bridge")
    in_netns(cfg.netns(name), "ip", "link", "set", "eth1", "up")
    return "eth1"


def shape(cfg: LabConfig, rate: str | None) -> None:
    """Cap every host's egress on its cluster NIC with the tc tbf line `fab bench-step` uses
    (train.plan.link); rate None or 'none' lifts the cap. Reads the caps back: a host that
    did not take the change is an error naming it."""
    try:
        line = cap_command(link_nic(cfg), rate or "none", sudo=False)  # root, through ip netns exec
        bits = rate_bits(rate or "none")
    except ValueError as err:
        raise LabError(str(err)) from None
    for name in cfg.names:
        in_netns(cfg.netns(name), "sh", "-c", line, check=False)
    wrong = {name: cap for name, cap in current_caps(cfg).items() if (cap is None) != (bits is None)}
    if wrong:
        raise LabError("the cap did not change on " + ", ".join(f"{n} (tc shows {c or 'no cap'})"
                                                                for n, c in wrong.items()))


def current_caps(cfg: LabConfig) -> dict[str, str | None]:
    return {name: parse_caps(in_netns(cfg.netns(name), "tc", "qdisc", "show", "dev", link_nic(cfg),
                                      check=False).stdout)
            for name in cfg.names}


def existing_namespaces(cfg: LabConfig) -> list[str]:
    out = run("ip", "netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(f"{cfg.prefix}-")]


def remove(cfg: LabConfig) -> list[str]:
    """Delete this lab's namespaces, links and bridge; returns what was removed."""
    removed = []
    for ns in existing_namespaces(cfg):
        run("ip", "netns", "del", ns, check=False)
        removed.append(f"netns {ns}")
    links = json.loads(run("ip", "-j", "link", "show").stdout or "[]")
    for link in links:
        name = link["ifname"]
        if name == cfg.bridge or name.startswith(f"{cfg.prefix}-"):
            run("ip", "link", "del", name, check=False)
            removed.append(f"link {name}")
    return removed
