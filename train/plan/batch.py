"""The recipe's batch on any cluster: max_tokens per GPU from a GPU memory model, update_freq from
the preset's tokens per update (train.run.presets.RECIPES).

    >>> b = derive(458752, ranks=2, cap=20480)  # big on 2 hosts x 1 H100
    >>> b.max_tokens, b.update_freq, b.tokens_per_update
    (19114, 12, 458736)

Memory model: peak GPU memory (GiB, as NVML counts it: the allocator's pool and the CUDA context
included) = the static part (parameters x bytes per parameter of precision and optimizer) + max_tokens
x bytes per token, the per-token part fitted on the H100 peaks of benchmarks/README.md ("Batch size,
after the fix"): BYTES_PER_TOKEN_VOCAB per vocabulary entry (logits, log-probabilities and their
gradients) and BYTES_PER_TOKEN_WIDTH per layer and model dimension (activations kept for the backward
pass). The fit is within 10% on four of the six measured points; base at 4,096 (+18%) and at 16,384
(-21%) cannot both be: 4x the tokens took 5.2x the memory there, 2x more took 1.56x. MARGIN covers the
worst under-prediction, so a batch said to fit does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from ..recipe.params import ARCH_DIMS, preset_params

# Bytes a parameter takes on the GPU: fairseq's fp16/bf16 optimizer keeps the half-precision weights
# and gradients (2 + 2) beside fp32 master weights and gradients (4 + 4) and Adam's two moments (8).
BYTES_PER_PARAM = {("fp16", "adam"): 20, ("bf16", "adam"): 20, ("fp32", "adam"): 16,
                   ("fp16", "sgd"): 12, ("bf16", "sgd"): 12, ("fp32", "sgd"): 8}
BYTES_PER_TOKEN_VOCAB = 32.0  # least squares on the six H100 points (relative error), vocabulary 31.3k
BYTES_PER_TOKEN_WIDTH = 74.0  # per (encoder + decoder layers) x model dimension
MARGIN = 1.3  # the fit's worst under-prediction was 21% (base at 16,384): 1/0.79 = 1.27
RESERVED_GIB = 1.0  # other processes, NCCL's buffers: what a batch may not count on
GIB = 2**30


def static_gib(params: int, precision: str = "fp16", optimizer: str = "adam", extra_per_param: int = 0) -> float:
    """Weights, gradients and optimizer state; `extra_per_param`: what the communication strategy
    keeps beside them (local SGD's flat fp32 copy and BMUF's outer state: comm.Strategy)."""
    key = (precision, optimizer if optimizer in ("adam", "sgd") else "adam")
    return params * (BYTES_PER_PARAM[key] + extra_per_param) / GIB


def bytes_per_token(options: Mapping[str, object], vocab: int) -> float:
    arch = ARCH_DIMS.get(str(options.get("arch", "transformer")), ARCH_DIMS["transformer"])
    width = int(options.get("encoder_embed_dim") or arch["embed_dim"])  # type: ignore[call-overload]
    layers = int(options.get("encoder_layers") or arch["encoder_layers"]) + int(  # type: ignore[call-overload]
        options.get("decoder_layers") or arch["decoder_layers"])  # type: ignore[call-overload]
    return BYTES_PER_TOKEN_VOCAB * vocab + BYTES_PER_TOKEN_WIDTH * layers * width


def peak_gib(options: Mapping[str, object], vocab: int, max_tokens: int, precision: str = "fp16",
             extra_per_param: int = 0) -> float:
    """Predicted peak GPU memory of one rank training with `max_tokens` (no margin)."""
    params = preset_params(options, vocab)
    return static_gib(params, precision, str(options.get("optimizer", "adam")), extra_per_param) + \
        max_tokens * bytes_per_token(options, vocab) / GIB


def fits(options: Mapping[str, object], vocab: int, max_tokens: int, gpu_gib: float, precision: str = "fp16",
         extra_per_param: int = 0) -> bool:
    return peak_gib(options, vocab, max_tokens, precision, extra_per_param) * MARGIN <= gpu_gib - RESERVED_GIB


def largest_max_tokens(options: Mapping[str, object], vocab: int, gpu_gib: float, precision: str = "fp16",
                       multiple: int = 256, extra_per_param: int = 0) -> int:
    """The largest max_tokens (a multiple of `multiple`) predicted to fit `gpu_gib` with the margin;
    0 when not even the model fits."""
    params = preset_params(options, vocab)
    room = (gpu_gib - RESERVED_GIB) / MARGIN - static_gib(params, precision, str(options.get("optimizer", "adam")),
                                                          extra_per_param)
    if room <= 0:
        return 0
    return int(room * GIB / bytes_per_token(options, vocab)) // multiple * multiple


@dataclass(frozen=True)
class Batch:
    """max_tokens per rank and update_freq for `ranks` ranks, aiming at `target` tokens per update."""

    max_tokens: int
    update_freq: int
    ranks: int
    target: int | None  # the preset's tokens per update (None: no recipe, the preset's max_tokens)
    cap: int  # the largest max_tokens allowed (GPU memory, or the preset's on a CPU host)
    why: str  # where the cap came from, in words

    @property
    def tokens_per_update(self) -> int:
        return self.max_tokens * self.update_freq * self.ranks

    @property
    def off_target(self) -> float:
        return self.tokens_per_update / self.target - 1 if self.target else 0.0

    def line(self) -> str:
        """The derivation in words (the start line and --dry-run)."""
        if not self.target:
            return f"max_tokens {self.max_tokens:,} ({self.why}), update-freq {self.update_freq}"
        return (f"the recipe's {self.target:,} tokens per update = {self.ranks} ranks x {self.max_tokens:,} "
                f"max_tokens x update-freq {self.update_freq} ({self.tokens_per_update:,}, "
                f"{self.off_target:+.1%}; max_tokens at most {self.cap:,}: {self.why})")


def derive(target: int | None, ranks: int, cap: int, *, max_tokens: int | None = None,
           update_freq: int | None = None, why: str = "") -> Batch:
    """The batch for `ranks` ranks: update_freq = ⌈target / (cap x ranks)⌉, then max_tokens lowered to
    target / (update_freq x ranks), so the product is within one token per rank-batch of the target
    (within 5% unless ranks x update_freq is near the target itself). A `max_tokens` or `update_freq`
    given by the user wins: the other follows from it; both given, both stay."""
    if ranks < 1 or cap < 1:
        raise ValueError(f"ranks and the max_tokens cap must be positive, not {ranks} and {cap}")
    if not target:
        return Batch(max_tokens or cap, update_freq or 1, ranks, None, cap, why)
    if max_tokens and update_freq:
        pass
    elif max_tokens:
        update_freq = max(1, round(target / (max_tokens * ranks)))
    elif update_freq:
        max_tokens = max(1, min(cap, target // (update_freq * ranks)))
    else:
        update_freq = max(1, math.ceil(target / (cap * ranks)))
        max_tokens = max(1, min(cap, target // (update_freq * ranks)))
    return Batch(int(max_tokens), int(update_freq), ranks, target, cap, why)  # type: ignore[arg-type]
