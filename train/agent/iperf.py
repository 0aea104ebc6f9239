"""iperf3 between hosts: the command lines that run it, and the parser of its JSON.

One implementation for both sides that measure the link: roles/network (Ansible runs these
commands on the hosts and its `iperf_pairs` filter calls `parse`) and benchmarks.link (Fabric
runs them for `fab bench-net`, `fab bench-step` and `fab train`'s network check). Plain
standard library: the network role measures before roles/train_env installs anything.

- a server on every host, detached, with a pid file it is stopped by afterwards;
- a client on the sender of each pair: `iperf3 --client DST --json`, the receiver's rate is
  what arrived (`end.sum_received`), the sender's retransmits come with it.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import asdict, dataclass

PORT = 5201


def server_command(port: int = PORT, pidfile: str = "/run/tandem-iperf3.pid", bind: str | None = None) -> str:
    """Start a detached iperf3 server, stopped afterwards by its pid file (stop_command)."""
    where = f" --bind {shlex.quote(bind)}" if bind else ""
    return f"iperf3 --server --daemon --port {int(port)}{where} --pidfile {shlex.quote(pidfile)}"


def client_command(address: str, port: int = PORT, seconds: float = 3, omit: int = 1) -> str:
    return f"iperf3 --client {shlex.quote(address)} --port {int(port)} --time {seconds:g} --omit {int(omit)} --json"


def stop_command(pidfile: str = "/run/tandem-iperf3.pid") -> str:
    return f"pkill -F {shlex.quote(pidfile)} 2>/dev/null; rm -f {shlex.quote(pidfile)}; true"


def ordered_pairs(names: list[str], pattern: str = "all") -> list[tuple[str, str]]:
    """'all': every ordered pair of different hosts; 'ring': i → i+1 (the ring all-reduce's links)."""
    if len(names) < 2:
        return []
    if pattern == "ring":
        return list(dict.fromkeys((names[i], names[(i + 1) % len(names)]) for i in range(len(names))))
    return [(a, b) for a in names for b in names if a != b]


@dataclass(frozen=True)
class Pair:
    src: str
    dst: str
    mbps: float | None  # received bits per second / 1e6; None when the pair was not measured
    retransmits: int | None = None
    error: str | None = None

    def figures(self) -> dict:
        """As provisioning reports it (network.json): a pair that failed measured 0 Mb/s, error '' when none."""
        return {**asdict(self), "mbps": self.mbps or 0.0, "retransmits": self.retransmits or 0,
                "error": self.error or ""}


def parse(src: str, dst: str, stdout: str, stderr: str = "") -> Pair:
    """A Pair from `iperf3 --json` output; what went wrong (iperf3's error, or the last line of
    whatever else came back) when there is no rate."""
    try:
        data = json.loads(stdout)
    except ValueError:
        said = (stdout.strip() or stderr.strip() or "no output").splitlines()[-1][:200]
        return Pair(src, dst, None, error=said)
    if not isinstance(data, dict):
        return Pair(src, dst, None, error=f"not iperf3's JSON: {stdout.strip()[:200]}")
    if data.get("error"):
        return Pair(src, dst, None, error=str(data["error"]))
    end = data.get("end", {})
    received = end.get("sum_received", {}).get("bits_per_second")
    sent = end.get("sum_sent", {})
    rate = received if received is not None else sent.get("bits_per_second")
    if rate is None:
        return Pair(src, dst, None, sent.get("retransmits"), error="iperf3 reported no rate")
    return Pair(src, dst, round(rate / 1e6, 1), sent.get("retransmits"))


def link_mbps(pairs: list[Pair]) -> float | None:
    """The link a collective can count on: the slowest pair (a ring is as fast as its slowest hop)."""
    rates = [p.mbps for p in pairs if p.mbps]
    return min(rates) if rates else None
