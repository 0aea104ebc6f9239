"""The benchmarks without Fabric: `python -m benchmarks.net|step|predict --hosts a,b`.

Same hosts (the inventory's `cluster` group, `--inventory` or $FABRIC_INVENTORY), same
options and output as the fab tasks, which call the same functions.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from train.cluster import ClusterError, Host, inventory_path, load_hosts, select


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--inventory", help="Ansible inventory (default $FABRIC_INVENTORY, else inventory/hosts.yml)")
    p.add_argument("--hosts", help="comma-separated host names (default: every host of the cluster group)")
    return p


def hosts_of(args: argparse.Namespace) -> list[Host]:
    names = [h.strip() for h in (args.hosts or "").split(",") if h.strip()] or None
    return select(load_hosts(inventory_path(args.inventory)), names)


def run(body: Callable[[argparse.Namespace, list[Host]], int | None], args: argparse.Namespace) -> int:
    """The body's exit code; a ClusterError becomes one line on stderr and exit 1, as under fab."""
    try:
        return body(args, hosts_of(args)) or 0
    except ClusterError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
