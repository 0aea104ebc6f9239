"""The link's arithmetic: what a ring all-reduce sends per host, how long a transfer takes on a
measured link, and a collective's time limit from it (a preset's failure timeouts are sized by it;
the strategies themselves are train.recipe.strategies).
"""

from __future__ import annotations

import math

# A collective's time limit over its transfer time on the measured link: a link measured once by
# iperf3 varies, and NCCL's ring shares it with whatever else the host sends.
TRANSFER_MARGIN = 2.0


def allreduce_bytes_per_host(payload_bytes: float, ranks: int) -> float:
    """What each host sends (and receives) in a ring all-reduce of `payload_bytes` over `ranks`:
    2 (n − 1) / n of the payload. Transformer base's fp32 model (242 MB) on 16 ranks: 454 MB."""
    return 2 * (ranks - 1) / ranks * payload_bytes if ranks > 1 else 0.0


def transfer_s(bytes_per_host: float, link_mbps: float) -> float:
    """Seconds to move `bytes_per_host` over a link of `link_mbps` Mbit/s."""
    return bytes_per_host * 8 / (link_mbps * 1e6)


def collective_timeout_s(bytes_per_host: float, link_mbps: float | None, margin: float = TRANSFER_MARGIN) -> int:
    """A time limit for one collective that moves `bytes_per_host` over the measured link, with
    `margin`; 0 when the link is unknown (the caller keeps its floor)."""
    if not link_mbps or link_mbps <= 0 or bytes_per_host <= 0:
        return 0
    return math.ceil(margin * transfer_s(bytes_per_host, link_mbps))
