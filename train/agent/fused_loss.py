"""fairseq's label-smoothed cross-entropy without its [tokens x vocabulary] fp32 tensors.

fairseq's criterion (label_smoothed_cross_entropy, every preset's) takes log_softmax of the
decoder's fp16 logits in fp32, keeps that fp32 tensor for the backward pass, gathers the target's
entry, sums each row, and its backward writes a dense fp32 gradient before casting it back to fp16:
about 30 bytes of memory traffic an entry. For Transformer big at 26,985 tokens x 33k entries
(one H100's batch) that is ~27 GB a forward and backward, and 3.6 GB held from the forward to the
backward. Here the loss is computed from the logits directly:

    nll_i    = lse_i - x_i[target_i]            lse_i = log(sum_j exp(x_ij))
    smooth_i = V * lse_i - sum_j x_ij
    loss     = (1 - eps - eps_i) * sum_i nll_i + eps_i * sum_i smooth_i,   eps_i = eps / (V - 1)

(fairseq's own formula, padding rows left out), and the gradient of a row is

    (1 - eps - eps_i + eps_i * V) * softmax(x_i) - (1 - eps - eps_i) * onehot(target_i) - eps_i

written straight into an fp16 tensor: the forward reads the logits, the backward reads them again
and writes their gradient (about 6 bytes an entry when torch.compile fuses each pass into one
kernel, as it does on GPUs) and only the fp16 logits wait for the backward. Rows go in chunks, so
no pass holds more than a chunk in fp32 even unfused. GPU logits only (compiled: unfused it is
slower than fairseq's); elsewhere, or without triton, fairseq's loss as before.

TANDEM_FUSED_LOSS=1 (`--set fused_loss=true`) installs it; train/agent/fairseq_train.py calls
install(). tests/unit/train/agent/test_fused_loss.py compares loss and gradient with fairseq's.
"""

from __future__ import annotations

import functools
import logging
import os

logger = logging.getLogger("tandem.fused_loss")

CHUNK_ENTRIES = 1 << 26  # entries of a chunk of rows: 256 MiB in fp32 wherever a pass is not fused
DEVICES = {"cuda"}  # where the loss is computed from the logits (compiled); fairseq's own elsewhere


def row_stats(logits, target):
    """Each row's log-sum-exp, its target's logit and its sum, in fp32."""
    import torch

    x = logits.float()
    return torch.logsumexp(x, dim=-1), x.gather(-1, target.unsqueeze(-1)).squeeze(-1), x.sum(dim=-1)


def row_grads(logits, target, lse, keep, scale, smoothing):
    """The loss's gradient for a chunk of rows, in the logits' dtype. `scale` is the incoming
    gradient; padding rows (keep false) get zeros."""
    import torch

    eps_i = smoothing / (logits.size(-1) - 1)
    on_target = 1.0 - smoothing - eps_i
    probs = torch.exp(logits.float() - lse.unsqueeze(-1))
    grad = (on_target + eps_i * logits.size(-1)) * probs - eps_i
    grad = grad.scatter_add(-1, target.unsqueeze(-1), torch.full_like(lse, -on_target).unsqueeze(-1))
    return (grad * (scale * keep.to(grad.dtype)).unsqueeze(-1)).to(logits.dtype)


@functools.cache
def kernels(compiled: bool):
    """(row_stats, row_grads), each compiled into fused kernels where asked (GPUs): the number of
    rows changes with every batch, so compiled for any number of them. Unfused, chunk by chunk,
    they hold less memory than fairseq's but take more time (benchmarks/loss_kernels.py on a CPU:
    0.75 against 2.38 GiB, 2.4x the time): the tests' reference, not a path runs take."""
    if not compiled:
        return row_stats, row_grads
    import torch

    return torch.compile(row_stats, dynamic=True), torch.compile(row_grads, dynamic=True)


