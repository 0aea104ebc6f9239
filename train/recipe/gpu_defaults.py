"""What a run gets on GPU hosts unless the user says otherwise: its precision, and torch's caching
allocator. One home for both, below the launcher (train.run.command sets them) and the planner
(train.plan.batch sizes GPU memory by the allocator the ranks will run with)."""

from __future__ import annotations

# torch's caching allocator on GPU hosts: segments that grow in place instead of a new reserve per
# batch shape (fairseq's batches all differ), so a long run's peak stays near its tensors'
ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"
ALLOCATOR = "expandable_segments:True"


def default_precision(gpus_per_host: list[int]) -> str:
    """fp16 where every host has GPUs (V100 tensor cores need it; fairseq's GPU recipes use it),
    fp32 where any host is CPU-only (fp16/bf16 need a GPU)."""
    return "fp16" if gpus_per_host and all(g > 0 for g in gpus_per_host) else "fp32"
