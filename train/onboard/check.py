"""`fab init`'s check of the hosts: all asked at once, one table, each problem with its fix under it.

    host  SSH  sudo  OS            Python  GPUs  cluster address (NIC)  free disk      $/h
    gpu1  ok   ok    Ubuntu 22.04  3.12.3  1     10.0.0.10 (ens5)       /dev/nvme1n1…  2.50
    gpu2: sudo asks for a password: add `ubuntu ALL=(ALL) NOPASSWD:ALL` to /etc/sudoers.d/ubuntu ...

One shell line per host (train.onboard.probe) through cluster.run_each, as every fab task reaches its
hosts; the problems and their fixes are train.onboard.fixes'. `assess` is pure: answers in, report out.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rich.table import Table

from ..cluster import GroupResult, Host, HostResult, run_each
from . import fixes, probe
from .probe import Facts

PROBE_S = 60  # the probe's own time on a host (nvidia-smi can take seconds)


@dataclass(frozen=True)
class HostCheck:
    """One host's outcome: its answers (None when SSH failed) and its problems, each with its fix."""

    host: Host
    facts: Facts | None
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass(frozen=True)
class Report:
    hosts: tuple[HostCheck, ...]
    together: tuple[str, ...] = ()  # problems only the hosts together show

    @property
    def problems(self) -> list[str]:
        return [p for c in self.hosts for p in c.problems] + list(self.together)

    @property
    def ok(self) -> bool:
        return not self.problems


def peer_of(hosts: Sequence[Host], host: Host) -> str | None:
    """The address `host` reaches the cluster at: the first other host's cluster address (as roles/network
    picks the cluster NIC), None for a cluster of one."""
    others = [h for h in hosts if h.name != host.name]
    return others[0].cluster_address if others else None


def ask(hosts: Sequence[Host]) -> GroupResult:
    """Every host's answers to the probe, all at once; an unreachable host's error in its place."""
    # paramiko logs a failed handshake's traceback from its own thread: the report says it in one line
    logging.getLogger("paramiko").addHandler(logging.NullHandler())
    return run_each(list(hosts), {h.name: probe.command(h, peer_of(hosts, h)) for h in hosts}, timeout=PROBE_S)


def check(hosts: Sequence[Host]) -> Report:
    """Ask every host at once and assess the answers: unreachable hosts are problems, not a crash."""
    return assess(hosts, ask(hosts))


def assess(hosts: Sequence[Host], results: Mapping[str, HostResult]) -> Report:
    """The report from each host's answer (or the error in its place). Pure."""
    checks, facts = [], {}
    for host in hosts:
        result = results[host.name]
        if result.error is not None:  # one fix: what the host lacks is said once it answers
            checks.append(HostCheck(host, None, (fixes.ssh(host, result.error),)))
            continue
        problems = fixes.inventory(host)
        facts[host.name] = probe.parse(result.stdout)
        if not result.ok:  # the probe always exits 0: the shell itself failed
            problems.append(f"{host.name}: the check's shell line failed there ({result.why})")
        problems += fixes.host_problems(host, facts[host.name], len(hosts))
        checks.append(HostCheck(host, facts[host.name], tuple(problems)))
    return Report(tuple(checks), tuple(fixes.cluster_problems(hosts, facts)))


def gpus_cell(host: Host, facts: Facts) -> str:
    if facts.smi == "ok":
        return str(facts.smi_gpus)
    pci = f"; {facts.pci_gpus} on PCI" if facts.pci_gpus else ""
    if facts.smi == "absent" and host.gpus == 0 and not facts.pci_gpus:
        return "none (a CPU host)"
    if facts.smi == "failed":
        return f"none (nvidia-smi: {facts.smi_error[:60]}){pci}"
    return f"none (driver not installed yet: provisioning installs it){pci}"


def address_cell(host: Host, facts: Facts) -> str:
    nic = host.nic or (f"{facts.route_nic}, by route" if facts.route_nic else "?")
    mine = "" if facts.holds(host.cluster_address) else ", not on its NICs"
    return f"{host.cluster_address} ({nic}{mine})"


def disk_cell(host: Host, facts: Facts) -> str:
    device = probe.device_of(host)
    if device and facts.disk_path == "/" and facts.device_gb is not None:
        return f"{device}: {facts.device_gb:.0f} GB (provisioning formats it)"
    return f"{facts.free_gb:.0f} GB on {facts.disk_path}" if facts.free_gb is not None else "?"


def price_cell(host: Host) -> str:
    price = host.var("hourly_usd")
    return f"{price:.2f}" if price is not None else "-"


def sudo_cell(facts: Facts) -> str:
    if facts.root:
        return "root"
    return "ok" if not facts.sudo_error else ("asks a password" if "password" in facts.sudo_error else "no")


def row(c: HostCheck) -> list[str]:
    name = f"[green]{c.host.name}[/]" if c.ok else f"[red]{c.host.name}[/]"
    if c.facts is None:
        return [name, "[red]no[/]", *["-"] * 6, price_cell(c.host)]
    f = c.facts
    return [name, "ok", sudo_cell(f), f"{f.os_id.capitalize()} {f.os_version}".strip() or "?", f.python or "none",
            gpus_cell(c.host, f), address_cell(c.host, f), disk_cell(c.host, f), price_cell(c.host)]


def table(report: Report) -> Table:
    t = Table(title="tandem's hosts, before provisioning")
    for header in ("host", "SSH", "sudo", "OS", "Python", "GPUs", "cluster address (NIC)", "free disk", "$/h"):
        t.add_column(header)
    for c in report.hosts:
        t.add_row(*row(c))
    return t


def show(report: Report, console) -> None:
    """The table, then each problem with its fix on a line of its own."""
    console.print(table(report))
    for line in report.problems:
        console.print(f"  {line}", markup=False, highlight=False)
