"""The GPU step switches (train/agent/trainer/fast_steps.py): the same training arithmetic as fairseq's own
code, and the launcher turning them on for GPU hosts only. Run on CPU tensors (foreach instead of
fused: the same update)."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from fairseq.optim.adam import Adam
from fairseq.optim.fp16_optimizer import _FP16OptimizerMixin

from train.agent.trainer import fast_steps

CONFIG = {"lr": 1e-3, "betas": (0.9, 0.98), "eps": 1e-8}


def weights(seed: int = 0) -> list[torch.nn.Parameter]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(shape, generator=gen)) for shape in [(32, 16), (16,), (7, 3)]]


def train(optimizer, params, steps: int, seed: int = 1) -> None:
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen)
        optimizer.step()


@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
def test_torch_adamw_steps_as_fairseqs_adam(weight_decay):
    theirs, ours = weights(), weights()
    train(Adam(theirs, weight_decay=weight_decay, **CONFIG), theirs, 20)
    train(fast_steps.torch_adam(ours, weight_decay=weight_decay, **CONFIG), ours, 20)
    for a, b in zip(theirs, ours, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_a_checkpoint_of_fairseqs_adam_resumes_on_torchs():
    """A run started before the switch (fairseq's Adam saved `step` as a number) goes on with it."""
    before, after = weights(), weights()
    old = Adam(before, weight_decay=0.0, **CONFIG)
    train(old, before, 5)
    state = copy.deepcopy(old.state_dict())  # as read from a checkpoint file
    assert not torch.is_tensor(next(iter(state["state"].values()))["step"])
    for a, b in zip(before, after, strict=True):
        b.data.copy_(a.data)
    new = fast_steps.torch_adam(after, weight_decay=0.0, **CONFIG)
    new.load_state_dict(state)
    train(old, before, 5, seed=2)
    train(new, after, 5, seed=2)
    for a, b in zip(before, after, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_fp16_weights_keep_fairseqs_adam():
    """--memory-efficient-fp16 steps fp16 weights: fairseq's Adam keeps their moments in fp32."""
    params = [torch.nn.Parameter(torch.zeros(4, dtype=torch.half))]
    assert isinstance(fast_steps.torch_adam(params, weight_decay=0.0, **CONFIG), Adam)


def fp16_optimizer(seed: int = 0):
    """The attributes of fairseq's FP16Optimizer the copies read: fp16 weights with gradients and
    their flat fp32 copy (device index None: a CPU tensor)."""
    gen = torch.Generator().manual_seed(seed)
    params = [torch.nn.Parameter(torch.randn(s, generator=gen).half()) for s in [(5, 4), (3,), (2, 2, 2)]]
    for p in params[:-1]:
        p.grad = torch.randn(p.shape, generator=gen).half()
    flat = torch.nn.Parameter(torch.cat([p.data.float().view(-1) for p in params]))
    flat.grad = torch.full_like(flat, 7.0)
    return SimpleNamespace(fp16_params=params, fp32_params={None: flat}, has_flat_params=True, _needs_sync=True)


def test_gradients_reach_the_flat_copy_as_fairseq_copies_them():
    theirs, ours = fp16_optimizer(), fp16_optimizer()
    _FP16OptimizerMixin._sync_fp16_grads_to_fp32(theirs)
    fast_steps.grads_to_flat_fp32(ours)
    torch.testing.assert_close(ours.fp32_params[None].grad, theirs.fp32_params[None].grad, rtol=0, atol=0)
    assert not ours._needs_sync
    assert ours.fp32_params[None].grad[-8:].eq(0).all()  # the weight without a gradient: zeros


def test_the_flat_copy_reaches_the_fp16_weights_as_fairseq_copies_them():
    theirs, ours = fp16_optimizer(), fp16_optimizer()
    for opt in (theirs, ours):
        opt.fp32_params[None].data.mul_(-3.0).add_(0.25)
    _FP16OptimizerMixin._sync_fp32_params_to_fp16(theirs)
    fast_steps.flat_fp32_to_params(ours)
    for a, b in zip(theirs.fp16_params, ours.fp16_params, strict=True):
        assert torch.equal(a.data, b.data)


def test_fp16s_flat_master_copy_takes_torchs_adamw(monkeypatch):
    """FP16Optimizer refuses an optimizer without flat-parameter support (the first H100 run of the
    switch died on it): fairseq's Adam built with the switch on says it has it."""
    from fairseq.optim.adam import FairseqAdam, FairseqAdamConfig

    monkeypatch.setenv("TANDEM_FUSED_ADAM", "1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # fairseq's fused path is for GPUs only
    monkeypatch.setattr("fairseq.optim.adam.get_fused_adam_class", lambda: fast_steps.torch_adam)
    flat = torch.nn.Parameter(torch.zeros(10))
    optimizer = FairseqAdam(FairseqAdamConfig(lr=[1e-3], adam_betas="(0.9, 0.98)", tpu=False), [flat])
    assert isinstance(optimizer.optimizer, fast_steps.fused_adamw_class())
    assert optimizer.supports_flat_params
