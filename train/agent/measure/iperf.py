"""iperf3 between hosts: the command lines that run it, and the parser of its JSON.

One implementation for both sides that measure the link: roles/network (Ansible runs these
commands on the hosts and its `iperf_pairs` filter calls `parse`) and train.plan.link (Fabric
runs them for `fab bench-net`, `fab bench-step` and `fab train`'s network check). Plain
standard library: the network role measures before roles/train_env installs anything.

- a server on every host, detached, with a pid file it is stopped by afterwards;
- a client on the sender of each pair: `iperf3 --client DST --json`, the receiver's rate is
  what arrived (`end.sum_received`, the sum over the streams), the sender's retransmits come
  with it; parallel streams (`streams_for`) where the expected link is 10 Gb/s or more.
"""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import asdict, dataclass

PORT = 5201
CONNECT_TIMEOUT_MS = 5000
# A single TCP flow fills a link below 10 Gb/s; on faster cloud NICs one flow is capped well below
# the link (5-10 Gb/s a flow on the usual clouds), so the link is measured with parallel streams.
ONE_STREAM_BELOW_MBPS = 10_000
MBPS_PER_STREAM = 5_000
MAX_STREAMS = 16


def streams_for(expected_mbps: float | None) -> int:
    """How many parallel TCP streams measure a link of `expected_mbps`: 1 below 10 Gb/s, else one
    per 5 Gb/s, at least 4 and at most 16 (iperf3 reports their sum)."""
    mbps = float(expected_mbps or 0)
    if mbps < ONE_STREAM_BELOW_MBPS:
        return 1
    return min(MAX_STREAMS, max(4, math.ceil(mbps / MBPS_PER_STREAM)))


def streams(setting: object, expected_mbps: float | None) -> int:
    """The inventory's `network_iperf_streams`: 'auto' (streams_for the expected link) or a count."""
    text = str(setting if setting is not None else "auto").strip().lower()
    if text == "auto":
        return streams_for(expected_mbps)
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"network_iperf_streams is auto or a number of streams (1 or more), not {setting!r}")
    return int(text)


def server_command(port: int = PORT, pidfile: str = "/run/tandem-iperf3.pid", bind: str | None = None) -> str:
    """Start a detached iperf3 server, stopped afterwards by its pid file (stop_command); it returns
    once the server listens (iperf3 --daemon returns before), failing when it never does.

    `bind`: the host's cluster address. The server binds to it only where it is on one of the
    host's NICs: a cloud VM's public address is NAT'd and not, iperf3 cannot bind to it, and the
    server would die behind --daemon. Elsewhere it listens on every address. One `sh -c` line, so
    that Ansible's command module (no shell) runs it as Fabric does."""
    q = shlex.quote
    server = f"iperf3 --server --daemon --port {int(port)} --pidfile {q(pidfile)}"
    local = f"ip -o addr show to {q(bind)} | grep -q . && set -- --bind {q(bind)}; " if bind else ""
    wait = (f"for _ in $(seq 50); do ss -Hltn 'sport = :{int(port)}' | grep -q . && exit 0; sleep 0.1; done; "
            f"echo 'iperf3 is not listening on port {int(port)}' >&2; exit 1")
    script = f'{local}{server} "$@" && {wait}'
    return f"sh -c {q(script)}"


def client_command(address: str, port: int = PORT, seconds: float = 3, omit: int = 1, streams: int = 1) -> str:
    """The sender's line; with several streams iperf3's JSON `end.sum_received` is their sum (what `parse` reads)."""
    parallel = f" --parallel {int(streams)}" if int(streams) > 1 else ""
    # a peer whose packets are dropped answers in 5 s, not after the kernel's 2 minutes of SYN retries
    return (f"iperf3 --client {shlex.quote(address)} --port {int(port)} --time {seconds:g} --omit {int(omit)}"
            f"{parallel} --connect-timeout {CONNECT_TIMEOUT_MS} --json")


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


def unreachable(pairs: list[Pair]) -> list[Pair]:
    """The pairs whose sender could not connect to the receiver at all (not a slow or broken run)."""
    return [p for p in pairs if p.error and p.error.startswith("unable to connect")]


def link_mbps(pairs: list[Pair]) -> float | None:
    """The link a collective can count on: the slowest pair (a ring is as fast as its slowest hop)."""
    rates = [p.mbps for p in pairs if p.mbps]
    return min(rates) if rates else None
