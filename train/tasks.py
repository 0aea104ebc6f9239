"""What every fab task shares: the hosts it acts on, all of them in one call.

Fabric's own executor turns `fab --hosts v100a,v100b TASK` into one call of TASK per host,
serially, each with a Connection. A cluster job must act on all of them together (one
rendezvous, ranks in host order), so tandem's fabric.yaml names `ClusterExecutor` as the
executor (`tasks.executor_class`, Invoke's supported way to change it): it reads the same
`--hosts` value Fabric's executor reads, hands the names to the task through the config
(`cluster_hosts`) and calls the task once. `cluster_task` resolves them through the inventory.
"""

from __future__ import annotations

import functools
import inspect
import sys

from fabric import Connection
from fabric.executor import Executor
from rich.console import Console

from .cluster import ClusterError, Host, inventory_path, load_hosts, select

console = Console(highlight=False, soft_wrap=True)


class ClusterExecutor(Executor):
    """Every task once, for all the hosts given with `--hosts` (in that order), not once per host."""

    def expand_calls(self, calls, apply_hosts=True):
        value = self.core[0].args.hosts.value if self.core else None
        self.config.cluster_hosts = [h.strip() for h in (value or "").split(",") if h.strip()] or None
        return super().expand_calls(calls, apply_hosts=False)


def cluster_hosts(c) -> list[Host]:
    """The inventory's hosts (`FABRIC_INVENTORY`, else fabric.yaml's `inventory`), those named with
    --hosts when given."""
    return select(load_hosts(inventory_path(c.config.get("inventory"))), c.config.get("cluster_hosts"))


def cluster_task(body):
    """Run the task body once for all selected hosts; turn ClusterError into a clean exit."""

    @functools.wraps(body)
    def wrapper(c, *args, **kwargs):
        if isinstance(c, Connection):  # Fabric's own executor: one call per host
            console.print("[red]error:[/] fab expanded --hosts into one call per host: tandem's fabric.yaml sets "
                          "tasks.executor_class: train.tasks.ClusterExecutor; run fab from the checkout")
            sys.exit(2)
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


def known_hosts(c) -> list[Host]:
    """Every host of the inventory, whatever --hosts picked (a host a run lost can come back from there)."""
    return load_hosts(inventory_path(c.config.get("inventory")))
