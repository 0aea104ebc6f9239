"""A prepared dataset onto every host, host to host: rank 0's host (which prepared it) copies it to
the others over the cluster network with the cluster key (roles/common/tasks/cluster_key.yml), the
receivers' disk checked first; every copy is then checked against its manifest. The controller
only sends the commands (and, with --source, uploads the corpus once to rank 0's host)."""

from __future__ import annotations

import shlex
import subprocess
import threading
from contextlib import contextmanager
from pathlib import Path

from ..cluster import ClusterError, Host, run_all
from ..hosts.paths import DATA_ROOT
from ..hosts.peercopy import CLUSTER_KEY, copy_to_peers, to_peers_command
from .progress import CopyBars  # noqa: F401 - distribute.CopyBars: the bars copy_progress draws

COPY_POLL_S = 2.0  # how often the receivers are asked how much of the dataset they hold


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
    return ["rsync", "-a", "--delete", "--stats", "-e", ssh_command(host),
            f"--rsync-path=mkdir -p {shlex.quote(dest)} && rsync", f"{src}/", f"{host.user}@{host.address}:{dest}"]


def upload_source(src: Path, host: Host, dest: str) -> int:
    """A corpus on the controller (--source DIR) to rank 0's host, once (rsync: only what changed).
    Returns the bytes rsync sent."""
    if not src.is_dir():
        raise ClusterError(f"--source {src}: not a directory on this machine")
    proc = subprocess.run(rsync_command(src, host, dest), capture_output=True, text=True)
    if proc.returncode != 0:
        raise ClusterError(f"{host.name}: uploading {src} to {dest} failed: {proc.stderr.strip()[-500:]}")
    sent = [line for line in proc.stdout.splitlines() if line.startswith("Total bytes sent:")]
    return int(sent[0].split(":")[1].replace(",", "").strip()) if sent else 0


def manifests(hosts: list[Host], name: str) -> dict[str, str]:
    """{host: sha256 of its MANIFEST.sha256 of dataset `name`} ('' where it has none)."""
    got = run_all(hosts, f"sha256sum {DATA_ROOT}/{name}/MANIFEST.sha256 2>/dev/null", timeout=60)
    return {h.name: (got[h.name].stdout.split() or [""])[0] if got[h.name].ok else "" for h in hosts}


def size(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def check_receivers_disk(hosts: list[Host], need: int) -> None:
    """Refuse before copying when a receiver has less than `need` bytes free where datasets go."""
    free = run_all(hosts, f"mkdir -p {DATA_ROOT} && df -PB1 {DATA_ROOT} | awk 'NR==2 {{print $4}}'", timeout=60)
    problems = []
    for host in hosts:
        result = free[host.name]
        if not result.ok or not result.stdout.strip().isdigit():
            problems.append(f"{host.name}: could not read the free space of {DATA_ROOT}: {result.why()}")
        elif int(result.stdout) < need:
            problems.append(f"{host.name}: not enough disk for the dataset in {DATA_ROOT}: needs {size(need)}, "
                            f"{size(int(result.stdout))} free")
    if problems:
        raise ClusterError("dataset not copied:\n  " + "\n  ".join(problems))


def spread_command(name: str, peers: list[Host]) -> str:
    """The shell line, run on rank 0's host, that rsyncs DATA_ROOT/NAME to every peer at once over the
    cluster network (--delay-updates: the new files take their names together at the end; unchanged
    files are not sent; --delete: only inside that dataset's own directory). It prints `PEER rc` per peer."""
    src = f"{DATA_ROOT}/{name}/"
    return to_peers_command(shlex.quote(src), src, peers, rsync_options="-a --delete --delay-updates")


def spread(source: Host, peers: list[Host], name: str) -> None:
    """Copy dataset `name` from `source` to `peers`, host to host. ClusterError naming each that failed."""
    try:
        failed = copy_to_peers(source, peers, spread_command(name, peers))
    except LookupError:
        raise ClusterError(f"{source.name} has no cluster key ({CLUSTER_KEY}) to copy the dataset to its peers: "
                           "re-run provisioning (fab provision or ansible-playbook provision.yml)") from None
    if failed:
        raise ClusterError(f"copying the dataset from {source.name} host to host failed for: " + "; ".join(failed))


def held_bytes(hosts: list[Host], name: str) -> dict[str, int]:
    """{host: bytes under DATA_ROOT/NAME there} (rsync's temporary files included), for the hosts that answered."""
    got = run_all(hosts, f"du -sb {DATA_ROOT}/{name} 2>/dev/null | cut -f1", timeout=20)
    return {h.name: int(got[h.name].stdout) for h in hosts
            if got[h.name].ok and got[h.name].stdout.strip().isdigit()}


@contextmanager
def copy_progress(console, source: Host, receivers: list[Host], name: str, total: int, every_s: float = COPY_POLL_S):
    """While the body copies dataset `name` to `receivers`: their bars, from what each holds, asked
    every `every_s` seconds over ssh (the copy itself runs on `source`, host to host)."""
    bars = CopyBars(console, source.name, [r.name for r in receivers], total)
    stop = threading.Event()

    def poll():
        while not stop.wait(every_s):
            bars.update(held_bytes(receivers, name))

    watcher = threading.Thread(target=poll, daemon=True, name="copy-progress")
    watcher.start()
    done = False
    try:
        yield bars
        done = True
    finally:
        stop.set()
        watcher.join()
        bars.close(done)


def check_copies(hosts: list[Host], name: str) -> dict[str, str]:
    """`sha256sum -c` of the manifest on every host. Returns {host: manifest sha256}; raises naming each
    host whose copy does not match, and when the hosts hold different datasets."""
    dest = f"{DATA_ROOT}/{name}/"
    checked = run_all(hosts, f"cd {dest} && sha256sum --quiet -c MANIFEST.sha256 && sha256sum MANIFEST.sha256")
    sums, problems = {}, []
    for host in hosts:
        result = checked[host.name]
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
