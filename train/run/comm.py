"""Communication strategies: how the ranks share what each learned, chosen with `--comm`.

- `sync`: every update all-reduces every gradient (fairseq's data parallelism; legacy_ddp on
  CPU hosts, pytorch_ddp on GPUs, which overlaps the all-reduce with the backward pass).
- `fp16`: the same with the gradients all-reduced in half precision (pytorch_ddp and its fp16
  compression hook, fairseq `--ddp-comm-hook fp16`): half the bytes of fp32 gradients, the
  optimizer still steps in full precision. Nothing to halve when the run trains in fp16/bf16.
- `local-sgd:H`: every rank trains H updates on its own, then the ranks average their
  parameters (fairseq's BMUF, `--use-bmuf`, one flat all-reduce: train.agent.fairseq_train).
  H× fewer bytes; the optimization changes, so `fab bench-quality` measures what it costs. The
  outer step is a plain average by default (block momentum 0): BMUF's outer Nesterov momentum at
  1 − 1/ranks (its paper's setting, 0.5 for two) left the lab's 13× tiny model on its plateau
  (valid loss +333% against sync after 320 updates; plain averaging +15%), so it is opt-in:
  `--set block_momentum=0.5,block_lr=1`.
  The first updates are synchronous (post-local SGD): until the learning rate's warm-up ends
  (the preset's `warmup_updates`; `--set local_sgd_sync_updates=N` for another N, 0 for none)
  every update averages the gradients as sync does, so the ranks leave the fast-learning start
  together, with one Adam state; local SGD takes over after it. Alone, each rank's Adam stepping
  on half the batch from the first update left the valid loss 8–12% behind sync's after 320
  updates (benchmarks/README.md, "What was tried").
  The model is a plain fairseq model: checkpoints, resume and evaluation are unchanged (BMUF's
  outer state rides in the checkpoint: train.agent.fairseq_train).
- `--update-freq K` (gradient accumulation) is its own option: K× fewer all-reduces per sample,
  K× larger effective batch.

`auto` is resolved before the run starts (train.plan.model.choose, from train.plan.predict) and the run
remembers the concrete choice, so a resumed run keeps it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

KINDS = ("sync", "fp16", "local-sgd")
OUTER_STEP_OPTIONS = ("block_momentum", "block_lr")  # local SGD's own (--set), dropped for the others
SYNC_UPDATES_OPTION = "local_sgd_sync_updates"  # tandem's own (--set), never passed to fairseq
DEFAULT_PERIOD = 16


# A collective's time limit over its transfer time on the measured link: a link measured once by
# iperf3 varies, and NCCL's ring shares it with whatever else the host sends.
TRANSFER_MARGIN = 2.0


def allreduce_bytes_per_host(payload_bytes: float, ranks: int) -> float:
    """What each host sends (and receives) in a ring all-reduce of `payload_bytes` over `ranks`:
    2 (n − 1) / n of the payload. Transformer base's fp32 model (242 MB) on 16 ranks: 454 MB."""
    return 2 * (ranks - 1) / ranks * payload_bytes if ranks > 1 else 0.0


def transfer_s(bytes_per_host: float, link_mbps: float) -> float:
    """Seconds to move `bytes_per_host` over a link of `link_mbps` Mbit/s."""
    return bytes_per_host * 8 / (link_mbps * 1e6)


def collective_timeout_s(bytes_per_host: float, link_mbps: float | None, margin: float = TRANSFER_MARGIN) -> int:
    """A time limit for one collective that moves `bytes_per_host` over the measured link, with
    `margin`; 0 when the link is unknown (the caller keeps its floor)."""
    if not link_mbps or link_mbps <= 0 or bytes_per_host <= 0:
        return 0
    return math.ceil(margin * transfer_s(bytes_per_host, link_mbps))


class CommError(ValueError):
    """A --comm value tandem does not know."""


def sync_start(options: Mapping[str, object]) -> int:
    """The updates local SGD starts with synchronously (gradients averaged every update):
    `local_sgd_sync_updates` if the run sets it, else the learning rate's warm-up."""
    value = options.get(SYNC_UPDATES_OPTION, options.get("warmup_updates", 0))
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise CommError(f"{SYNC_UPDATES_OPTION} is a whole number of updates, not {value!r}") from None
    if n < 0:
        raise CommError(f"{SYNC_UPDATES_OPTION} is a whole number of updates, not {n}")
    return n


