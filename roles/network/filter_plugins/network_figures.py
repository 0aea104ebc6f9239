"""Filters for the network role: turn iperf3's JSON into the figures provisioning reports."""

from __future__ import annotations

import json

DOCUMENTATION = """
name: network_figures
short_description: iperf3 results to per-pair figures
"""


def iperf_pairs(results: list) -> list[dict]:
    """Registered loop results of `iperf3 --json` (item = [src, dst]) -> one dict per pair:
    src, dst, mbps (received, Mb/s), retransmits, error ('' when the run worked)."""
    pairs = []
    for result in results or []:
        src, dst = result["item"][0], result["item"][1]
        try:
            data = json.loads(result.get("stdout") or "{}")
        except ValueError:
            data = {}
        end = data.get("end", {})
        mbps = end.get("sum_received", {}).get("bits_per_second", 0) / 1e6
        failed = result.get("rc") != 0
        error = data.get("error") or (result.get("stderr") or result.get("msg") or "iperf3 failed" if failed else "")
        pairs.append({"src": src, "dst": dst, "mbps": round(mbps, 1),
                      "retransmits": end.get("sum_sent", {}).get("retransmits", 0), "error": str(error).strip()})
    return pairs


def ordered_pairs(hosts: list) -> list[list]:
    """[a, b, c] -> every ordered pair of different hosts."""
    return [[a, b] for a in hosts for b in hosts if a != b]


def host_figures(hosts: list, hostvars, fields: dict) -> dict:
    """{host: {name: hostvars[host][var] for name, var in fields}} (missing vars are None)."""
    return {h: {name: hostvars[h].get(var) for name, var in fields.items()} for h in hosts}


class FilterModule:
    def filters(self):
        return {"iperf_pairs": iperf_pairs, "ordered_pairs": ordered_pairs, "host_figures": host_figures}
