"""The label-smoothed loss from the logits (train/agent/trainer/fused_loss.py) against fairseq's own
criterion: the same loss, nll and gradient, padding left out, on CPU tensors."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from fairseq import utils
from fairseq.criterions.label_smoothed_cross_entropy import (
    LabelSmoothedCrossEntropyCriterion,
    label_smoothed_nll_loss,
)
from fairseq.data import Dictionary

from train.agent.trainer import fused_loss
from train.agent.trainer.fused_loss import label_smoothed_loss

PAD = 1


def batch(rows: int = 37, vocabulary: int = 101, dtype=torch.float32, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(rows, vocabulary, generator=gen) * 3).to(dtype).requires_grad_()
    target = torch.randint(2, vocabulary, (rows,), generator=gen)
    target[::5] = PAD
    return logits, target


def fairseqs(logits, target, smoothing):
    lprobs = utils.log_softmax(logits, dim=-1)
    return label_smoothed_nll_loss(lprobs, target, smoothing, ignore_index=PAD)


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_loss_and_gradient_are_fairseqs(smoothing, monkeypatch):
    monkeypatch.setattr(fused_loss, "CHUNK_ENTRIES", 1000)  # several chunks of rows
    theirs_logits, target = batch()
    ours_logits = theirs_logits.detach().clone().requires_grad_()
    theirs, theirs_nll = fairseqs(theirs_logits, target, smoothing)
    ours, ours_nll = fused_loss.label_smoothed_loss(ours_logits, target, smoothing, PAD)
    torch.testing.assert_close(ours, theirs)
    torch.testing.assert_close(ours_nll, theirs_nll)
    (theirs * 3.0).backward()
    (ours * 3.0).backward()
    torch.testing.assert_close(ours_logits.grad, theirs_logits.grad)
    assert ours_logits.grad[::5].eq(0).all()  # padding rows teach nothing


@pytest.mark.parametrize("chunk_entries", [fused_loss.CHUNK_ENTRIES, 1000])
def test_fp16_logits_get_an_fp16_gradient_as_close_as_fairseqs(chunk_entries, monkeypatch):
    """fp16 training: fairseq computes in fp32 from the fp16 logits and casts the gradient back
    (unfused chunks write their fp16 gradient in place)."""
    monkeypatch.setattr(fused_loss, "CHUNK_ENTRIES", chunk_entries)
    theirs_logits, target = batch(dtype=torch.float16)
    ours_logits = theirs_logits.detach().clone().requires_grad_()
    theirs, _ = fairseqs(theirs_logits, target, 0.1)
    ours, _ = fused_loss.label_smoothed_loss(ours_logits, target, 0.1, PAD)
    assert ours.dtype == torch.float32
    torch.testing.assert_close(ours, theirs)
    (theirs * 128.0).backward()  # a loss scale
    (ours * 128.0).backward()
    assert ours_logits.grad.dtype == torch.float16
    torch.testing.assert_close(ours_logits.grad, theirs_logits.grad, rtol=1e-3, atol=1e-3)


def test_compiled_kernels_give_the_same_loss_whatever_the_rows():
    """What GPUs run: each pass through torch.compile (here its graph capture and autograd on CPU;
    the GPU's code generation is torch's), over batches of other sizes, all rows in one call of each
    pass (the chunks are for unfused passes), without compiling again for each."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    compile = torch.compile
    fused_loss.kernels.cache_clear()
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(torch, "compile", lambda fn, **kw: compile(fn, backend="aot_eager", **kw))
            patch.setattr(fused_loss, "CHUNK_ENTRIES", 2000)  # 19 rows a chunk, were they unfused
            assert fused_loss.kernels(True)[0] is not fused_loss.forward_pass
            for rows in (37, 50, 23):
                logits, target = batch(rows=rows, seed=rows)
                expected, _ = fairseqs(logits, target, 0.1)
                expected.backward()
                wanted, logits.grad = logits.grad, None
                loss, _ = fused_loss.label_smoothed_loss(logits, target, 0.1, PAD, compiled=True)
                loss.backward()
                torch.testing.assert_close(loss, expected)
                torch.testing.assert_close(logits.grad, wanted)
    finally:
        fused_loss.kernels.cache_clear()
        torch._dynamo.reset()
    assert counters["stats"]["unique_graphs"] == 2, dict(counters["stats"])  # each pass compiled once


class Model(torch.nn.Module):
    """What the criterion asks of a fairseq model: its targets, normalized probabilities, decoder."""

    def __init__(self):
        super().__init__()
        self.decoder = SimpleNamespace(adaptive_softmax=None)

    def get_targets(self, sample, net_output):
        return sample["target"]

    def get_normalized_probs(self, net_output, log_probs, sample=None):
        return utils.log_softmax(net_output[0], dim=-1)


