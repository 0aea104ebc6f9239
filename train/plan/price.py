"""What a host costs: the inventory's `hourly_usd` (a host var or a group var, resolved by Ansible
like any other). A host without one leaves every dollar figure out: tandem never guesses a price.
"""

from __future__ import annotations

from collections.abc import Sequence

from train.cluster import Host

PRICE_VAR = "hourly_usd"


def hourly_usd(host: Host) -> float | None:
    """The host's price per hour in US dollars, None when the inventory gives none."""
    return host.var(PRICE_VAR)  # type: ignore[return-value]


def cluster_hourly_usd(hosts: Sequence[Host]) -> float | None:
    """What these hosts cost together per hour; None when any of them has no price."""
    prices = [hourly_usd(h) for h in hosts]
    return None if any(p is None for p in prices) else sum(prices)  # type: ignore[arg-type]


def unpriced(hosts: Sequence[Host]) -> list[str]:
    """The hosts the inventory gives no price for."""
    return [h.name for h in hosts if hourly_usd(h) is None]


def dollars(amount: float | None) -> str:
    """$1,234 / $12.40 / $0.031; '—' for no price."""
    if amount is None:
        return "—"
    if amount >= 100:
        return f"${amount:,.0f}"
    if amount >= 1:
        return f"${amount:.2f}"
    return f"${amount:.3f}"
