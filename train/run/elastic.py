"""The update-freq of a membership: the effective batch (tokens per update: max_tokens x update-freq x
ranks) kept when the hosts' keepers (train.agent.keeper.loop) go on without a lost host or take it back,
scaled by ranks, not hosts (2 hosts x 2 ranks -> v100a's 2 ranks: x2; 3 -> 2 hosts: x1.5, rounded up
to x2), with fairseq's learning-rate schedule continuing from the checkpoint's update count.
train.run.keepers gives each membership its update-freq with this.
"""

from __future__ import annotations


def scaled_update_freq(update_freq: int, ranks_before: int, ranks_after: int) -> int:
    """The update frequency that keeps the effective batch (ranks × update_freq batches of
    max_tokens) the same, rounded up where it does not divide (3 ranks → 2: ×1.5 → 2, a slightly
    larger batch, never a smaller). Ranks, not hosts: every rank trains on a batch of its own.

    >>> scaled_update_freq(1, 4, 2)  # 2 hosts x 2 ranks, one host lost
    2
    """
    return max(1, -(-update_freq * ranks_before // ranks_after))