def criterion(ignore_prefix_size: int = 0):
    dictionary = Dictionary()  # pad() == 1 == PAD
    task = SimpleNamespace(target_dictionary=dictionary)
    return LabelSmoothedCrossEntropyCriterion(task, False, 0.1, ignore_prefix_size=ignore_prefix_size)


@pytest.mark.parametrize("prefix", [0, 2])
def test_the_installed_criterion_gives_fairseqs_loss(prefix, monkeypatch):
    logits, target = batch(rows=6 * 7)
    net_output = (logits.view(6, 7, -1), {})
    sample = {"target": target.view(6, 7)}
    expected = criterion(prefix).compute_loss(Model(), net_output, sample)
    monkeypatch.setattr(LabelSmoothedCrossEntropyCriterion, "compute_loss",
                        LabelSmoothedCrossEntropyCriterion.compute_loss)  # undone after the test
    monkeypatch.setenv("TANDEM_FUSED_LOSS", "1")
    monkeypatch.setattr("train.agent.trainer.compiled_layers.gpu_compiler_available", lambda: True)
    monkeypatch.setattr(fused_loss, "DEVICES", {"cpu"})  # the GPU's path, on CPU tensors
    # what install() sets, undone after
    monkeypatch.setattr("train.agent.trainer.compiled_layers.compiles_in_training", False)
    called = []
    monkeypatch.setattr(fused_loss, "label_smoothed_loss",
                        lambda *a, **kw: called.append(1) or label_smoothed_loss(*a, **kw))
    fused_loss.install()
    assert LabelSmoothedCrossEntropyCriterion.compute_loss._tandem
    got = criterion(prefix).compute_loss(Model(), net_output, sample)
    torch.testing.assert_close(got, expected)
    assert called, "the loss from the logits was not taken"


def test_without_triton_fairseqs_loss_stays(monkeypatch, caplog):
    monkeypatch.setattr(LabelSmoothedCrossEntropyCriterion, "compute_loss",
                        LabelSmoothedCrossEntropyCriterion.compute_loss)
    before = LabelSmoothedCrossEntropyCriterion.compute_loss
    monkeypatch.setenv("TANDEM_FUSED_LOSS", "1")
    monkeypatch.setattr("train.agent.trainer.compiled_layers.gpu_compiler_available", lambda: False)
    fused_loss.install()
    assert LabelSmoothedCrossEntropyCriterion.compute_loss is before
    assert "no triton" in caplog.text


@pytest.mark.skipif(not __import__("shutil").which("g++"), reason="inductor's CPU code needs a C++ compiler")
def test_compiled_each_pass_is_one_kernel_and_the_backward_allocates_only_the_gradient(monkeypatch):
    """What a GPU runs, made by inductor in C++ on this CPU: the forward pass one kernel, the backward
    one kernel that writes the fp16 gradient and allocates nothing else, whatever CHUNK_ENTRIES says
    (a compiled pass holds no fp32 rows). Before: a chunk's backward scattered into a fresh fp32
    [rows x V] buffer and its result was copied into the gradient, and 4 chunks here (13-15 at big's
    batch on an H100) were 4 calls of each pass, each with its own small operations."""
    import torch._dynamo
    import torch._inductor.config
    from torch.profiler import ProfilerActivity, profile

    rows, vocabulary = 64, 1000
    logits, target = batch(rows, vocabulary, dtype=torch.float16)
    monkeypatch.setattr(fused_loss, "CHUNK_ENTRIES", rows * vocabulary // 4)
    monkeypatch.setattr(torch._inductor.config.cpp, "enable_kernel_profile", True)
    torch._dynamo.reset()
    fused_loss.kernels.cache_clear()
    try:
        expected, _ = fairseqs(logits, target, 0.1)
        expected.backward()
        wanted, logits.grad = logits.grad, None
        fused_loss.label_smoothed_loss(logits, target, 0.1, PAD, compiled=True)[0].backward()  # compiles
        logits.grad = None
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            loss, _ = fused_loss.label_smoothed_loss(logits, target, 0.1, PAD, compiled=True)
            loss.backward()
    finally:
        fused_loss.kernels.cache_clear()
        torch._dynamo.reset()
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(logits.grad, wanted, rtol=1e-3, atol=1e-3)
    events = prof.events()
    calls = [e for e in events if e.name.startswith("Torch-Compiled Region")]
    assert len(calls) == 2, [e.name for e in calls]  # one forward, one backward
    kernels = [e.name for e in events if "cpp_fused" in e.name]
    assert len(kernels) == 2, kernels

    def allocated(under: str) -> int:
        def inside(e) -> bool:
            while e is not None:
                if e.name.startswith(under):
                    return True
                e = e.cpu_parent
            return False
        return sum(max(0, e.self_cpu_memory_usage) for e in events if inside(e))

    gradient = rows * vocabulary * 2  # fp16
    assert gradient <= allocated("autograd::engine::evaluate_function: LabelSmoothedLossBackward") < gradient + 1024
