"""versions_differ: every host's train.agent.probe answer compared with the first host's, by the
comparison `fab train`'s preflight and roles/verify make (train.agent.probe.versions_differ)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the checkout, for tandem's train.agent

from train.agent import probe  # noqa: E402

DOCUMENTATION = """
name: train_env_versions
short_description: the hosts whose training environment differs from the first host's
"""


def versions_differ(hosts: list, hostvars, var: str) -> list[str]:
    """['v100b: torch 2.12.0 but v100a has 2.13.0', ...]: [] when every host has the same versions."""
    return probe.versions_differ({h: dict(hostvars[h].get(var) or {}) for h in hosts})


class FilterModule:
    def filters(self):
        return {"versions_differ": versions_differ}
