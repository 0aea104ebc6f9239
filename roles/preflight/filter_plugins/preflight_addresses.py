"""shared_addresses: hosts of the inventory that were given the same address, named together."""

from __future__ import annotations

DOCUMENTATION = """
name: preflight_addresses
short_description: ['v100a and v100b are both 10.0.0.1'] for every address given to several hosts
"""


def shared_addresses(hosts: list, hostvars) -> list[str]:
    by_address: dict[str, list[str]] = {}
    for host in hosts:
        by_address.setdefault(str(hostvars[host].get("ansible_host", host)), []).append(host)
    return [f"{', '.join(names[:-1])} and {names[-1]} are all {address}" if len(names) > 2
            else f"{names[0]} and {names[1]} are both {address}"
            for address, names in by_address.items() if len(names) > 1]


class FilterModule:
    def filters(self):
        return {"shared_addresses": shared_addresses}
