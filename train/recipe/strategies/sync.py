"""`--comm sync`: every update all-reduces every gradient (fairseq's data parallelism: legacy_ddp on
CPU hosts, pytorch_ddp on GPUs, which overlaps the all-reduce with the backward pass)."""

from __future__ import annotations

from dataclasses import dataclass

from .base import Strategy
from .registry import register


@register
@dataclass(frozen=True)
class Sync(Strategy):
    name = "sync"
    caveat = "the run as asked"
    rung = 0.0

