"""A run's membership history (record.Run.members) for the report: which hosts trained from which
update to which, and the changes to mark on the plots.

train.run.elastic appends an entry each time the run goes on without a lost host:

    [{"hosts": ["v100a", "v100b"], "from_update": 0, "why": "start"},
     {"hosts": ["v100a"], "from_update": 1200, "why": "v100b lost at update 1240 (unreachable)",
      "lost": ["v100b"], "lost_at": 1240, "time": 1795400000.0}]

(`lost`, `lost_at` and `time` are newer; older entries have them only in `why`, which is parsed.)
An entry that adds hosts is a join; train.run.rejoin writes one when a lost host comes back
(why: "v100c rejoined at update 60", labelled "v100c rejoined at 60"). A membership ends at the
update the next one's change happened (the loss), or at the run's last update; the updates
between the next one's `from_update` and that loss were trained twice (the checkpoint interval's
loss).

    >>> m = [{"hosts": ["v100a", "v100b"], "from_update": 0, "why": "start"},
    ...      {"hosts": ["v100a"], "from_update": 1200, "why": "v100b lost at update 1240 (unreachable)"}]
    >>> [(s.hosts, s.first, s.last) for s in spans(m, last_update=2000)]
    [(['v100a', 'v100b'], 0, 1240), (['v100a'], 1200, 2000)]
    >>> [c.label for c in changes(m)]
    ['v100b lost at 1,240']
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

_LOST = re.compile(r"^(?P<hosts>[^()]+?) lost at update (?P<at>[\d,]+)(?: \((?P<how>.*)\))?")


@dataclass(frozen=True)
class Change:
    """A change of membership: at `update` (the update the run had reached), and where it went on
    from (`resumed`, the checkpoint's update). `time`: unix seconds when tandem acted, if known."""

    update: int
    label: str  # "v100b lost at 1,240", "v100b joined at 2,000"
    kind: str  # "lost", "joined", "changed"
    hosts: list[str]  # the hosts lost or joined
    resumed: int
    how: str | None = None  # "unreachable", "killed by SIGKILL", ...
    time: float | None = None


@dataclass(frozen=True)
class Span:
    """Hosts that trained together from update `first` to `last` (None: unknown, the run's end)."""

    hosts: list[str]
    first: int
    last: int | None
    why: str  # how it began: "start", or the change's own words
    ended: str | None  # how it ended: the next change's label, or None (the run's end)


def _int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.replace(",", ""))
        except ValueError:
            return None
    return None


def _entries(members: Sequence[dict] | None) -> list[dict]:
    return [m for m in (members or []) if isinstance(m, dict) and isinstance(m.get("hosts"), list)]


def change_of(before: dict, entry: dict) -> Change:
    """The change from membership `before` to `entry`."""
    resumed = _int(entry.get("from_update")) or 0
    why = str(entry.get("why") or "")
    match = _LOST.match(why)
    lost = entry.get("lost")
    if not isinstance(lost, list):
        lost = [h.strip() for h in match.group("hosts").split(",")] if match else \
            [h for h in before["hosts"] if h not in entry["hosts"]]
    at = _int(entry.get("lost_at"))
    if at is None:
        at = _int(match.group("at")) if match else resumed
    how = match.group("how") if match else None
    when = entry.get("time") if isinstance(entry.get("time"), int | float) else None
    joined = [h for h in entry["hosts"] if h not in before["hosts"]]
    if lost:
        return Change(at, f"{', '.join(lost)} lost at {at:,}", "lost", list(lost), resumed, how, when)
    if joined:  # "rejoined": a host the run had lost, back (train.run.rejoin)
        verb = "rejoined" if "rejoined" in why else "joined"
        return Change(resumed, f"{', '.join(joined)} {verb} at {resumed:,}", "joined", joined, resumed, None, when)
    return Change(resumed, f"restarted at {resumed:,}" + (f" ({why})" if why else ""), "changed", [], resumed,
                  None, when)


def changes(members: Sequence[dict] | None) -> list[Change]:
    """Every change of membership, in order (none for a run that kept its hosts)."""
    entries = _entries(members)
    return [change_of(before, entry) for before, entry in zip(entries, entries[1:], strict=False)]


def spans(members: Sequence[dict] | None, last_update: int | None = None) -> list[Span]:
    """Which hosts trained from which update to which; `last_update`: where the run is now."""
    entries = _entries(members)
    found = changes(entries)
    out = []
    for i, entry in enumerate(entries):
        nxt = found[i] if i < len(found) else None
        out.append(Span(list(entry["hosts"]), _int(entry.get("from_update")) or 0,
                        nxt.update if nxt else last_update, str(entry.get("why") or ("start" if i == 0 else "")),
                        nxt.label if nxt else None))
    return out


def rank0_hosts(members: Sequence[dict] | None) -> list[str]:
    """The hosts that were rank 0 (the first of each membership), in the order they became it:
    fairseq logs progress on rank 0 only, so a run whose rank 0's host was lost has its progress in
    more than one host's log."""
    out: list[str] = []
    for entry in _entries(members):
        if entry["hosts"] and entry["hosts"][0] not in out:
            out.append(entry["hosts"][0])
    return out


def redone(members: Sequence[dict] | None) -> int:
    """Updates trained twice: from each checkpoint the run went on from to the update it had reached."""
    return sum(max(0, c.update - c.resumed) for c in changes(members))


def describe(members: Sequence[dict] | None, last_update: int | None = None) -> str | None:
    """One sentence for the report's answer; None for a run that kept its hosts."""
    found = changes(members)
    if not found:
        return None
    parts = []
    for s in spans(members, last_update):
        to = f"{s.last:,}" if s.last is not None else "?"
        parts.append(f"{', '.join(s.hosts)} from update {s.first:,} to {to}")
    again = redone(members)
    return ("; ".join(parts) + f" ({len(found)} change{'s' if len(found) > 1 else ''}: "
            + "; ".join(c.label + (f" ({c.how})" if c.how else "") + f", went on from {c.resumed:,}"
                        for c in found)
            + f"; {again:,} updates trained again)")


def time_of_change(change: Change, intervals: Sequence) -> float | None:
    """When the run reached the change's update (unix seconds), from the log's intervals
    (train.report.series.Interval: update, updates, step_s, start, end) before tandem acted
    (`change.time`, where known): the first interval that covers it, else the last one before it
    carried on at its pace; else the time tandem acted."""
    before = [iv for iv in intervals if change.time is None or iv.end <= change.time]
    u = change.update
    for iv in before:
        first = iv.update - iv.updates
        if first < u <= iv.update:
            return iv.start + (u - first) * iv.step_s
    reached = [iv for iv in before if iv.update <= u]
    if reached:
        last = max(reached, key=lambda iv: iv.end)
        t = last.end + (u - last.update) * last.step_s
        return min(t, change.time) if change.time is not None else t
    return change.time
