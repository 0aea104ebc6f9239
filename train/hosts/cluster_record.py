"""The cluster's record on every host, /etc/tandem/cluster.json: what another laptop rebuilds the inventory
and checks the cluster key from (`fab init --from HOST`, train.onboard.follow). Provisioning writes it
(roles/network's `cluster_record` filter: `record` here), readable by every login user:

    {"version": 1, "group": "cluster", "user": "ubuntu", "train_user": "ubuntu",
     "hosts": [{"name": "v100a", "address": "203.0.113.10", "port": 22, "cluster_address": "10.0.0.10",
                "cluster_nic": "ens5", "gpus": 1, "data_device": "none", "vars": {"hourly_usd": 2.48}}, ...],
     "cluster_key": "ssh-ed25519 AAAA... tandem cluster cluster"}

The hosts in the inventory's order (the rank order); `vars`: the other tandem host variables the inventory
gave (train.hostvars), not the laptop's own files (its SSH key, its known_hosts). The cluster key's private
half is not in it: it lies at the training user's ~/.ssh/tandem_cluster (0600, roles/common).
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .. import hostvars

PATH = "/etc/tandem/cluster.json"
PRIVATE_KEY = ".ssh/tandem_cluster"  # in the training user's home (roles/common/tasks/cluster_key.yml)
VERSION = 1
OWN = ("ansible_host", "ansible_port", "ansible_user", "cluster_address", "cluster_nic", "gpus", "data_device")
LAPTOPS = ("ansible_ssh_private_key_file", "tandem_known_hosts_file")  # each laptop's own files


def record(names: Sequence[str], variables: Mapping[str, Mapping], group: str, public_key: str) -> dict:
    """The record from Ansible's hostvars (`variables`: {host: its variables}): each host's login, where
    its peers reach it (preflight_address), its cluster NIC (network_cluster_nic), GPUs and data device."""
    def entry(name: str) -> dict:
        v = variables[name]
        given = {k: v[k] for k in (x.name for x in hostvars.VARIABLES)
                 if k not in OWN + LAPTOPS and not k.startswith("ansible_") and v.get(k) not in (None, "")}
        return {"name": name, "address": str(v.get("ansible_host") or name), "port": int(v.get("ansible_port") or 22),
                "cluster_address": str(v.get("preflight_address") or v.get("cluster_address") or v.get("ansible_host")
                                       or name),
                "cluster_nic": str(v.get("network_cluster_nic") or v.get("cluster_nic") or ""),
                "gpus": int(v.get("gpus") or 0), "data_device": str(v.get("data_device") or "none"), "vars": given}

    first = variables[names[0]] if names else {}
    user = str(first.get("ansible_user") or "")
    return {"version": VERSION, "group": group, "user": user, "train_user": str(first.get("train_user") or user),
            "hosts": [entry(n) for n in names], "cluster_key": public_key.strip()}


@dataclass(frozen=True)
class RecordedHost:
    name: str
    address: str
    port: int
    cluster_address: str
    cluster_nic: str
    gpus: int
    data_device: str
    vars: tuple[tuple[str, object], ...] = ()


@dataclass(frozen=True)
class Record:
    hosts: tuple[RecordedHost, ...]
    user: str
    train_user: str
    cluster_key: str  # the public half, an authorized_keys line


def parse(text: str) -> Record:
    """The record's text read; ValueError saying what is wrong (not JSON, a field missing)."""
    try:
        data = json.loads(text)
        hosts = tuple(RecordedHost(str(h["name"]), str(h["address"]), int(h["port"]), str(h["cluster_address"]),
                                   str(h.get("cluster_nic") or ""), int(h["gpus"]), str(h.get("data_device") or "none"),
                                   tuple(sorted((h.get("vars") or {}).items())))
                      for h in data["hosts"])
        return Record(hosts, str(data["user"]), str(data.get("train_user") or data["user"]), str(data["cluster_key"]))
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise ValueError(f"not a cluster record ({type(err).__name__}: {err})") from None


def fingerprint(public_key: str) -> str:
    """`SHA256:...` as `ssh-keygen -lf` prints it, of an authorized_keys line."""
    blob = base64.b64decode(public_key.split()[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def public_of(private_key: str) -> str:
    """The public half (`ssh-ed25519 AAAA...`) of an OpenSSH private key's text; ValueError when it is none."""
    import paramiko  # the controller's; the record itself needs no SSH library

    for kind in (paramiko.Ed25519Key, paramiko.ECDSAKey, paramiko.RSAKey):
        try:
            key = kind.from_private_key(io.StringIO(private_key))
        except (paramiko.SSHException, ValueError):
            continue
        return f"{key.get_name()} {key.get_base64()}"
    raise ValueError("not an OpenSSH private key")


def same_key(private_key: str, public_key: str) -> bool:
    """Whether `private_key` is the private half of the authorized_keys line `public_key`."""
    return public_of(private_key).split()[:2] == public_key.split()[:2]
