"""What every communication strategy says about itself (`Strategy`), with sync's answers as the defaults.

A strategy is a frozen value parsed once from the `--comm` text (train.recipe.strategies.parse);
each one lives in its own module beside this one and states, as data and small methods:

- its name and the text after `:` it takes (`local-sgd:16`, `powersgd:4`), and how it prints back;
- the bytes one update all-reduces, given the model (train.recipe.params) and the precision;
- the GPU memory it keeps beyond sync's, per parameter;
- whether its all-reduce hides behind the backward pass (DDP's buckets) and the DDP backend it needs;
- its synchronous start, if any (updates all-reduced as sync does before it takes over);
- the fairseq arguments and the environment the host-side hook reads (train/agent/comm_*.py);
- the `--set` options it owns (passed to fairseq only for it; some are tandem's own);
- its caveat (what it may cost in quality), and where `--comm auto` tries it (`rung`).

Nothing outside a strategy's own module asks which strategy it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar


class CommError(ValueError):
    """A --comm value tandem does not know."""


def whole_updates(options: Mapping[str, object], key: str, default_key: str = "warmup_updates") -> int:
    """A count of updates from the run's options: `key` if it sets it, else `default_key`'s (0 without)."""
    value = options.get(key, options.get(default_key, 0))
    try:
        n = int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        raise CommError(f"{key} is a whole number of updates, not {value!r}") from None
    if n < 0:
        raise CommError(f"{key} is a whole number of updates, not {n}")
    return n


@dataclass(frozen=True)
class Strategy:
    """sync's answers; a strategy module overrides what differs."""

    name: ClassVar[str] = ""
    argument: ClassVar[str] = ""  # what `name:X` takes, for the error text ("H", "R"); "" when nothing
    caveat: ClassVar[str] = ""  # what it may cost (fab predict's comparison, bench-quality's reason to exist)
    describes: ClassVar[str] = "gradients per update"  # what one all-reduce carries (fab predict's explanation)
    rung: ClassVar[float | None] = None  # where `--comm auto` tries it (lower: less invasive); None: never
    always_compared: ClassVar[bool] = False  # a row of fab predict's comparison even where sync reaches 90%
    overlaps: ClassVar[bool] = True  # the all-reduce can hide behind the backward pass (DDP buckets)
    why_no_overlap: ClassVar[str] = ""  # when it cannot, why (fab predict says it beside the overlap)
    backend: ClassVar[str | None] = None  # the DDP backend it needs; None: the run's
    heartbeat_in_wrapper: ClassVar[bool] = True  # fairseq's distributed wrapper (and its heartbeat) is there
    options: ClassVar[Mapping[str, type]] = {}  # --set options it owns: reach fairseq for it only
    tandem_options: ClassVar[frozenset[str]] = frozenset()  # of those, tandem's own: never reach fairseq
    starts_synchronous: ClassVar[bool] = False  # its first updates all-reduce as sync does (sync_updates)
    start_label: ClassVar[str] = "its synchronous start"
    needs_shapes: ClassVar[bool] = False  # its bytes follow from the tensors' shapes, not the count alone

    @classmethod
    def from_argument(cls, argument: str) -> Strategy:
        """The strategy for the text after `name:` ("" when none was given)."""
        if argument:
            raise CommError(f"--comm {cls.name} takes no argument (only local-sgd:H and powersgd:R do), "
                            f"not {cls.name}:{argument!r}")
        return cls()

    @classmethod
    def for_auto(cls, precision: str, params: int | None = None) -> Strategy | None:
        """The value `--comm auto` tries on its rung for this model (`params`: its count, which may
        know its tensors' shapes) at this precision; None: nothing to gain, or nothing to price it by."""
        return cls()

    def __str__(self) -> str:
        return self.name

    @property
    def kind(self) -> str:
        """The strategy's name without its argument (`local-sgd` for `local-sgd:16`)."""
        return self.name

    @property
    def syncs_every(self) -> int:
        """Updates per all-reduce."""
        return 1

    def with_period(self, period: int) -> Strategy:
        """The same strategy syncing every `period` updates (only a periodic one has another)."""
        raise CommError(f"{self} has no period")

    @property
    def periodic(self) -> bool:
        """Whether `--comm auto` sizes its period (the smallest that reaches the target)."""
        return False

    def bytes_per_element(self, precision: str) -> int:
        """What each element all-reduced weighs: the gradients' precision."""
        return 4 if precision == "fp32" else 2

    def elements(self, params: int) -> int:
        """Elements one all-reduce carries (`params`: train.recipe.params.preset_params' count, which
        knows its tensors' shapes)."""
        return int(params)

    def payload_bytes(self, params: int, precision: str) -> int:
        """Bytes one all-reduce carries."""
        return self.elements(params) * self.bytes_per_element(precision)

    def extra_bytes_per_param(self, options: Mapping[str, object]) -> int:
        """GPU memory a rank needs beyond sync's, per parameter."""
        return 0

    def sync_updates(self, options: Mapping[str, object]) -> int:
        """The first updates all-reduced as sync does before the strategy takes over (0: none)."""
        return 0

    def start_bytes_per_element(self, precision: str) -> int:
        """What an element weighs during the synchronous start."""
        return self.bytes_per_element(precision)

    @property
    def start_overlaps(self) -> bool:
        """Whether the synchronous start's all-reduce hides behind the backward pass."""
        return self.overlaps

    def steady_state(self) -> list[str]:
        """--set overrides that measure the strategy as it runs after its synchronous start (bench-step)."""
        return []

    def ddp_backend(self, default: str) -> str:
        return self.backend or default

    def fairseq_args(self, ranks: int, options: Mapping[str, object] | None = None) -> list[str]:
        """fairseq-train options beyond the preset's (the DDP backend is set by the launcher)."""
        return []

    def environment(self, options: Mapping[str, object]) -> dict[str, str]:
        """Variables its host-side hook reads (train/agent/comm_*.py)."""
        return {}

    def synced_at_end(self, updates: int, logged: Mapping[str, object]) -> bool:
        """Whether the ranks hold one model after `updates` (bench-quality: `logged` is fairseq's options)."""
        return True

    def describe(self) -> str:
        """What one all-reduce carries, as fab predict explains it."""
        return self.describes
