"""Going on without a lost host: the run restarts from its last checkpoint on the hosts left.

`fab train` (following, `--elastic`, the default) calls `continue_without` when the run stopped
before its last update. The lost hosts are those SSH cannot reach, else the host whose rank
torchrun saw fail first. The rest restart from the newest checkpoint they hold (copied host to
host while the run went on; the controller's copy where none has it, so losing rank 0's host
works too), with `--update-freq` scaled so that the effective batch (tokens per update: max_tokens ×
update-freq × ranks) stays the same: scaled by ranks, not hosts (2 hosts × 2 ranks → v100a's 2
ranks: ×2; 3 → 2 hosts: ×1.5, rounded up to ×2), and fairseq's learning-rate schedule continuing
from the checkpoint's update count. The run remembers its membership (Run.members): which hosts,
how many ranks, from which update, with which update-freq, and why. When a lost host comes back,
train.run.rejoin grows the run back to it at its next checkpoint, with the update-freq scaled back.
"""

from __future__ import annotations

import time

from ..cluster import Host, world_size
from . import batching, checkpoints, launch, record


def lost_hosts(states: list[launch.HostState]) -> list[str]:
    """The hosts to leave out: the unreachable ones, else the one whose rank failed first
    without having lost a peer first (RankEnd.blame_order)."""
    unreachable = [s.name for s in states if not s.reachable]
    if unreachable:
        return unreachable
    failed = sorted((s for s in states if s.ended and not s.stopped_by_user), key=lambda s: s.ended.blame_order())
    return [failed[0].name] if failed else []


def scaled_update_freq(update_freq: int, ranks_before: int, ranks_after: int) -> int:
    """The update frequency that keeps the effective batch (ranks × update_freq batches of
    max_tokens) the same, rounded up where it does not divide (3 ranks → 2: ×1.5 → 2, a slightly
    larger batch, never a smaller). Ranks, not hosts: every rank trains on a batch of its own.

    >>> scaled_update_freq(1, 4, 2)  # 2 hosts x 2 ranks, one host lost
    2
    """
    return max(1, -(-update_freq * ranks_before // ranks_after))


def ranks_said(hosts: list[Host]) -> str:
    """' (4 ranks)' where hosts run several ranks each: the restart's line says the world it trains in."""
    n = world_size(hosts)
    return f" ({n} ranks)" if n != len(hosts) else ""


def continue_without(run: record.Run, hosts: list[Host], states: list[launch.HostState],
                     say=print, at: int | None = None) -> list[Host] | None:
    """Restart `run` on the hosts left; returns them, or None when no host or no checkpoint is left
    (the run stays stopped, and why_stopped_early says why). `at`: the update the run had reached,
    as last seen (rank 0's log is out of reach when its host is the one lost)."""
    lost = lost_hosts(states)
    survivors = [h for h in hosts if h.name not in lost]
    if not lost or not survivors:
        return None
    rank0 = states[0].progress
    at = rank0.update if rank0 else (at or 0)
    launch.stop(run, survivors)  # nothing of the old membership left on the hosts that stay
    copy = checkpoints.share_checkpoint(run, survivors)
    if copy is None:
        say(f"{', '.join(lost)} lost at update {at:,}; no checkpoint to continue from")
        return None
    scaled = scaled_update_freq(run.update_freq, world_size(hosts), world_size(survivors))
    update_freq = batching.update_freq_for(run, world_size(survivors), scaled)  # the recipe's batch, re-derived
    resumed = checkpoints.checkpoint_update(copy)
    if not run.members:
        run.members.append({"hosts": [h.name for h in hosts], "from_update": 0, "why": "start",
                            "update_freq": run.update_freq, "ranks": world_size(hosts)})  # the batch a rejoin restores
    why = "unreachable" if any(not s.reachable for s in states if s.name in lost) else next(
        (s.ended.how for s in states if s.name in lost and s.ended), "stopped")
    run.members.append({"hosts": [h.name for h in survivors], "from_update": resumed,
                        "why": f"{', '.join(lost)} lost at update {at} ({why})",
                        "lost": lost, "lost_at": at, "update_freq": update_freq, "ranks": world_size(survivors),
                        "time": round(time.time(), 1)})  # train.report.members
    run.hosts, run.update_freq = [h.name for h in survivors], update_freq
    run.save()
    launch.start(run, survivors)
    say(f"{', '.join(lost)} lost at update {at:,} ({why}); continuing on {', '.join(run.hosts)} "
        f"from update {resumed:,}, update-freq {update_freq}" + ranks_said(survivors))
    return survivors
