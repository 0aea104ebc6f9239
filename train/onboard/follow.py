"""`fab init --from HOST`: another laptop's inventory and cluster key, rebuilt from the hosts themselves.

    fab init --from 203.0.113.10 --user ubuntu --key ~/.ssh/id_ed25519 [--port 22] [--known-hosts FILE] \\
             [--out inventory/mine.yml] [--force]

Provisioning leaves the cluster's record on every host (/etc/tandem/cluster.json, train.hosts.cluster_record):
the hosts' names in rank order, their addresses, SSH ports, cluster addresses and NICs, GPUs, data devices.
The cluster key's private half is read from the training user's ~/.ssh/tandem_cluster there (the login user's
own, else through `sudo -n`), checked against the record's public half, and written beside the inventory
(.tandem_cluster_key, as provisioning keeps it: a `--limit NEW` keeps the cluster's key). Then `fab init`
goes on as always: every host asked, the file written, one table.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ..cluster import ClusterError, Host, run_all
from ..errors import OptionError
from ..hosts import cluster_record
from ..reachability import CLOUD_USERS, require_answered
from . import spec as options
from .spec import InventorySpec, NewHost

KEY_FILE = ".tandem_cluster_key"  # beside the inventory: roles/common's common_cluster_key
DESCRIBING = ("hosts_at", "names", "gpus", "cluster_at", "data_device", "hourly_usd", "vars")
READ_S = 30


def login(from_host: str, user: str | None, key: str | None = None, known_hosts: str | None = None,
          port: str | None = None,
          **describing: str | None) -> Host:
    """The host to read the record from, its options checked (OptionError): --from's address, --user, ..."""
    if given := [f"--{o.replace('_', '-')}" for o, v in describing.items() if v]:
        raise OptionError("from", f"reads the hosts from the cluster's record; {', '.join(given)} describe them "
                                  "yourself: drop --from or them")
    address, own_port = options.address_port("from", from_host)
    if not user:
        raise OptionError("user", f"give the login user you reach {from_host} with ({CLOUD_USERS})")
    return Host("from", address, user=user, port=own_port or options.ssh_port(port) or 22,
                key=options.a_file("key", key), known_hosts=options.a_file("known-hosts", known_hosts))


def fetch(host: Host) -> tuple[cluster_record.Record, str]:
    """The host's cluster record and the cluster key's private half, checked against the record's public
    one; ClusterError saying what is missing and the fix (an unreachable host said as unreachable)."""
    where = f"{host.user}@{host.address}"
    results = run_all([host], f"cat {cluster_record.PATH}", timeout=READ_S)
    require_answered([host], results)
    said = results[host.name]
    if not said.ok:
        raise ClusterError(f"{where} holds no cluster record ({cluster_record.PATH}: {said.why}): provisioning "
                           "writes it; from the laptop that provisioned the cluster, run `ansible-playbook "
                           "provision.yml` once more (or give --from another of its hosts)")
    try:
        record = cluster_record.parse(said.stdout)
    except ValueError as err:
        raise ClusterError(f"{where}:{cluster_record.PATH} is {err}") from None
    home = "~" if record.train_user == host.user else f"~{record.train_user}"
    path = f"{home}/{cluster_record.PRIVATE_KEY}"
    if not re.fullmatch(r"[a-z_][a-z0-9_.-]{0,31}", record.train_user):
        raise ClusterError(f"{where}:{cluster_record.PATH} names no login user as train_user: "
                           f"{record.train_user!r}")
    read = f"cat {path}" if home == "~" else f"sudo -n cat {path}"  # ~USER: the shell's, unquoted
    results = run_all([host], read, timeout=READ_S)
    require_answered([host], results)
    if not results[host.name].ok:
        raise ClusterError(f"{where}: the cluster key's private half at {path} cannot be read "
                           f"({results[host.name].why}): it is {record.train_user}'s (0600); log in as "
                           f"{record.train_user} (--user {record.train_user}) or as a user with passwordless "
                           f"sudo, or copy {KEY_FILE} from the laptop that provisioned the cluster beside "
                           "your inventory")
    private = results[host.name].stdout
    try:
        same = cluster_record.same_key(private, record.cluster_key)
    except ValueError as err:
        raise ClusterError(f"{where}: {path} is {err}") from None
    if not same:
        raise ClusterError(f"{where}: {path} is not the cluster key the record names "
                           f"({cluster_record.fingerprint(record.cluster_key)}): provisioning was interrupted there? "
                           "give --from another of the cluster's hosts")
    return record, private


def spec_of(record: cluster_record.Record, host: Host) -> InventorySpec:
    """The inventory the record describes, logged in to as `host` is (this laptop's user, key, known_hosts)."""
    hosts = tuple(NewHost(h.name, h.address, h.cluster_address, h.gpus, h.port if h.port != 22 else None,
                          h.cluster_nic or None, data_device=h.data_device, vars=h.vars) for h in record.hosts)
    return InventorySpec(hosts, host.user, host.key, host.known_hosts)


def write_key(inventory: Path, record: cluster_record.Record, private: str, force: bool) -> Path:
    """The cluster key beside the inventory (0600, its .pub beside it); another key there is refused unless
    `force` (it would be another cluster's: provisioning would hand it to these hosts)."""
    path = inventory.parent / KEY_FILE
    if path.exists() and not force:
        try:
            same = cluster_record.same_key(path.read_text(), record.cluster_key)
        except ValueError:
            same = False
        if not same:
            raise OptionError("from", f"{path} holds another cluster key than these hosts' "
                                      f"({cluster_record.fingerprint(record.cluster_key)}): give --force to "
                                      "replace it, or another --out in a directory of its own")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(private if private.endswith("\n") else private + "\n")
    os.chmod(path, 0o600)
    path.with_name(KEY_FILE + ".pub").write_text(record.cluster_key + "\n")
    return path
