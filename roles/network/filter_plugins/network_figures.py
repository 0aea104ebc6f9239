"""Filters for the network role: iperf3's command lines and its JSON turned into per-pair figures,
and whether the figures measured before still hold (measuring takes a while, most reruns change nothing).

Both come from tandem's own train.agent.measure.iperf, the implementation benchmarks.link uses too: this
file only adapts it to Ansible (registered loop results in, plain dicts out).
"""

from __future__ import annotations

import re

from train.agent.measure import iperf, nccl_sockets
from train.provision import remeasure

DOCUMENTATION = """
name: network_figures
short_description: iperf3 commands and results to per-pair figures (train.agent.measure.iperf)
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


def iperf_client(address: str, port: int, seconds: float, streams: int = 1) -> str:
    return iperf.client_command(address, int(port), float(seconds), streams=int(streams))



def host_figures(hosts: list, hostvars, fields: dict) -> dict:
    """{host: {name: hostvars[host][var] for name, var in fields}} (missing vars are None)."""
    return {h: {name: hostvars[h].get(var) for name, var in fields.items()} for h in hosts}


def measure_reason(cached: dict, inputs: dict, how: str, max_age_h: float, now_iso: str) -> str:
    """'' when the figures in network.json stand for a new measurement, else why not (train.provision.remeasure)."""
    threshold = float(cached.get("threshold_mbps") or 0)
    pairs = cached.get("pairs") or []
    passed = bool(pairs) and not any(p.get("error") or p.get("mbps", 0) < threshold for p in pairs)
    return remeasure.reason(cached.get("inputs") if pairs else None, inputs, passed, cached.get("measured_at"),
                            how, max_age_h, now_iso)


def measure_inputs(hosts: list, hostvars, qdisc_var: str, seconds, port, streams=1) -> dict:
    """{'v100a': 'address=.. nic=eth0 mtu=1500 speed=10000 shaping=qdisc noqueue 0: root', ...,
    'iperf3': 'seconds=3 port=5201'}: what the figures depend on, in words a user can compare."""
    out = {}
    for h in hosts:
        v = hostvars[h]
        qdisc = re.sub(r" refcnt \d+", "", " ".join((v.get(qdisc_var) or {}).get("stdout", "").split()))
        out[h] = (f"address={v.get('preflight_address')} nic={v.get('network_cluster_nic')} mtu={v.get('network_mtu')}"
                  f" speed={v.get('network_speed_mbps')} shaping={qdisc or '-'}")
    out["iperf3"] = f"seconds={seconds} port={port}" + (f" streams={streams}" if int(streams) > 1 else "")
    return out


def nccl_socket_lines(setting, streams) -> list[str]:
    """/etc/tandem/env's NCCL_SOCKET_NTHREADS / NCCL_NSOCKS_PERTHREAD lines (train.agent.measure.nccl_sockets):
    from `streams`, the iperf3 stream count that measured the link, unless `network_nccl_sockets` says."""
    return nccl_sockets.env_lines(setting, int(streams))


class FilterModule:
    def filters(self):
        return {"iperf_pairs": iperf_pairs, "ordered_pairs": ordered_pairs, "iperf_server": iperf_server,
                "iperf_client": iperf_client, "iperf_streams": iperf.streams,
                "host_figures": host_figures, "measure_mode": remeasure.mode,
                "measure_reason": measure_reason, "measure_inputs": measure_inputs,
                "nccl_socket_lines": nccl_socket_lines}
