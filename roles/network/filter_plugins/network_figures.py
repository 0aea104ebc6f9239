"""Filters for the network role: iperf3's command lines and its JSON turned into per-pair figures.

Both come from tandem's own train.agent.iperf, the implementation benchmarks.link uses too: this
file only adapts it to Ansible (registered loop results in, plain dicts out).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the checkout, for tandem's train.agent

from train.agent import iperf  # noqa: E402

DOCUMENTATION = """
name: network_figures
short_description: iperf3 commands and results to per-pair figures (train.agent.iperf)
"""


def iperf_pairs(results: list) -> list[dict]:
    """Registered loop results of `iperf3 --json` (item = [src, dst]) -> one dict per pair:
    src, dst, mbps (received, Mb/s; 0 when it failed), retransmits, error ('' when the run worked)."""
    return [iperf.parse(r["item"][0], r["item"][1], r.get("stdout") or "",
                        r.get("stderr") or r.get("msg") or "").figures() for r in results or []]


def ordered_pairs(hosts: list) -> list[list]:
    """[a, b, c] -> every ordered pair of different hosts."""
    return [list(pair) for pair in iperf.ordered_pairs(list(hosts))]


def iperf_server(port: int, pidfile: str, bind: str | None = None) -> str:
    return iperf.server_command(int(port), pidfile, bind)


def iperf_client(address: str, port: int, seconds: float) -> str:
    return iperf.client_command(address, int(port), float(seconds))


def host_figures(hosts: list, hostvars, fields: dict) -> dict:
    """{host: {name: hostvars[host][var] for name, var in fields}} (missing vars are None)."""
    return {h: {name: hostvars[h].get(var) for name, var in fields.items()} for h in hosts}


class FilterModule:
    def filters(self):
        return {"iperf_pairs": iperf_pairs, "ordered_pairs": ordered_pairs, "iperf_server": iperf_server,
                "iperf_client": iperf_client, "host_figures": host_figures}
