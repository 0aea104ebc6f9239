"""`--comm fp16`: sync with the gradients all-reduced in half precision (pytorch_ddp and its fp16
compression hook, fairseq's own `--ddp-comm-hook fp16`: no host-side hook of tandem's): half the
bytes of fp32 gradients, the optimizer still steps in full precision. Nothing to halve when the run
trains in fp16/bf16."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .base import Strategy
from .registry import register


@register
@dataclass(frozen=True)
class FP16(Strategy):
    name = "fp16"
    caveat = "gradients averaged in fp16: rounding, usually harmless"
    describes = "fp16-compressed gradients per update"
    rung = 1.0
    always_compared = True
    backend = "pytorch_ddp"

    @classmethod
    def for_auto(cls, precision: str, params: int | None = None) -> Strategy | None:
        return cls() if precision == "fp32" else None

    def bytes_per_element(self, precision: str) -> int:
        return 2

    def fairseq_args(self, ranks: int, options: Mapping[str, object] | None = None) -> list[str]:
        return ["--ddp-comm-hook", "fp16"]