@dataclass(frozen=True)
class Strategy:
    kind: str = "sync"
    period: int = 1  # H: updates between two syncs (local-sgd)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise CommError(f"--comm is sync, fp16, local-sgd[:H] or auto, not {self.kind!r}")
        if self.period < 1 or (self.kind != "local-sgd" and self.period != 1):
            raise CommError(f"a sync period of {self.period} makes no sense for {self.kind}")

    @classmethod
    def parse(cls, text: str | None) -> Strategy:
        """`sync`, `fp16`, `local-sgd` (H = 16), `local-sgd:32`. `auto` is not a strategy: it picks one."""
        text = (text or "sync").strip().lower()
        kind, _, period = text.partition(":")
        if kind == "local-sgd":
            try:
                h = int(period) if period else DEFAULT_PERIOD
            except ValueError:
                raise CommError(f"--comm local-sgd:H takes a whole number of updates, not {period!r}") from None
            if h < 2:
                raise CommError(f"--comm local-sgd:{h}: H must be at least 2 (H = 1 is sync)")
            return cls("local-sgd", h)
        if period:
            raise CommError(f"--comm {kind} takes no period (only local-sgd:H does), not {text!r}")
        return cls(kind)

    def __str__(self) -> str:
        return f"local-sgd:{self.period}" if self.kind == "local-sgd" else self.kind

    @property
    def syncs_every(self) -> int:
        """Updates per all-reduce of the model's size."""
        return self.period if self.kind == "local-sgd" else 1

    def bytes_per_element(self, precision: str) -> int:
        """What each element all-reduced weighs: fp16 compression halves fp32 gradients; local SGD
        averages the fp32 parameters' deltas (the master copy under fp16/bf16 training)."""
        if self.kind == "local-sgd":
            return 4
        if self.kind == "fp16":
            return 2
        return 4 if precision == "fp32" else 2

    def extra_bytes_per_param(self, options: Mapping[str, object]) -> int:
        """GPU memory a rank needs beyond sync's, per parameter: local SGD's sync concatenates
        the fp32 parameters into one flat buffer (4 B); with outer momentum (`block_momentum`)
        BMUF also keeps the last synced model, the momentum and the delta (3 × 4 B; a plain
        average keeps none: train.agent.fairseq_train). Transformer big: 0.84 GB, 3.3 GB with momentum."""
        if self.kind != "local-sgd":
            return 0
        momentum = float(options.get(OUTER_STEP_OPTIONS[0], 0) or 0)  # type: ignore[arg-type]
        return 4 + (12 if momentum else 0)

    @property
    def overlaps(self) -> bool:
        """Whether the all-reduce can hide behind the backward pass (DDP buckets); local SGD's
        sync comes after the optimizer step."""
        return self.kind != "local-sgd"

    def sync_updates(self, options: Mapping[str, object]) -> int:
        """Local SGD's synchronous start (sync_start); 0 for the others."""
        return sync_start(options) if self.kind == "local-sgd" else 0

    def ddp_backend(self, default: str) -> str:
        return "pytorch_ddp" if self.kind == "fp16" else default

    def fairseq_args(self, ranks: int, options: Mapping[str, object] | None = None) -> list[str]:
        """The fairseq-train options beyond the preset's (the DDP backend is set by the launcher);
        the outer step's block_momentum / block_lr come from the run's options when it sets them."""
        options = options or {}
        if self.kind == "fp16":
            return ["--ddp-comm-hook", "fp16"]
        if self.kind == "local-sgd":
            # warmup 0: no broadcast at the start; every rank builds the same model from the same
            # seed, and a resumed run loads the same checkpoint on every host
            args = ["--use-bmuf", "--global-sync-iter", str(self.period), "--use-nbm", "--warmup-iterations", "0"]
            if OUTER_STEP_OPTIONS[0] not in options:
                args += ["--block-momentum", "0"]  # a plain average (module docstring: measured)
            if OUTER_STEP_OPTIONS[1] not in options:
                args += ["--block-lr", "1"]
            return args
        return []
