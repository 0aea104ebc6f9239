"""`fab init`'s options, checked into an InventorySpec: the first bad one raises OptionError naming it
(`--hosts-at: '203.0.113.300' is not an IP address or a host name`), before anything is written or reached.
"""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path

from .. import hostvars
from ..cluster import CLUSTER_GROUP
from ..errors import OptionError

_LABEL = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")
_HOST_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_USER = re.compile(r"^[a-z_][a-z0-9_.-]{0,31}$")
_RESERVED = {"all", "ungrouped", CLUSTER_GROUP}  # Ansible's groups and tandem's: no host may be named so


@dataclass(frozen=True)
class NewHost:
    name: str
    address: str  # ansible_host
    cluster_address: str | None = None  # None: where its peers reach it, found on the host (train.onboard.peer_address)
    gpus: int | None = None  # None: as many as the host shows (fab init asks it), unknown until it answers
    port: int | None = None  # its SSH port (`host:2222`), None: --port's, else 22
    nic: str | None = None  # cluster_nic, found on the host; None: unknown until it answers
    answered: bool = True  # False: fab init asked it and it did not answer
    data_device: str | None = None  # None: --data-device's, every host's
    vars: tuple[tuple[str, object], ...] = ()  # its other host variables (fab init --from: the cluster's record)


@dataclass(frozen=True)
class Found:
    """What a host's answer tells the inventory: its GPUs, and where its peers reach it (None: not known)."""

    gpus: int | None = None
    nic: str | None = None
    cluster_address: str | None = None


@dataclass(frozen=True)
class InventorySpec:
    """What the new inventory says; every value checked."""

    hosts: tuple[NewHost, ...]
    user: str
    key: str | None = None
    known_hosts: str | None = None
    data_device: str = "none"
    hourly_usd: float | None = None
    extra: tuple[tuple[str, object], ...] = ()  # --vars: any other of tandem's host variables, every host's
    port: int | None = None  # --port: every host's SSH port but those given with theirs

    def with_found(self, found: dict[str, Found]) -> InventorySpec:
        """Each host with what its answer showed where the options said nothing: its GPUs, its cluster NIC and
        address (--cluster-at's address stays). A host that did not answer keeps them unknown, never guessed."""
        def known(h: NewHost) -> NewHost:
            seen = found.get(h.name, Found())
            return replace(h, gpus=h.gpus if h.gpus is not None else seen.gpus, nic=h.nic or seen.nic,
                           cluster_address=h.cluster_address or seen.cluster_address, answered=h.name in found)
        return replace(self, hosts=tuple(known(h) for h in self.hosts))

    def unknown(self) -> dict[str, str]:
        """{host: which of its variables are unknown, and why} for each host the inventory lacks some for."""
        out = {}
        for h in self.hosts:
            if not h.answered:
                missing = [v for v, have in (("gpus", h.gpus is not None), ("cluster_nic", h.nic)) if not have]
                out[h.name] = (f"did not answer: its {', '.join(missing)} unknown (no guess): run the same fab init "
                               "with --force once it answers (fab init --check writes nothing)")
            elif not h.nic:
                out[h.name] = ("showed no route toward its peers: its cluster_nic unknown (fab init --check names its "
                               "NICs: set cluster_nic)")
        return out


def split(text: str | None) -> list[str]:
    return [part.strip() for part in (text or "").split(",") if part.strip()]


def address(option: str, text: str) -> str:
    """An IP address, or a DNS name (one made of numbers only must be an IP address: 203.0.113.300 is not)."""
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        pass
    labels = text.rstrip(".").split(".")
    if len(text) > 253 or not all(_LABEL.match(label) for label in labels) or labels[-1].isdigit():
        raise OptionError(option, f"{text!r} is not an IP address or a host name")
    return text


def address_port(option: str, text: str) -> tuple[str, int | None]:
    """`203.0.113.10`, `203.0.113.10:2222`, `[2001:db8::1]:2222` or a bare IPv6 address: (address, its port or None)."""
    bracketed = re.fullmatch(r"\[([^\]]+)\](?::(.*))?", text)
    if bracketed:
        host, port_text = bracketed[1], bracketed[2]
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    else:
        host, port_text = text, None
    if port_text is None:
        return address(option, host), None
    port = int(port_text) if port_text.isdigit() else 0
    if not 1 <= port <= 65535:
        raise OptionError(option, f"{text!r}: the port after ':' must be a whole number from 1 to 65535")
    return address(option, host), port


def addresses(option: str, text: str | None, count: int | None = None) -> list[str]:
    found = [address(option, part) for part in split(text)]
    if count is not None and len(found) != count:
        raise OptionError(option, f"gives {len(found)} addresses for {count} hosts: one per host, in the same order")
    if len(set(found)) != len(found):
        raise OptionError(option, f"names an address twice ({', '.join(found)}): each host has its own")
    return found


