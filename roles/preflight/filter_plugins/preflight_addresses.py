"""shared_addresses: hosts of the inventory that were given the same address, named together."""

from __future__ import annotations

DOCUMENTATION = """
name: preflight_addresses
short_description: ['v100a and v100b are both 10.0.0.1 (cluster address)'] for every address given to several hosts
"""


def _named(names: list[str]) -> str:
    if len(names) > 2:
        return f"{', '.join(names[:-1])} and {names[-1]} are all"
    return f"{names[0]} and {names[1]} are both"


def shared_addresses(hosts: list, hostvars) -> list[str]:
    """Two checks: the address the hosts reach each other at (cluster_address, else ansible_host) and
    the SSH endpoint. Rented VMs behind one NAT'd public IP share ansible_host on different ports:
    that is fine; one endpoint for two hosts, or one cluster address, is one machine twice."""
    cluster: dict[str, list[str]] = {}
    ssh: dict[str, list[str]] = {}
    for host in hosts:
        v = hostvars[host]
        address = str(v.get("ansible_host", host))
        cluster.setdefault(str(v.get("cluster_address") or address), []).append(host)
        ssh.setdefault(f"{address}:{v.get('ansible_port', 22)}", []).append(host)
    found = [f"{_named(names)} {address} (cluster address)" for address, names in cluster.items() if len(names) > 1]
    found += [f"{_named(names)} reached over SSH at {endpoint} (ansible_host:ansible_port)"
              for endpoint, names in ssh.items() if len(names) > 1]
    return found


class FilterModule:
    def filters(self):
        return {"shared_addresses": shared_addresses}
