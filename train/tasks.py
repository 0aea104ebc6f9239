"""What every fab task shares: the hosts it acts on, once per invocation.

`fab --hosts v100a,v100b TASK` makes Fabric call TASK once per host, serially. A cluster
job must act on all of them together (one rendezvous, ranks in host order), so a
cluster task runs its body once, on the whole list, and the later per-host calls return.
"""

from __future__ import annotations

import functools
import inspect
import sys

from rich.console import Console

from .cluster import ClusterError, Host, inventory_path, load_hosts, select

console = Console(highlight=False, soft_wrap=True)
_ran: set[str] = set()


def cli_hosts() -> list[str] | None:
    """The hosts given with fab's core --hosts flag, if any."""
    try:
        from fabric.main import program

        value = program.core[0].args.hosts.value
    except (ImportError, AttributeError, IndexError, TypeError):
        return None
    return [h.strip() for h in value.split(",") if h.strip()] if value else None


def cluster_hosts(c) -> list[Host]:
    configured = c.config.get("inventory") if hasattr(c, "config") else None
    return select(load_hosts(inventory_path(configured)), cli_hosts())


def cluster_task(body):
    """Run the task body once for all selected hosts; turn ClusterError into a clean exit."""

    @functools.wraps(body)
    def wrapper(c, *args, **kwargs):
        if body.__name__ in _ran:
            return None
        _ran.add(body.__name__)
        try:
            return body(c, cluster_hosts(c), *args, **kwargs)
        except ClusterError as err:
            console.print(f"[red]error:[/] {err}")
            sys.exit(1)

    # Fabric reads the task's options from its signature: hide the `hosts` we pass in.
    signature = inspect.signature(body)
    params = list(signature.parameters.values())
    wrapper.__signature__ = signature.replace(parameters=[params[0], *params[2:]])
    return wrapper
