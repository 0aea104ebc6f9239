"""tandem's per-run jobs on the cluster. `fab -l` lists them, `fab --help TASK` explains one.

Hosts come from the Ansible inventory (fabric.yaml `inventory`, or FABRIC_INVENTORY=...);
`--hosts a,b` picks some of them, in that order, else the inventory's `cluster` group.
"""

from fabric import task
from rich.table import Table

from train.cluster import run_all
from train.tasks import cluster_task, console


@task
@cluster_task
def info(c, hosts):
    """Show every host's name, kernel, CPUs and memory, asked of all hosts in parallel."""
    results = run_all(hosts, "hostname; uname -r; nproc; free -m | awk '/Mem:/ {print $2}'")
    table = Table(title="cluster")
    for column in ("host", "address", "hostname", "kernel", "cpus", "memory (MiB)", "gpus"):
        table.add_column(column)
    for host in hosts:
        result = results[host.name]
        if isinstance(result, Exception):
            table.add_row(host.name, host.address, f"[red]unreachable: {result}[/]", "", "", "", "")
            continue
        hostname, kernel, cpus, memory = result.stdout.split()
        table.add_row(host.name, host.address, hostname, kernel, cpus, memory, str(host.gpus))
    console.print(table)
