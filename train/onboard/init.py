"""`fab init`: a newcomer's inventory from addresses, login user and key, then a check of every host.

    fab init --hosts-at 203.0.113.10,203.0.113.11:2222 --user ubuntu --key ~/.ssh/id_ed25519 \\
             [--port 22] [--names gpu1,gpu2] [--gpus 1] [--cluster-at 10.0.0.10,10.0.0.11] [--data-device none] \\
             [--hourly-usd 2.5] [--known-hosts FILE] [--out inventory/mine.yml] [--force]
    fab init --check          the inventory fab reads (train.onboard.inventory)
    fab init --from HOST --user ubuntu [--key ...]   another laptop's: from the cluster's record (train.onboard.follow)

The options are checked first (train.onboard.spec); then the hosts are asked, once, all at once
(train.onboard.check). Each host is written with what it shows where no option said it: its GPUs
(nvidia-smi, else its PCI bus), its cluster NIC and address (the route toward its peers' private
addresses, train.onboard.peer_address; --cluster-at gives the address). A host that does not answer is written
without them (never a guess), and the file says so. The file is written, read back as every fab
task reads it, and checked: one table, each problem with its fix. Exit 0: every host passes; 1: a
host fails; 2: bad input (an OptionError).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

import yaml
from rich.markup import escape

from .. import hostvars
from ..cluster import CLUSTER_GROUP, TOP, GroupResult, Host, load_hosts
from ..errors import DONE, FAILED, OptionError
from ..hosts import cluster_record
from . import check as hostcheck
from . import follow, inventory, peer_address, probe
from .spec import Found, InventorySpec, spec_from_options

DEFAULT_OUT = inventory.DEFAULT  # what fab reads when FABRIC_INVENTORY names nothing


def layout(spec: InventorySpec) -> tuple[dict, dict, dict[str, dict]]:
    """(every host's variables, the cluster group's, each host's own): inventory/hosts.yml's shape."""
    common: dict[str, object] = {"ansible_user": spec.user, "ansible_become": True}
    if spec.port:
        common["ansible_port"] = spec.port
    if spec.key:
        common["ansible_ssh_private_key_file"] = spec.key
    if spec.known_hosts:  # fab reads the first, Ansible's ssh the second
        common.update(tandem_known_hosts_file=spec.known_hosts,
                      ansible_ssh_common_args=f"-o UserKnownHostsFile={spec.known_hosts}")
    group = {**({"hourly_usd": spec.hourly_usd} if spec.hourly_usd is not None else {}), **dict(spec.extra)}
    entries: dict[str, dict] = {}
    for host in spec.hosts:
        entry: dict[str, object] = {"ansible_host": host.address}
        if host.port:
            entry["ansible_port"] = host.port
        if host.cluster_address:
            entry["cluster_address"] = host.cluster_address
        if host.nic:
            entry["cluster_nic"] = host.nic
        if host.gpus is not None:
            entry["gpus"] = host.gpus
        entries[host.name] = {**entry, "data_device": host.data_device or spec.data_device, **dict(host.vars)}
    for name in {*common, *group, *(k for e in entries.values() for k in e)}:
        if not name.startswith("ansible_"):  # Ansible's own stay Ansible's
            hostvars.defined(name)  # a name tandem does not read would be a typo
    return common, group, entries


def render(spec: InventorySpec, out: str = DEFAULT_OUT, read_unnamed: bool | None = None) -> str:
    """The inventory's text, a few lines of comment on top (a host that did not answer named there).
    `read_unnamed`: fab reads `out` without FABRIC_INVENTORY (fabric.yaml's; None: `out` is DEFAULT_OUT)."""
    common, group, entries = layout(spec)
    cluster: dict[str, object] = {"hosts": entries, **({"vars": group} if group else {})}
    read_unnamed = out == DEFAULT_OUT if read_unnamed is None else read_unnamed
    fab = "fab" if read_unnamed else f"FABRIC_INVENTORY={out} fab"
    header = (f"# tandem's inventory, written by `fab init`. Every variable tandem reads: docs/inventory.md.\n"
              f"# The host order is the rank order (the first host is rank 0's, the rendezvous).\n"
              f"#   {fab} init --check          check the hosts again\n"
              f"#   ansible-playbook -i {out} provision.yml          provision them\n"
              f"#   {fab} info, {fab} train, ...\n")
    for name, why in spec.unknown().items():
        header += f"# {name} {why}\n"
    return header + yaml.safe_dump({"all": {"vars": common, "children": {CLUSTER_GROUP: cluster}}}, sort_keys=False)


def hosts_of(spec: InventorySpec) -> list[Host]:
    """The hosts as fab will read them from the file, to ask them before it is written."""
    common, group, entries = layout(spec)
    hosts = []
    for name, entry in entries.items():
        variables = {**common, **group, **entry}
        hosts.append(Host(name, entry["ansible_host"], user=spec.user, port=int(variables.get("ansible_port") or 22),
                          key=spec.key, known_hosts=spec.known_hosts, gpus=int(entry.get("gpus") or 0),
                          nic=entry.get("cluster_nic"), data_device=str(entry["data_device"]), vars=variables,
                          cluster_address=str(entry.get("cluster_address") or "")))
    return hosts


def found(spec: InventorySpec, results: GroupResult) -> dict[str, Found]:
    """What each host that answered shows: its GPUs (nvidia-smi's, else, no driver yet, its PCI bus's), and
    where its peers reach it (train.onboard.peer_address: the route toward their private addresses; with
    --cluster-at, the NIC holding the address given, else the route toward the peers' given addresses). Pure."""
    facts = {name: probe.parse(r.stdout) for name, r in results.items() if r.ok}
    out = {}
    for host in spec.hosts:
        if host.name not in facts:
            continue
        mine = facts[host.name]
        if host.cluster_address:
            peers = [((), p.cluster_address or p.address) for p in spec.hosts if p.name != host.name]
        else:
            peers = [(facts[p.name].addresses if p.name in facts else (), p.address)
                     for p in spec.hosts if p.name != host.name]
        side = peer_address.cluster_side(mine.addresses, mine.routes, peers)
        nic = (peer_address.nic_of(mine.addresses, host.cluster_address) if host.cluster_address else None) or \
            (side.nic if side else None)
        out[host.name] = Found(mine.gpus_seen if mine.gpus_seen is not None else mine.pci_gpus, nic,
                               side.address if side and not host.cluster_address else None)
    return out


def out_path(out: str | None) -> Path:
    path = Path(os.path.expanduser(out or DEFAULT_OUT))
    return path if path.is_absolute() else TOP / path


def refuse_existing(path: Path, force: bool, shown: str) -> None:
    """An existing file only with `force`; a directory that does not exist never (a typo would make it)."""
    if not path.parent.is_dir():
        raise OptionError("out", f"{shown}: no directory {path.parent}: create it, or give another --out")
    if path.exists() and not force:
        raise OptionError("out", f"{shown} exists: give --force to overwrite it, or another --out")


def write(spec: InventorySpec, path: Path, force: bool = False, shown: str = DEFAULT_OUT,
          read_unnamed: bool | None = None) -> Path:
    """Write the inventory; an existing file only with `force`, into a directory that exists."""
    refuse_existing(path, force, shown)
    path.write_text(render(spec, shown, read_unnamed))
    return path


def init(console, configured: str | None, *, check: bool = False, out: str | None = None, force: bool = False,
         from_host: str | None = None, **options: str | None) -> int:
    """Write the inventory from `options` (spec_from_options' names), or from the cluster's record on
    `from_host` (train.onboard.follow), or with `check` take the configured one; check every host; the exit
    status (train.errors). A bad option raises OptionError before anything is written or reached; an
    inventory tandem cannot read (a value of the wrong type) raises ClusterError."""
    if check:
        if given := [f"--{o.replace('_', '-')}" for o, v in {**options, "out": out, "from": from_host}.items()
                     if v]:
            raise OptionError("check", f"checks the inventory you have (FABRIC_INVENTORY, else fabric.yaml's "
                                       f"inventory); {', '.join(given)} write a new one: drop --check or them")
        path = inventory.choose(configured).path  # unnamed and missing: refused with the fix
        if not path.exists():
            raise OptionError("check", f"inventory {path} does not exist: write one with fab init --hosts-at ...")
        hosts = inventory.load(configured, lambda note: print(note, file=sys.stderr))
        with console.status(f"asking {len(hosts)} hosts over SSH"):
            results = hostcheck.ask(hosts)
    else:
        path, shown = out_path(out), out or DEFAULT_OUT
        read_unnamed = not os.environ.get("FABRIC_INVENTORY") and path == unnamed_path(configured)
        if from_host:
            reading = follow.login(from_host, **options)  # type: ignore[arg-type]
            refuse_existing(path, force, shown)
            with console.status(f"reading the cluster's record on {from_host}"):
                record, private = follow.fetch(reading)
            spec = follow.spec_of(record, reading)
            key = follow.write_key(path, record, private, force)
            console.print(f"cluster key {cluster_record.fingerprint(record.cluster_key)} (checked against the "
                          f"record's public half): wrote {escape(str(key))}")
        else:
            spec = spec_from_options(**options)
            refuse_example(spec, read_unnamed)
            refuse_existing(path, force, shown)
        with console.status(f"asking {len(spec.hosts)} hosts over SSH"):
            results = hostcheck.ask(hosts_of(spec))
        write(spec.with_found(found(spec, results)), path, force=True, shown=shown, read_unnamed=read_unnamed)
        console.print(f"wrote {escape(str(path))}: {len(spec.hosts)} host{'s' if len(spec.hosts) != 1 else ''}")
        hosts = load_hosts(path)  # as every fab task will read it
    report = hostcheck.assess(hosts, results)
    hostcheck.show(report, console)
    silent = [] if check else [name for name, r in results.items() if r.error is not None]
    console.print(summary(report, path, read_unnamed=not os.environ.get("FABRIC_INVENTORY")
                          and path == unnamed_path(configured), silent=silent), markup=False)
    return DONE if report.ok else FAILED


def unnamed_path(configured: str | None) -> Path:
    """The inventory fab reads when FABRIC_INVENTORY names none: fabric.yaml's (train.onboard.inventory).
    `configured` is Fabric's `inventory` setting, which FABRIC_INVENTORY sets when given."""
    return out_path(configured or inventory.DEFAULT)


def refuse_example(spec: InventorySpec, read_unnamed: bool) -> None:
    """The README's documentation addresses (RFC 5737) refused as every other task refuses them: where fab reads
    the file unnamed (train.onboard.inventory.load); elsewhere, as FABRIC_INVENTORY names it, written."""
    hosts = hosts_of(spec)
    if read_unnamed and inventory.placeholders(hosts):
        at = ", ".join(f"{h.name} {h.address}" for h in hosts)
        raise OptionError("hosts-at", f"every host is at a documentation address ({at}), the README's example, no "
                                      "machine of yours: give your VMs' addresses")


def summary(report: hostcheck.Report, path: Path, read_unnamed: bool = False, silent: Sequence[str] = ()) -> str:
    """The last line: what to run next. FABRIC_INVENTORY only where fab would not read `path` without it.
    `silent`: the hosts that did not answer as the file was written: the same fab init with --force, once they
    answer, writes what they show (the file says the same); --check writes nothing."""
    shown = os.path.relpath(path, TOP) if path.is_relative_to(TOP) else str(path)
    fab = "fab" if read_unnamed else f"FABRIC_INVENTORY={shown} fab"
    if report.ok:
        return f"every host is ready: ansible-playbook -i {shown} provision.yml, then {fab} info"
    failing = [c.host.name for c in report.hosts if not c.ok]
    found = f"{len(report.problems)} problem(s){' on ' + ', '.join(failing) if failing else ''}"
    if silent:
        return (f"{found}: fix them, then run the same fab init with --force: it writes what "
                f"{', '.join(silent)} show{'s' if len(silent) == 1 else ''} once answering")
    return f"{found}: fix them, then {fab} init --check"
