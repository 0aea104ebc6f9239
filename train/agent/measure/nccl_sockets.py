"""How many TCP connections NCCL opens to a peer: its socket transport on fast links.

Without InfiniBand or EFA, NCCL moves data between hosts over TCP: NCCL_SOCKET_NTHREADS helper
threads per connection, each with NCCL_NSOCKS_PERTHREAD sockets (NCCL takes 1 to 16 threads and at
most 64 sockets in all; both default to 1 except on the clouds it recognizes). One TCP flow on a
fast cloud NIC is capped well below the link (5-10 Gb/s a flow), which is why provisioning measures
such a link with parallel iperf3 streams (train.agent.measure.iperf.streams_for): the number of flows that
filled the link is the number NCCL needs too.

    >>> choose("auto", 16).env()       # a 25 Gb/s link, measured with 16 streams: NCCL's AWS split
    {'NCCL_SOCKET_NTHREADS': '2', 'NCCL_NSOCKS_PERTHREAD': '8'}
    >>> choose("auto", 1) is None      # one stream filled it: NCCL's own defaults stay
    True

roles/network writes `env_lines(...)` to /etc/tandem/env (`network_nccl_sockets`: auto, a count,
THREADSxSOCKETS or none); `fab bench-net --nccl-sockets` tries another choice for one run.
Plain standard library, like train.agent.measure.iperf: the network role imports it on the controller.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MAX_THREADS = 16  # NCCL's limit on NCCL_SOCKET_NTHREADS
MAX_SOCKETS = 64  # NCCL's limit on threads x sockets per thread
# 8 sockets a thread: NCCL's own choice on AWS (2 threads x 8 sockets for 16 flows); fewer threads, less CPU
SOCKETS_PER_THREAD = 8
NAMES = ("NCCL_SOCKET_NTHREADS", "NCCL_NSOCKS_PERTHREAD")
ACCEPTED = "auto, none, a socket count (1 to 64) or THREADSxSOCKETS such as 2x8 (product at most 64)"


@dataclass(frozen=True)
class Sockets:
    threads: int
    per_thread: int

    def __post_init__(self):
        if not 1 <= self.threads <= MAX_THREADS or self.per_thread < 1 or self.total > MAX_SOCKETS:
            raise ValueError(f"NCCL sockets {self}: threads 1 to {MAX_THREADS}, threads x sockets per thread "
                             f"at most {MAX_SOCKETS}")

    @property
    def total(self) -> int:
        return self.threads * self.per_thread

    def __str__(self) -> str:
        return f"{self.threads}x{self.per_thread}"

    def env(self) -> dict[str, str]:
        return dict(zip(NAMES, (str(self.threads), str(self.per_thread)), strict=True))


def split(total: int) -> Sockets:
    """`total` TCP connections (capped at 64) as threads x sockets per thread: as few threads as hold
    8 sockets each, the sockets spread evenly over them (the product may round up by a few)."""
    total = min(max(int(total), 1), MAX_SOCKETS)
    threads = math.ceil(total / SOCKETS_PER_THREAD)
    return Sockets(threads, math.ceil(total / threads))


def parse(setting: object) -> Sockets | None:
    """An explicit choice: 'none' (NCCL's defaults: None), a count ('16': split) or '2x8' as given."""
    text = str(setting).strip().lower()
    if text in ("none", "default", "false"):
        return None
    threads, x, per_thread = text.partition("x")
    numbers = (threads, per_thread) if x else (text,)
    if not all(n.strip().isdigit() for n in numbers):
        raise ValueError(f"NCCL sockets are {ACCEPTED}, not {setting!r}")
    if x:
        return Sockets(int(threads), int(per_thread))
    if not 1 <= int(text) <= MAX_SOCKETS:
        raise ValueError(f"NCCL sockets are {ACCEPTED}, not {setting!r}")
    return split(int(text))


def choose(setting: object, measured_streams: int) -> Sockets | None:
    """`network_nccl_sockets`: 'auto' takes the iperf3 stream count that measured the link (None, NCCL's
    defaults, where one stream did); anything else is `parse`d."""
    if str(setting if setting is not None else "auto").strip().lower() == "auto":
        return split(measured_streams) if int(measured_streams) > 1 else None
    return parse(setting)


def env_lines(setting: object, measured_streams: int) -> list[str]:
    """The lines for /etc/tandem/env, a comment saying where they come from first; [] for NCCL's defaults."""
    chosen = choose(setting, measured_streams)
    if chosen is None:
        return []
    auto = str(setting if setting is not None else "auto").strip().lower() == "auto"
    why = (f"the {int(measured_streams)} parallel iperf3 streams that measured the link" if auto
           else f"network_nccl_sockets: {setting}")
    return [f"# NCCL's TCP sockets per connection: {chosen} ({chosen.total}), from {why}",
            *(f"{name}={value}" for name, value in chosen.env().items())]


def option(value: object) -> str:
    """`fab bench-net --nccl-sockets`: a count or THREADSxSOCKETS (checked), or none; the text as given."""
    parse(value)
    return str(value).strip().lower()
