"""The host-to-host checkpoint push, side by side on a provisioned lab: the line that sent
checkpoint_last.pt and checkpoint_best.pt both, and tandem's (last sent once, best made from it on
the peer where it is last's copy, as at a save that improved). Bytes off rank 0's cluster NIC and
seconds, each twice, optionally with the cluster NICs capped (tandem's own tc caps, removed after).

    python -m benchmarks.push_lab --inventory inventory/lab.yml [--mb 500] [--rate 100mbit]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from train.cluster import Host, load_hosts, run_all
from train.hosts import peercopy
from train.plan import link
from train.run import checkpoints

SAVE_DIR = "/data/tandem/runs/push-bench/checkpoints"


def sh(host: Host, command: str) -> str:
    """`command`'s output on `host`; a failure stops the benchmark naming the host and the cause."""
    result = run_all([host], command, timeout=600)[host.name]
    if not result.ok:
        raise SystemExit(f"{host.name}: {command.split(' && ')[0]} failed: {result.why()}")
    return result.stdout.strip()


def both_files_line(peers: list[Host]) -> str:
    """The push as it was: every file that exists, each sent as itself."""
    names = " ".join(f"{SAVE_DIR}/{name}" for name in checkpoints.CHECKPOINTS)
    return peercopy.to_peers_command("$files", SAVE_DIR, peers, tries=3,
                                     prelude=f"files=$(ls {names} 2>/dev/null); ")


def measure(source: Host, peer: Host, mb: int) -> None:
    nic = sh(source, f"ip -o -4 addr show | awk '/ {source.cluster_address}\\//{{print $2}}'")
    sh(source, f"mkdir -p {SAVE_DIR} && head -c {mb}M /dev/urandom > {SAVE_DIR}/checkpoint_last.pt "
               f"&& cp {SAVE_DIR}/checkpoint_last.pt {SAVE_DIR}/checkpoint_best.pt")
    lines = (("both files sent", both_files_line([peer])),
             ("last sent, best made there", checkpoints.push_command(SAVE_DIR, [peer])))
    try:
        for name, line in lines * 2:
            sh(peer, f"rm -rf {SAVE_DIR}")
            sent = int(sh(source, f"cat /sys/class/net/{nic}/statistics/tx_bytes"))
            started = time.monotonic()
            failed = peercopy.copy_to_peers(source, [peer], line)
            seconds = time.monotonic() - started
            sent = int(sh(source, f"cat /sys/class/net/{nic}/statistics/tx_bytes")) - sent
            digests = sh(peer, f"cd {SAVE_DIR} && sha256sum checkpoint_last.pt checkpoint_best.pt | cut -c1-64 | uniq")
            print(f"{name}: {seconds:.1f} s, {sent / 1e6:,.0f} MB off {source.name}'s {nic}"
                  f"{', failed: ' + '; '.join(failed) if failed else ''}; "
                  f"the peer's last and best {'identical' if len(digests.split()) == 1 else 'DIFFER'}")
    finally:
        for host in (source, peer):
            sh(host, "rm -rf /data/tandem/runs/push-bench")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inventory", type=Path, default=Path("inventory/lab.yml"))
    parser.add_argument("--mb", type=int, default=500, help="the checkpoint's size")
    parser.add_argument("--rate", help="cap the cluster NICs for the measurement (e.g. 100mbit)")
    args = parser.parse_args()
    hosts = load_hosts(args.inventory)
    if args.rate:
        link.apply_caps(hosts, args.rate)
    try:
        measure(hosts[0], hosts[1], args.mb)
    finally:
        if args.rate:
            link.remove_caps(hosts)


if __name__ == "__main__":
    main()
