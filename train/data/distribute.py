"""Putting a prepared dataset on /data of every host, identical (checksums compared)."""

from __future__ import annotations

import shlex
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..cluster import ClusterError, Host, run_all
from ..run.record import DATA_ROOT


def ssh_command(host: Host) -> str:
    """The ssh rsync uses: the inventory's key and known_hosts, host key checking on."""
    parts = ["ssh", "-p", str(host.port), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes"]
    if host.key:
        parts += ["-i", host.key]
    if host.known_hosts:
        parts += ["-o", f"UserKnownHostsFile={host.known_hosts}"]
    return shlex.join(parts)


def rsync_command(src: Path, host: Host, dest: str) -> list[str]:
    """The controller's rsync of `src`'s contents into `dest` on `host`, which it creates first.
    Only options every controller's rsync has: macOS ships rsync 2.6.9 or openrsync, which lack
    GNU rsync's --mkpath; the host's side (`mkdir -p ... && rsync`) runs on Linux."""
    return ["rsync", "-a", "--delete", "-e", ssh_command(host),
            f"--rsync-path=mkdir -p {shlex.quote(dest)} && rsync", f"{src}/", f"{host.user}@{host.address}:{dest}"]


def upload(bin_dir: Path, name: str, hosts: list[Host]) -> dict[str, str]:
    """rsync the dataset to every host at once, then `sha256sum -c` its manifest there.
    Returns {host: manifest sha256}; raises naming each host that failed and why."""
    dest = f"{DATA_ROOT}/{name}/"

    def one(host: Host) -> str | None:
        proc = subprocess.run(rsync_command(bin_dir, host, dest), capture_output=True, text=True)
        return None if proc.returncode == 0 else proc.stderr.strip()[-500:]

    with ThreadPoolExecutor(max_workers=len(hosts)) as pool:
        errors = dict(zip([h.name for h in hosts], pool.map(one, hosts), strict=False))
    problems = [f"{n}: rsync to {dest} failed: {e}" for n, e in errors.items() if e]
    checked = run_all(hosts, f"cd {dest} && sha256sum --quiet -c MANIFEST.sha256 && sha256sum MANIFEST.sha256")
    sums = {}
    for host in hosts:
        result = checked[host.name]
        if errors.get(host.name):
            continue
        if result.error is not None:
            problems.append(f"{host.name}: unreachable after the copy: {result.error}")
        elif not result.ok:
            problems.append(f"{host.name}: the copy in {dest} does not match its manifest: "
                            f"{(result.stdout + result.stderr).strip()[-300:]}")
        else:
            sums[host.name] = result.stdout.split()[0]
    if problems:
        raise ClusterError("dataset not on every host:\n  " + "\n  ".join(problems))
    if len(set(sums.values())) != 1:
        raise ClusterError(f"hosts hold different datasets: {sums}")
    return sums