def chunks(rows: int, vocabulary: int):
    step = max(1, CHUNK_ENTRIES // max(1, vocabulary))
    return [slice(start, min(rows, start + step)) for start in range(0, rows, step)]


@functools.cache
def loss_function():
    """The autograd Function (made once: torch is imported on the hosts only)."""
    import torch

    class LabelSmoothedLoss(torch.autograd.Function):
        @staticmethod
        def forward(ctx, logits, target, smoothing, ignore_index, compiled):
            stats, _ = kernels(compiled)
            keep = target.ne(ignore_index) if ignore_index is not None else torch.ones_like(target, dtype=torch.bool)
            safe_target = target.masked_fill(~keep, 0)  # a padding index may lie past the vocabulary
            lse = logits.new_empty(target.shape, dtype=torch.float32)
            nll = logits.new_zeros((), dtype=torch.float32)
            smooth = logits.new_zeros((), dtype=torch.float32)
            vocabulary = logits.size(-1)
            for rows in chunks(target.numel(), vocabulary):
                lse[rows], on_target, total = stats(logits[rows], safe_target[rows])
                weight = keep[rows].float()
                nll += ((lse[rows] - on_target) * weight).sum()
                smooth += ((vocabulary * lse[rows] - total) * weight).sum()
            eps_i = smoothing / (vocabulary - 1)
            loss = (1.0 - smoothing - eps_i) * nll + eps_i * smooth
            ctx.save_for_backward(logits, safe_target, lse, keep)
            ctx.smoothing, ctx.compiled = smoothing, compiled
            ctx.mark_non_differentiable(nll)
            return loss, nll

        @staticmethod
        def backward(ctx, grad_loss, _grad_nll):
            logits, target, lse, keep = ctx.saved_tensors
            _, grads = kernels(ctx.compiled)
            grad = torch.empty_like(logits)
            for rows in chunks(target.numel(), logits.size(-1)):
                grad[rows] = grads(logits[rows], target[rows], lse[rows], keep[rows], grad_loss, ctx.smoothing)
            return grad, None, None, None, None

    return LabelSmoothedLoss


def label_smoothed_loss(logits, target, smoothing: float, ignore_index: int | None, compiled: bool = False):
    """(loss, nll_loss) summed over the rows of `logits` [rows, V] whose `target` is not
    `ignore_index`: fairseq's label_smoothed_nll_loss(log_softmax(logits), ...) with reduce=True."""
    return loss_function().apply(logits, target, smoothing, ignore_index, compiled)


def fused_compute_loss(original):
    """LabelSmoothedCrossEntropyCriterion.compute_loss computing from the logits; fairseq's own
    where it differs from plain logits (an adaptive softmax, per-token losses asked for)."""

    def compute_loss(self, model, net_output, sample, reduce=True):
        decoder = getattr(model, "decoder", None)
        logits = net_output[0]
        if not reduce or decoder is None or getattr(decoder, "adaptive_softmax", None) is not None \
                or logits.device.type not in DEVICES:
            return original(self, model, net_output, sample, reduce=reduce)
        target = model.get_targets(sample, net_output)
        if self.ignore_prefix_size > 0:
            logits, target = logits[:, self.ignore_prefix_size:, :], target[:, self.ignore_prefix_size:]
        logits = logits.reshape(-1, logits.size(-1))
        return label_smoothed_loss(logits, target.reshape(-1), self.eps, self.padding_idx,
                                   compiled=logits.is_cuda)

    compute_loss._tandem = True  # type: ignore[attr-defined]
    return compute_loss


def install() -> None:
    """fairseq's label_smoothed_cross_entropy computes from the logits (TANDEM_FUSED_LOSS=1)."""
    if os.environ.get("TANDEM_FUSED_LOSS") != "1":
        return
    from train.agent.compiled_layers import gpu_compiler_available

    if not gpu_compiler_available():
        logger.warning("tandem: fused_loss=true, but torch.compile cannot make GPU kernels here (no triton "
                       "next to torch): fairseq's loss as before")
        return
    from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion as criterion

    if getattr(criterion.compute_loss, "_tandem", False):
        return
    criterion.compute_loss = fused_compute_loss(criterion.compute_loss)
    logger.info("tandem: label-smoothed cross-entropy from the logits (train/agent/fused_loss.py)")
