"""The cluster's record for /etc/tandem/cluster.json (train.hosts.cluster_record): what another laptop's
`fab init --from HOST` rebuilds the inventory from. This file only hands it Ansible's hostvars."""

from __future__ import annotations

from train.hosts.cluster_record import record

DOCUMENTATION = """
name: cluster_record
short_description: the cluster's record for /etc/tandem/cluster.json (train.hosts.cluster_record)
"""


def cluster_record(names: list, hostvars, group: str, public_key: str) -> dict:
    return record(list(names), {n: hostvars[n] for n in names}, group, public_key)


class FilterModule:
    def filters(self):
        return {"cluster_record": cluster_record}
