"""Faster optimizer steps on GPUs: two switches for what fairseq 0.12 does slowly without apex.

- **fused Adam** (TANDEM_FUSED_ADAM=1, `--set fused_adam=false` turns it off): fairseq's Adam
  looks for apex's FusedAdam, which tandem's hosts do not have, and otherwise steps in Python,
  ~12 kernels a tensor. Here fairseq finds torch's fused AdamW instead: one kernel over all the
  weights. fairseq's Adam is AdamW's update (decoupled weight decay), so the step is the same
  arithmetic (tests/unit/train/agent/trainer/test_fast_steps.py compares them). Only fp32 weights take it:
  fairseq's Adam keeps fp32 moments for fp16 weights (--memory-efficient-fp16), torch would keep
  them in fp16, so those stay with fairseq's Adam.
- **one-kernel master copy** (TANDEM_FLAT_MASTER_COPY=1, `--set flat_master_copy=false`): under
  --fp16 fairseq's FP16Optimizer copies each fp16 gradient into its flat fp32 copy, and each fp32
  weight back, one copy kernel a tensor (~400 an update for Transformer big, launch-bound: 11% of
  an update in the H100 profile of benchmarks/README.md). Here each direction is two kernels
  through one fp16 buffer the size of the model (2 bytes a parameter more of GPU memory).

Both are installed by train/agent/trainer/fairseq_train.py before fairseq builds its optimizer; the
launcher sets the variables on GPU hosts (train.run.command.environment).
"""

from __future__ import annotations

import functools
import logging
import os
from collections import defaultdict

logger = logging.getLogger("tandem.fast_steps")


def _steps_as_tensors(state_dict: dict) -> dict:
    """fairseq's Adam saves `step` as a number, torch's fused AdamW wants a tensor: a checkpoint of
    either resumes with the other."""
    import torch

    def with_tensor_step(state: dict) -> dict:
        if "step" in state and not torch.is_tensor(state["step"]):
            return {**state, "step": torch.tensor(float(state["step"]))}
        return state

    states = {key: with_tensor_step(state) for key, state in state_dict.get("state", {}).items()}
    return {**state_dict, "state": states}


def torch_adam(params, lr, betas, eps, weight_decay, use_fp16_stats=False, **_):
    """What fairseq's FairseqAdam builds where it would build apex's FusedAdam: torch's fused AdamW
    for fp32 weights on a GPU (foreach on a CPU, for the tests), fairseq's own Adam otherwise."""
    import torch
    from fairseq.optim.adam import Adam

    params = list(params)
    tensors = [p for group in params for p in (group["params"] if isinstance(group, dict) else [group])]
    if use_fp16_stats or any(p.dtype != torch.float32 for p in tensors):
        logger.info("tandem: fairseq's Adam (weights not fp32: its moments stay fp32)")
        return Adam(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
    fused = all(p.is_cuda for p in tensors)
    logger.info("tandem: torch's %s AdamW for %d tensors", "fused" if fused else "foreach", len(tensors))
    return fused_adamw_class()(params, lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                                 fused=fused or None, foreach=None if fused else True)


@functools.cache
def fused_adamw_class():
    """torch's AdamW that also loads a checkpoint of fairseq's Adam (made once: torch is imported
    on the hosts only)."""
    import torch

    class FusedAdamW(torch.optim.AdamW):
        supports_flat_params = True  # FP16Optimizer's one flat fp32 tensor: an ordinary parameter here

        def load_state_dict(self, state_dict):
            super().load_state_dict(_steps_as_tensors(state_dict))

    return FusedAdamW


def install_fused_adam() -> None:
    """fairseq's Adam builds torch's fused AdamW (TANDEM_FUSED_ADAM=1)."""
    if os.environ.get("TANDEM_FUSED_ADAM") != "1":
        return
    from fairseq.optim import adam

    adam.get_fused_adam_class = lambda: torch_adam


def grads_to_flat_fp32(self) -> None:
    """FP16Optimizer._sync_fp16_grads_to_fp32 for flat fp32 weights in two kernels: the fp16
    gradients concatenated into one fp16 buffer, the buffer converted into the fp32 gradient."""
    import torch

    if not self._needs_sync:
        return
    by_device = defaultdict(list)
    for p in self.fp16_params:
        if p.requires_grad:
            by_device[p.device.index].append(p)
    for device, params in by_device.items():
        buffer = _buffer(self, device, params)
        grads = [(p.grad.data if p.grad is not None else p.data.new_zeros(p.data.shape)).view(-1) for p in params]
        torch.cat(grads, out=buffer)
        self.fp32_params[device].grad.data[: buffer.numel()].copy_(buffer)
    self._needs_sync = False


def flat_fp32_to_params(self) -> None:
    """FP16Optimizer._sync_fp32_params_to_fp16 for flat fp32 weights: one conversion into the
    fp16 buffer, one foreach copy into the model's tensors."""
    import torch

    by_device = defaultdict(list)
    for p in self.fp16_params:
        by_device[p.device.index].append(p)
    for device, params in by_device.items():
        buffer = _buffer(self, device, params)
        buffer.copy_(self.fp32_params[device].data[: buffer.numel()])
        pieces = buffer.split([p.data.numel() for p in params])
        torch._foreach_copy_([p.data.view(-1) for p in params], list(pieces))


def _buffer(optimizer, device, params):
    """The fp16 staging buffer of `device`, made once (model size x 2 bytes)."""
    buffers = optimizer.__dict__.setdefault("_tandem_buffers", {})
    numel = sum(p.data.numel() for p in params)
    if device not in buffers or buffers[device].numel() != numel:
        buffers[device] = params[0].data.new_empty(numel)
    return buffers[device]


def install_flat_master_copy() -> None:
    """FP16Optimizer's copies between the fp16 model and its flat fp32 copy in a few kernels
    (TANDEM_FLAT_MASTER_COPY=1); the per-tensor copies stay where the fp32 copy is not flat (bf16)."""
    if os.environ.get("TANDEM_FLAT_MASTER_COPY") != "1":
        return
    from fairseq.optim.fp16_optimizer import _FP16OptimizerMixin

    grads, params = _FP16OptimizerMixin._sync_fp16_grads_to_fp32, _FP16OptimizerMixin._sync_fp32_params_to_fp16
    if getattr(grads, "_tandem", False):
        return

    def sync_grads(self):
        return grads_to_flat_fp32(self) if self.has_flat_params else grads(self)

    def sync_params(self):
        return flat_fp32_to_params(self) if self.has_flat_params else params(self)

    sync_grads._tandem = True  # type: ignore[attr-defined]
    _FP16OptimizerMixin._sync_fp16_grads_to_fp32 = sync_grads
    _FP16OptimizerMixin._sync_fp32_params_to_fp16 = sync_params
