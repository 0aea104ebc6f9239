"""`--comm powersgd:R`: sync with every gradient matrix all-reduced as a rank-R approximation
(PowerSGD, Vogels et al. 2019: torch's `ddp_comm_hooks.powerSGD_hook`, with error feedback, so what a
step leaves out is added to the next one's gradient). A matrix n × m sends R × (n + m) elements (its
two factors P and Q) instead of n × m; vectors (biases, LayerNorms), and matrices too small to gain
2×, go dense as sync sends them. Transformer base at R = 4: 3.1 MB per update instead of 242 MB (fp32).

It runs on pytorch_ddp (DDP's comm hook: train.agent.trainer.comm_powersgd registers it on fairseq's
DistributedDataParallel, gloo and NCCL alike), so its all-reduces overlap the backward pass as sync's
do; the factors cost two small matmuls and an orthogonalization per matrix, which the byte model
leaves out. Its first updates are sync's (torch's `start_powerSGD_iter`): until the learning rate's
warm-up ends (the preset's `warmup_updates`; `--set powersgd_start_updates=N` for another N, at
least 2, which torch needs for its error feedback), the gradients at their most sensitive. Its state
(the error and the warm-started Q) is not in fairseq's checkpoints: a resumed run starts it afresh,
with its synchronous start again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .base import CommError, Strategy, whole_updates
from .registry import register

DEFAULT_RANK = 4
MIN_COMPRESSION_RATE = 2  # torch's default: a matrix is compressed only where that gains 2x
START_OPTION = "powersgd_start_updates"  # tandem's own (--set), never passed to fairseq
# = train.agent.trainer.comm_powersgd's (the hosts read it); recipe may not import train.agent: a test holds them equal
VARIABLE = "TANDEM_POWERSGD"  # RANK:START
MIN_START = 2  # torch: error feedback needs start_powerSGD_iter > 1


def matrix_elements(shape: tuple[int, ...], rank: int) -> int:
    """Elements one tensor of `shape` all-reduces under rank-`rank` PowerSGD, as torch's hook decides:
    the tensor viewed as (shape[0], rest); compressed to R' × (n + m), R' = min(n, m, R), where that
    is at least MIN_COMPRESSION_RATE times smaller than n × m, else dense."""
    n = shape[0] if shape else 1
    m = 1
    for size in shape[1:]:
        m *= size
    r = min(n, m, rank)
    compressed = (n + m) * r
    return compressed if compressed * MIN_COMPRESSION_RATE < n * m else n * m


@register
@dataclass(frozen=True)
class PowerSGD(Strategy):
    rank: int = DEFAULT_RANK  # R: matrix_approximation_rank

    name = "powersgd"
    argument = "R"
    caveat = "gradients low-rank (error feedback keeps what is left out): loss may be worse; " \
             "`fab bench-quality` measures it"
    rung = 3.0  # after fp16 and update-freq, before local SGD
    backend = "pytorch_ddp"
    options = {START_OPTION: int}
    tandem_options = frozenset({START_OPTION})
    starts_synchronous = True
    start_label = "PowerSGD's start"
    needs_shapes = True

    @classmethod
    def for_auto(cls, precision: str, params: int | None = None) -> Strategy | None:
        """At its default rank, where the model's tensors are known (its bytes follow from them)."""
        return cls() if getattr(params, "shapes", None) is not None else None

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise CommError(f"--comm powersgd:{self.rank}: the rank R is at least 1")

    @classmethod
    def from_argument(cls, argument: str) -> Strategy:
        try:
            return cls(int(argument) if argument else DEFAULT_RANK)
        except ValueError:
            raise CommError(f"--comm powersgd:R takes a whole number (the rank), not {argument!r}") from None

    def __str__(self) -> str:
        return f"{self.name}:{self.rank}"

    def describe(self) -> str:
        return f"rank-{self.rank} PowerSGD factors per update (vectors dense)"

    def elements(self, params: int) -> int:
        """R × (n + m) a matrix, vectors dense (matrix_elements), summed over the model's tensors."""
        shapes = getattr(params, "shapes", None)
        if shapes is None:
            raise CommError("powersgd's bytes follow from the model's tensors: give the count of "
                            "train.recipe.params.preset_params (or transformer_params), not a bare number")
        return sum(matrix_elements(s, self.rank) for s in shapes)

    def extra_bytes_per_param(self, options: Mapping[str, object]) -> int:
        """Error feedback keeps each gradient's error (one gradient-sized buffer: 4 B a parameter in
        fp32, 2 in fp16/bf16; the factors are R × (n + m), small)."""
        return 4

    def sync_updates(self, options: Mapping[str, object]) -> int:
        return max(MIN_START, whole_updates(options, START_OPTION))

    def steady_state(self) -> list[str]:
        return [f"{START_OPTION}={MIN_START}"]

    def environment(self, options: Mapping[str, object]) -> dict[str, str]:
        return {VARIABLE: f"{self.rank}:{self.sync_updates(options)}"}
