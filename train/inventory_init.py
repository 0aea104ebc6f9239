"""`fab init`: a newcomer's inventory from addresses, login user and key, then a check of every host.

    fab init --hosts-at 203.0.113.10,203.0.113.11 --user ubuntu --key ~/.ssh/id_ed25519 \\
             [--names gpu1,gpu2] [--gpus 1] [--cluster-at 10.0.0.10,10.0.0.11] [--data-device none] \\
             [--hourly-usd 2.5] [--known-hosts FILE] [--out inventory/mine.yml] [--force]
    fab init --check          the inventory FABRIC_INVENTORY (else fabric.yaml's `inventory`) names

The options are checked first (train.inventory_spec); then the hosts are asked, once, all at once
(train.hostcheck): without --gpus each host is written with the GPUs it shows (nvidia-smi, else its
PCI bus). The file is written, read back as every fab task reads it, and checked: one table, each
problem with its fix. Exit 0: every host passes; 1: a host fails; 2: bad input (an OptionError).
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml
from rich.markup import escape

from . import hostcheck, hostprobe, hostvars
from .cluster import CLUSTER_GROUP, TOP, GroupResult, Host, inventory_path, load_hosts
from .exits import DONE, FAILED, OptionError
from .inventory_spec import InventorySpec, spec_from_options

DEFAULT_OUT = "inventory/mine.yml"


def layout(spec: InventorySpec) -> tuple[dict, dict, dict[str, dict]]:
    """(every host's variables, the cluster group's, each host's own): inventory/hosts.yml's shape."""
    common: dict[str, object] = {"ansible_user": spec.user, "ansible_become": True}
    if spec.key:
        common["ansible_ssh_private_key_file"] = spec.key
    if spec.known_hosts:  # fab reads the first, Ansible's ssh the second
        common.update(tandem_known_hosts_file=spec.known_hosts,
                      ansible_ssh_common_args=f"-o UserKnownHostsFile={spec.known_hosts}")
    group = {**({"hourly_usd": spec.hourly_usd} if spec.hourly_usd is not None else {}), **dict(spec.extra)}
    entries: dict[str, dict] = {}
    for host in spec.hosts:
        entry: dict[str, object] = {"ansible_host": host.address}
        if host.cluster_address:
            entry["cluster_address"] = host.cluster_address
        if host.gpus is not None:
            entry["gpus"] = host.gpus
        entries[host.name] = {**entry, "data_device": spec.data_device}
    for name in {*common, *group, *(k for e in entries.values() for k in e)}:
        if not name.startswith("ansible_"):  # Ansible's own stay Ansible's
            hostvars.defined(name)  # a name tandem does not read would be a typo
    return common, group, entries


def render(spec: InventorySpec, out: str = DEFAULT_OUT) -> str:
    """The inventory's text, a few lines of comment on top."""
    common, group, entries = layout(spec)
    cluster: dict[str, object] = {"hosts": entries, **({"vars": group} if group else {})}
    header = (f"# tandem's inventory, written by `fab init`. Every variable tandem reads: docs/inventory.md.\n"
              f"# The host order is the rank order (the first host is rank 0's, the rendezvous).\n"
              f"#   FABRIC_INVENTORY={out} fab init --check          check the hosts again\n"
              f"#   ansible-playbook -i {out} provision.yml          provision them\n"
              f"#   export FABRIC_INVENTORY={out}                     then fab info, fab train, ...\n")
    return header + yaml.safe_dump({"all": {"vars": common, "children": {CLUSTER_GROUP: cluster}}}, sort_keys=False)


def hosts_of(spec: InventorySpec) -> list[Host]:
    """The hosts as fab will read them from the file, to ask them before it is written."""
    common, group, entries = layout(spec)
    hosts = []
    for name, entry in entries.items():
        variables = {**common, **group, **entry}
        hosts.append(Host(name, entry["ansible_host"], user=spec.user, key=spec.key, known_hosts=spec.known_hosts,
                          gpus=int(entry.get("gpus") or 0), data_device=spec.data_device, vars=variables,
                          cluster_address=str(entry.get("cluster_address") or "")))
    return hosts


def gpus_found(results: GroupResult) -> dict[str, int]:
    """The GPUs each host that answered shows: nvidia-smi's, else (no driver yet) its PCI bus's."""
    found = {}
    for name, result in results.items():
        if result.ok:
            facts = hostprobe.parse(result.stdout)
            found[name] = facts.gpus_seen if facts.gpus_seen is not None else facts.pci_gpus
    return found


def out_path(out: str | None) -> Path:
    path = Path(os.path.expanduser(out or DEFAULT_OUT))
    return path if path.is_absolute() else TOP / path


def refuse_existing(path: Path, force: bool, shown: str) -> None:
    if path.exists() and not force:
        raise OptionError("out", f"{shown} exists: give --force to overwrite it, or another --out")


def write(spec: InventorySpec, path: Path, force: bool = False, shown: str = DEFAULT_OUT) -> Path:
    """Write the inventory; an existing file only with `force`."""
    refuse_existing(path, force, shown)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(spec, shown))
    return path


def init(console, configured: str | None, *, check: bool = False, out: str | None = None, force: bool = False,
         **options: str | None) -> int:
    """Write the inventory from `options` (spec_from_options' names), or with `check` take the configured
    one; check every host; the exit status (train.exits). A bad option raises OptionError before anything
    is written or reached; an inventory tandem cannot read (a value of the wrong type) raises ClusterError."""
    if check:
        if given := [f"--{o.replace('_', '-')}" for o, v in {**options, "out": out}.items() if v]:
            raise OptionError("check", f"checks the inventory you have (FABRIC_INVENTORY, else fabric.yaml's "
                                       f"inventory); {', '.join(given)} write a new one: drop --check or them")
        path = inventory_path(configured)
        if not path.exists():
            raise OptionError("check", f"inventory {path} does not exist: write one with fab init --hosts-at ...")
        hosts = load_hosts(path)
        with console.status(f"asking {len(hosts)} hosts over SSH"):
            results = hostcheck.ask(hosts)
    else:
        spec, path, shown = spec_from_options(**options), out_path(out), out or DEFAULT_OUT
        refuse_existing(path, force, shown)
        with console.status(f"asking {len(spec.hosts)} hosts over SSH"):
            results = hostcheck.ask(hosts_of(spec))
        write(spec.with_gpus(gpus_found(results)), path, force=True, shown=shown)
        console.print(f"wrote {escape(str(path))}: {len(spec.hosts)} host{'s' if len(spec.hosts) != 1 else ''}")
        hosts = load_hosts(path)  # as every fab task will read it
    report = hostcheck.assess(hosts, results)
    hostcheck.show(report, console)
    console.print(summary(report, path), markup=False)
    return DONE if report.ok else FAILED


def summary(report: hostcheck.Report, path: Path) -> str:
    shown = os.path.relpath(path, TOP) if path.is_relative_to(TOP) else str(path)
    if report.ok:
        return (f"every host is ready: ansible-playbook -i {shown} provision.yml, then FABRIC_INVENTORY={shown} "
                "fab info")
    failing = [c.host.name for c in report.hosts if not c.ok]
    return (f"{len(report.problems)} problem(s){' on ' + ', '.join(failing) if failing else ''}: fix them, then "
            f"FABRIC_INVENTORY={shown} fab init --check")
