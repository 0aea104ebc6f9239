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
and writes their gradient (about 6 bytes an entry: torch.compile makes each pass one kernel over all
the rows, as it does on GPUs; the target's entry is picked by comparing columns, not scattered into an
fp32 buffer, and the kernel's output is the gradient, not copied into it), and only the fp16 logits
wait for the backward. Unfused (the tests' reference), rows go in chunks, so no pass holds more than
a chunk in fp32. GPU logits only (compiled: unfused it is slower than fairseq's); elsewhere, or
without triton, fairseq's loss as before. benchmarks/loss_kernels.py counts each side's operations
and bytes.

TANDEM_FUSED_LOSS=1 (`--set fused_loss=true`) installs it; train/agent/trainer/fairseq_train.py calls
install(). tests/unit/train/agent/trainer/test_fused_loss.py compares loss and gradient with fairseq's.
"""

from __future__ import annotations

import functools
import logging
import os

logger = logging.getLogger("tandem.fused_loss")

CHUNK_ENTRIES = 1 << 26  # entries of a chunk of rows, unfused only: 256 MiB in fp32 a pass holds
DEVICES = {"cuda"}  # where the loss is computed from the logits (compiled); fairseq's own elsewhere


def forward_pass(logits, target, ignore_index: int, smoothing: float):
    """(each row's log-sum-exp, the loss, the nll) of a chunk of rows, in fp32; rows whose target is
    `ignore_index` left out. Compiled, one pass over the logits."""
    import torch

    x = logits.float()
    keep = target.ne(ignore_index)
    lse = torch.logsumexp(x, dim=-1)
    on_target = x.gather(-1, torch.where(keep, target, 0).unsqueeze(-1)).squeeze(-1)  # padding may lie past V
    nll = torch.where(keep, lse - on_target, 0.0).sum()
    smooth = torch.where(keep, x.size(-1) * lse - x.sum(dim=-1), 0.0).sum()
    eps_i = smoothing / (x.size(-1) - 1)
    return lse, (1.0 - smoothing - eps_i) * nll + eps_i * smooth, nll


def backward_pass(logits, target, lse, scale, ignore_index: int, smoothing: float, out=None):
    """The loss's gradient for a chunk of rows, in the logits' dtype: one pointwise expression of the
    logits, each row's lse and target (the target's entry picked by comparing its column, no scatter
    into an fp32 buffer), which inductor makes one kernel that reads the logits once and writes the
    gradient. `scale` is the incoming gradient; padding rows get zeros. Unfused, its last operation
    writes into `out` (the chunk of the whole gradient) instead of a copy."""
    import torch

    vocabulary = logits.size(-1)
    eps_i = smoothing / (vocabulary - 1)
    on_target = 1.0 - smoothing - eps_i
    columns = torch.arange(vocabulary, device=logits.device)
    probs = torch.exp(logits.float() - lse.unsqueeze(-1))
    grad = (on_target + eps_i * vocabulary) * probs \
        - torch.where(columns == target.unsqueeze(-1), on_target + eps_i, eps_i)
    row_scale = torch.where(target.ne(ignore_index), scale, 0.0).unsqueeze(-1)
    if out is not None:
        return torch.mul(grad, row_scale, out=out)
    return (grad * row_scale).to(logits.dtype)


@functools.cache
def kernels(compiled: bool):
    """(forward_pass, backward_pass), each compiled into fused kernels where asked (GPUs): the number
    of rows changes with every batch, so compiled for any number of them. Compiled, each is one call
    over all the rows (one chunk: no pass holds the rows in fp32); unfused, chunk by chunk, they hold
    less memory than fairseq's but take more time (benchmarks/loss_kernels.py): the tests' reference,
    not a path runs take."""
    if not compiled:
        return forward_pass, backward_pass
    import torch

    return torch.compile(forward_pass, dynamic=True), torch.compile(backward_pass, dynamic=True)


def chunks(rows: int, vocabulary: int, compiled: bool = False):
    """The slices of rows each pass takes at once: all of them where the pass is compiled."""
    step = rows if compiled else max(1, CHUNK_ENTRIES // max(1, vocabulary))
    return [slice(start, min(rows, start + step)) for start in range(0, rows, max(1, step))]


@functools.cache
def loss_function():
    """The autograd Function (made once: torch is imported on the hosts only)."""
    import torch

    class LabelSmoothedLoss(torch.autograd.Function):
        @staticmethod
        def forward(ctx, logits, target, smoothing, ignore_index, compiled):
            forward, _ = kernels(compiled)
            ignore = -1 if ignore_index is None else ignore_index  # no target is -1
            parts = chunks(target.numel(), logits.size(-1), compiled)
            if len(parts) == 1:
                lse, loss, nll = forward(logits, target, ignore, smoothing)
            else:
                lse = logits.new_empty(target.shape, dtype=torch.float32)
                loss = logits.new_zeros((), dtype=torch.float32)
                nll = logits.new_zeros((), dtype=torch.float32)
                for rows in parts:
                    lse[rows], chunk_loss, chunk_nll = forward(logits[rows], target[rows], ignore, smoothing)
                    loss += chunk_loss
                    nll += chunk_nll
            ctx.save_for_backward(logits, target, lse)
            ctx.smoothing, ctx.ignore, ctx.compiled = smoothing, ignore, compiled
            ctx.mark_non_differentiable(nll)
            ctx.set_materialize_grads(False)  # no zeros made for the nll's gradient
            return loss, nll

        @staticmethod
        def backward(ctx, grad_loss, _grad_nll):
            logits, target, lse = ctx.saved_tensors
            _, backward = kernels(ctx.compiled)
            parts = chunks(target.numel(), logits.size(-1), ctx.compiled)
            if len(parts) == 1:
                return backward(logits, target, lse, grad_loss, ctx.ignore, ctx.smoothing), None, None, None, None
            grad = torch.empty_like(logits)
            for rows in parts:
                backward(logits[rows], target[rows], lse[rows], grad_loss, ctx.ignore, ctx.smoothing, out=grad[rows])
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
    from train.agent.trainer.compiled_layers import expect_compiles, gpu_compiler_available

    if not gpu_compiler_available():
        logger.warning("tandem: fused_loss=true, but torch.compile cannot make GPU kernels here (no triton "
                       "next to torch): fairseq's loss as before")
        return
    from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion as criterion

    if getattr(criterion.compute_loss, "_tandem", False):
        return
    criterion.compute_loss = fused_compute_loss(criterion.compute_loss)
    expect_compiles()  # its passes compile at the first update: the heartbeat allows for it
    logger.info("tandem: label-smoothed cross-entropy from the logits (train/agent/trainer/fused_loss.py)")
