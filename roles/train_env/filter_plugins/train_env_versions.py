"""versions_differ: every host's train.agent.measure.probe answer compared with the first host's, by the
comparison `fab train`'s preflight and roles/verify make (train.agent.measure.probe.versions_differ);
pip_restored: what a pip install replaced, so a re-run that restores drifted pins says so."""

from __future__ import annotations

import re

from train.agent.measure import probe

DOCUMENTATION = """
name: train_env_versions
short_description: the hosts whose training environment differs from the first host's
"""


def versions_differ(hosts: list, hostvars, var: str) -> list[str]:
    """['v100b: torch 2.12.0 but v100a has 2.13.0', ...]: [] when every host has the same versions."""
    return probe.versions_differ({h: dict(hostvars[h].get(var) or {}) for h in hosts})


def pip_restored(stdout: str, fresh: bool = False) -> list[str]:
    """pip install's output -> ['numpy 2.3.1 -> 2.4.6', 'sacrebleu 2.6.0 (was missing)']: what it put
    back in an existing venv; [] for a fresh venv (everything is new there) or nothing installed."""
    installed = re.search(r"Successfully installed (.+)", stdout or "")
    if fresh or not installed:
        return []
    canon = lambda name: re.sub(r"[-_.]+", "-", name).lower()  # noqa: E731 - PEP 503, as pip compares
    before = {canon(n): (n, v) for n, v in re.findall(r"Found existing installation: (\S+) (\S+)", stdout)}
    out = []
    for item in installed.group(1).split():
        name, version = item.rsplit("-", 1)
        if canon(name) in before:
            old_name, old_version = before[canon(name)]
            out.append(f"{old_name} {old_version} -> {version}")
        else:
            out.append(f"{name} {version} (was missing)")
    return out


class FilterModule:
    def filters(self):
        return {"versions_differ": versions_differ, "pip_restored": pip_restored}