def logins(text: str | None, default_port: int | None) -> list[tuple[str, int | None]]:
    """--hosts-at's (address, port) pairs; one machine may be given twice on two ports (a NAT's forwards)."""
    found = [address_port("hosts-at", part) for part in split(text)]
    reached = [(a, p or default_port or 22) for a, p in found]
    if len(set(reached)) != len(reached):
        raise OptionError("hosts-at", f"names an address twice ({', '.join(split(text))}): each host has its own "
                                      "(or its own SSH port: 203.0.113.10:2222)")
    return found


def host_names(text: str | None, count: int, gpus: int | None) -> list[str]:
    """The hosts' inventory names: --names, else gpu1, gpu2, ... (cpu1, ... with --gpus 0)."""
    names = split(text) or [f"{'cpu' if gpus == 0 else 'gpu'}{i}" for i in range(1, count + 1)]
    if len(names) != count:
        raise OptionError("names", f"gives {len(names)} names for {count} hosts (--hosts-at): one per host")
    for name in names:
        if not _HOST_NAME.match(name) or name in _RESERVED:
            raise OptionError("names", f"{name!r} cannot name a host: letters, digits, '-', '_' and '.', "
                                    f"not {', '.join(sorted(_RESERVED))}")
    if len(set(names)) != len(names):
        raise OptionError("names", f"names a host twice ({', '.join(names)})")
    return names


def a_file(option: str, text: str | None) -> str | None:
    """A file as the inventory will say it (~ kept, a relative path made absolute)."""
    if not text:
        return None
    path = Path(os.path.expanduser(text))
    if option == "key" and text.endswith(".pub"):
        raise OptionError("key", f"{text} is a public key: give the private one ({text[:-4]})")
    if not path.is_file():
        raise OptionError(option, f"no such {'key ' if option == 'key' else ''}file: {text}")
    return text if text.startswith("~") else str(path.resolve())


def whole(option: str, text: str | None) -> int | None:
    if text in (None, ""):
        return None
    if not str(text).strip().isdigit():
        raise OptionError(option, f"{text!r} is not a whole number (0 or more)")
    return int(str(text).strip())


def ssh_port(text: str | None) -> int | None:
    port = whole("port", text)
    if port is not None and not 1 <= port <= 65535:
        raise OptionError("port", f"{text!r} is not a port (1 to 65535)")
    return port


def price(text: str | None) -> float | None:
    if text in (None, ""):
        return None
    try:
        value = float(str(text))
    except ValueError:
        raise OptionError("hourly-usd", f"{text!r} is not US dollars per hour (a number, e.g. 2.5)") from None
    if not value >= 0:
        raise OptionError("hourly-usd", f"{text!r} is not US dollars per hour (0 or more)")
    return value


def device(text: str | None) -> str:
    device = (text or "none").strip()
    if device != "none" and not re.match(r"^/dev/[A-Za-z0-9/_-]+$", device):
        raise OptionError("data-device", f"{device!r} is neither a block device (/dev/nvme1n1) nor `none`")
    return device


def host_variables(text: str | None) -> tuple[tuple[str, object], ...]:
    """`--vars network_expected_mbps=25000,data_volume_min_free_gb=50`: each one of tandem's host variables
    (train.hostvars, docs/inventory.md), its value of the variable's type."""
    out = []
    for item in split(text):
        name, sep, raw = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise OptionError("vars", f"{item!r}: expected NAME=VALUE, e.g. network_expected_mbps=25000")
        try:
            var = hostvars.defined(name)
        except KeyError:
            raise OptionError("vars", f"{name!r} is not one of tandem's host variables (docs/inventory.md)") from None
        try:
            out.append((name, var.kind.parse(raw.strip())))
        except ValueError:
            raise OptionError("vars", f"{name} must be {var.kind.must}, got {raw.strip()!r}") from None
    return tuple(out)


def spec_from_options(hosts_at: str | None, user: str | None, key: str | None = None, names: str | None = None,
                      cluster_at: str | None = None, gpus: str | None = None, data_device: str | None = None,
                      hourly_usd: str | None = None, known_hosts: str | None = None,
                      vars: str | None = None, port: str | None = None) -> InventorySpec:
    """The options, checked in the order a user gives them."""
    every_port = ssh_port(port)
    found = logins(hosts_at, every_port)
    if not found:
        raise OptionError("hosts-at", "give the hosts' addresses, comma-separated (--hosts-at "
                                      "203.0.113.10,203.0.113.11), or --check to check the inventory you have")
    if not user:
        raise OptionError("user", "give the hosts' login user (ubuntu on Ubuntu images, debian on Debian, "
                                  "ec2-user on Amazon Linux)")
    if not _USER.match(user):
        raise OptionError("user", f"{user!r} is not a login name")
    count = whole("gpus", gpus)
    private = addresses("cluster-at", cluster_at, len(found)) if cluster_at else [None] * len(found)
    hosts = tuple(NewHost(n, a, c, count, p) for n, (a, p), c in
                  zip(host_names(names, len(found), count), found, private, strict=True))
    return InventorySpec(hosts, user, a_file("key", key), a_file("known-hosts", known_hosts),
                         device(data_device), price(hourly_usd), host_variables(vars), every_port)
