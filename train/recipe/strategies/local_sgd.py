"""`--comm local-sgd:H`: every rank trains H updates on its own, then the ranks average their
parameters (fairseq's BMUF, `--use-bmuf`, one flat all-reduce: train.agent.trainer.comm_local_sgd).
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
outer state rides in the checkpoint: train.agent.trainer.comm_local_sgd).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .base import CommError, Strategy, whole_updates
from .registry import register

DEFAULT_PERIOD = 16
OUTER_STEP_OPTIONS = ("block_momentum", "block_lr")  # fairseq's BMUF options (--set), dropped for the others
SYNC_UPDATES_OPTION = "local_sgd_sync_updates"  # tandem's own (--set), never passed to fairseq
# = train.agent.trainer.comm_local_sgd's (the hosts read it); recipe may not import train.agent: a test holds them equal
SYNC_UPDATES_VARIABLE = "TANDEM_LOCAL_SGD_SYNC_UPDATES"


def sync_start(options: Mapping[str, object]) -> int:
    """The updates local SGD starts with synchronously (gradients averaged every update):
    `local_sgd_sync_updates` if the run sets it, else the learning rate's warm-up."""
    return whole_updates(options, SYNC_UPDATES_OPTION)


@register
@dataclass(frozen=True)
class LocalSGD(Strategy):
    period: int = DEFAULT_PERIOD  # H: updates between two syncs

    name = "local-sgd"
    argument = "H"
    caveat = "ranks drift between averages: loss may be worse; `fab bench-quality` measures it"
    rung = 4.0
    overlaps = False  # the sync comes after the optimizer step
    why_no_overlap = "local SGD: its all-reduce follows the optimizer step"
    starts_synchronous = True
    start_label = "local SGD's start"
    heartbeat_in_wrapper = False  # BMUF runs without fairseq's distributed wrapper, so without its heartbeat
    options = {"block_momentum": float, "block_lr": float, SYNC_UPDATES_OPTION: int}
    tandem_options = frozenset({SYNC_UPDATES_OPTION})

    def __post_init__(self) -> None:
        if self.period < 2:
            raise CommError(f"--comm local-sgd:{self.period}: H must be at least 2 (H = 1 is sync)")

    @classmethod
    def from_argument(cls, argument: str) -> Strategy:
        try:
            h = int(argument) if argument else DEFAULT_PERIOD
        except ValueError:
            raise CommError(f"--comm local-sgd:H takes a whole number of updates, not {argument!r}") from None
        return cls(h)

    @classmethod
    def for_auto(cls, precision: str, params: int | None = None) -> Strategy | None:
        return cls(2)  # its period sized by auto (periodic)

    def __str__(self) -> str:
        return f"{self.name}:{self.period}"

    @property
    def syncs_every(self) -> int:
        return self.period

    @property
    def periodic(self) -> bool:
        return True

    def with_period(self, period: int) -> Strategy:
        return LocalSGD(period)

    def describe(self) -> str:
        return f"fp32 parameter deltas every {self.period} updates (local SGD)"

    def bytes_per_element(self, precision: str) -> int:
        """The fp32 parameters' deltas (the master copy under fp16/bf16 training)."""
        return 4

    def extra_bytes_per_param(self, options: Mapping[str, object]) -> int:
        """Local SGD's sync concatenates the fp32 parameters into one flat buffer (4 B); with outer
        momentum (`block_momentum`) BMUF also keeps the last synced model, the momentum and the delta
        (3 × 4 B; a plain average keeps none: train.agent.trainer.comm_local_sgd). Transformer big: 0.84 GB,
        3.3 GB with momentum."""
        momentum = float(options.get(OUTER_STEP_OPTIONS[0], 0) or 0)  # type: ignore[arg-type]
        return 4 + (12 if momentum else 0)

    def sync_updates(self, options: Mapping[str, object]) -> int:
        return sync_start(options)

    def start_bytes_per_element(self, precision: str) -> int:
        return 4  # the fp32 (unscaled) gradients, averaged before the step

    @property
    def start_overlaps(self) -> bool:
        return False  # averaged after the backward pass, before BMUF's step

    def steady_state(self) -> list[str]:
        return [f"{SYNC_UPDATES_OPTION}=0"]

    def fairseq_args(self, ranks: int, options: Mapping[str, object] | None = None) -> list[str]:
        """BMUF averaging every H updates; the outer step's block_momentum / block_lr come from the
        run's options when it sets them."""
        options = options or {}
        # warmup 0: no broadcast at the start; every rank builds the same model from the same
        # seed, and a resumed run loads the same checkpoint on every host
        args = ["--use-bmuf", "--global-sync-iter", str(self.period), "--use-nbm", "--warmup-iterations", "0"]
        if OUTER_STEP_OPTIONS[0] not in options:
            args += ["--block-momentum", "0"]  # a plain average (module docstring: measured)
        if OUTER_STEP_OPTIONS[1] not in options:
            args += ["--block-lr", "1"]
        return args

    def environment(self, options: Mapping[str, object]) -> dict[str, str]:
        n = self.sync_updates(options)
        return {SYNC_UPDATES_VARIABLE: str(n)} if n else {}

    def synced_at_end(self, updates: int, logged: Mapping[str, object]) -> bool:
        """The last update is a BMUF sync, as fairseq logged its options."""
        return logged.get("use_bmuf") is True and logged.get("global_sync_iter") == self.period \
            and updates % self.period == 0
