"""--comm powersgd:R's host-side hook (train.recipe.strategies.powersgd): torch's PowerSGD comm hook
registered on every DistributedDataParallel fairseq builds (pytorch_ddp, on GPUs and, through
train.agent.trainer.fairseq_train.ddp_on_cpu, on CPU hosts with gloo), as fairseq registers its own fp16
compression hook. TANDEM_POWERSGD=RANK:START asks for it; without it nothing changes.

    PowerSGDState(process_group, matrix_approximation_rank=RANK, start_powerSGD_iter=START,
                  use_error_feedback=True, warm_start=True)

A DDP model takes one hook only; the state lives in the process (not in fairseq's checkpoints).
"""

from __future__ import annotations

import os

VARIABLE = "TANDEM_POWERSGD"  # RANK:START, as train.recipe.strategies.powersgd sets it


def settings(text: str) -> tuple[int, int]:
    """(rank, start) of TANDEM_POWERSGD's `RANK:START`."""
    rank, _, start = text.partition(":")
    return int(rank), int(start or 2)


def register(ddp_model, rank: int, start: int, process_group=None):
    """Register the PowerSGD hook (error feedback on) on a DDP model; returns its state."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

    state = powersgd.PowerSGDState(process_group=process_group, matrix_approximation_rank=rank,
                                   start_powerSGD_iter=max(2, start), use_error_feedback=True, warm_start=True)
    ddp_model.register_comm_hook(state, powersgd.powerSGD_hook)
    return state


def install() -> None:
    """fairseq's DistributedDataParallel registers the hook once built, when TANDEM_POWERSGD is set."""
    spec = os.environ.get(VARIABLE)
    if not spec:
        return
    rank, start = settings(spec)
    from fairseq.models import distributed_fairseq_model as dfm

    base = dfm.DistributedDataParallel
    if getattr(base, "_tandem_powersgd", False):
        return

    class DistributedDataParallel(base):  # type: ignore[misc, valid-type]
        _tandem_powersgd = True

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.powersgd_state = register(self, rank, start, kwargs.get("process_group"))

    dfm.DistributedDataParallel = DistributedDataParallel
