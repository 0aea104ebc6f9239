"""Each Transformer layer's training step through torch.compile (TANDEM_COMPILE_LAYERS=1,
`--set compile_layers=true`).

Transformer big on one H100 keeps the GPU 89-97% busy at 21% of its peak (benchmarks/README.md,
issue 36): the matrix products are fast and the rest is not. fairseq runs each layer's layer
norms, residual adds, ReLU, dropouts and the encoder-decoder attention's softmax as separate
kernels, each reading and writing a whole [tokens x width] (or [tokens x 4 x width]) tensor; in
a layer of big at 27k tokens those passes move about as many bytes as the products take time.
torch.compile fuses them (a dropout into the add before it, the norm after): the layer's
arithmetic is fairseq's, its kernels fewer.

Only what the compiler handles well is compiled: a layer's forward in training, with no
incremental state (validation and beam search stay eager). Every layer of a kind shares one
compiled graph (the weights are its inputs), shapes are dynamic from the start (each batch has
another length), inputs are made contiguous and padding masks always given (strides, or a
mask present in one batch and absent from the next, would compile new graphs): one graph for the
encoder, two for the decoder (with and without the attention weights its last layer returns).
fairseq builds the key of a layer's decoding state from a random id even when there is no
state; the compiler would guard on that id and compile once per layer, so the key is only built
when there is a state (same behaviour).

The compiled code is made on a rank's first batches (tens of seconds per graph, on its CPU; 40-150 s
in all on a GPU host); the model, its state_dict and checkpoints are unchanged: a run can resume with
the switch off. fairseq's heartbeat kills a rank whose next forward does not start within
--heartbeat-timeout (45 s for base), and a rank done compiling waits for the slowest one in its first
all-reduce, whose process group times out with the same heartbeat: a first update with several ranks
would die compiling. While it compiles (CompileClock: torch's own compile-start and compile-end
callbacks, the lazy backward's included) the heartbeat allows TANDEM_COMPILE_ALLOWANCE_S (default
ALLOWANCE_S) after the last start or end of a compile, and the process group's timeout is at least that
(train/agent/trainer/fairseq_train.py); once no compile has run for that long, the heartbeat is the run's again.
The hosts keep the compiled code on the data volume (TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR:
train.run.command.environment), so a restart finds it and compiles in seconds.
tests/unit/train/agent/trainer/test_compiled_layers.py compares the compiled layers with fairseq's and trains
two ranks through a compile slower than their heartbeat.
"""

from __future__ import annotations

import functools
import logging
import os
import time

logger = logging.getLogger("tandem.compiled_layers")

ALLOWANCE_S = 600.0  # a rank's heartbeat and collectives may wait this long past its last compile's start or end

# the decoder layer's positional arguments after x: encoder_out, encoder_padding_mask, incremental_state,
# prev_self_attn_state, prev_attn_state, self_attn_mask, self_attn_padding_mask
DECODER_INCREMENTAL_STATE = 2
# each layer's mask of the padding of its own input (position after x, name): None in a batch without
# padding, and each None/tensor pair would be another graph; an all-false mask is the same attention
ENCODER_PADDING = (0, "encoder_padding_mask")
DECODER_PADDING = (6, "self_attn_padding_mask")


def decoding(args, kwargs) -> bool:
    """Whether a decoder layer's call carries incremental (beam search) state."""
    positional = args[DECODER_INCREMENTAL_STATE] if len(args) > DECODER_INCREMENTAL_STATE else None
    given = [kwargs.get("incremental_state", positional), kwargs.get("prev_self_attn_state"),
             kwargs.get("prev_attn_state")]
    return any(value is not None for value in given)


def with_padding_mask(x, args: tuple, kwargs: dict, padding: tuple[int, str]) -> tuple[tuple, dict]:
    """The call's arguments with an all-false padding mask [batch, length] where it has none (x is
    [length, batch, width])."""
    import torch

    position, name = padding
    given = args[position] if len(args) > position else kwargs.get(name)
    if given is not None:
        return args, kwargs
    mask = torch.zeros(x.size(1), x.size(0), dtype=torch.bool, device=x.device)
    if len(args) > position:
        return args[:position] + (mask,) + args[position + 1:], kwargs
    return args, {**kwargs, name: mask}


def compiled_in_training(forward, backend: str, padding: tuple[int, str], is_decoding=lambda args, kwargs: False):
    """`forward` (a layer class's) that runs compiled while its layer trains, fairseq's otherwise."""
    import torch

    compiled = torch.compile(forward, dynamic=True, backend=backend)

    def dense(value):
        """A contiguous tensor of its own: a view's strides and its base's size would be guarded."""
        if not torch.is_tensor(value):
            return value
        return value.clone(memory_format=torch.contiguous_format) if value._base is not None else value.contiguous()

    @functools.wraps(forward)
    def layer_forward(self, x, *args, **kwargs):
        if self.training and not is_decoding(args, kwargs):
            args, kwargs = with_padding_mask(x, args, kwargs, padding)
            # the first layer's input is a transposed view and the decoder's mask a slice of a
            # cached one: as given, they would compile more graphs (a copy of x for the first
            # layer only)
            return compiled(self, dense(x), *map(dense, args), **{k: dense(v) for k, v in kwargs.items()})
        return forward(self, x, *args, **kwargs)

    layer_forward._tandem = True  # type: ignore[attr-defined]
    return layer_forward


def state_key_only_with_state() -> None:
    """FairseqIncrementalState.get_incremental_state without building its key when there is no
    state (the answer is None either way)."""
    from fairseq.incremental_decoding_utils import FairseqIncrementalState as holder

    get = holder.get_incremental_state
    if getattr(get, "_tandem", False):
        return

    def get_incremental_state(self, incremental_state, key):
        return None if incremental_state is None else get(self, incremental_state, key)

    get_incremental_state._tandem = True  # type: ignore[attr-defined]
    holder.get_incremental_state = get_incremental_state


class CompileClock:
    """When this process last started or ended a compile (torch.compile's tracing and code generation,
    a lazy backward's too): what the heartbeat's watcher thread reads."""

    def __init__(self) -> None:
        self.compiling = False
        self.last: float | None = None  # time.monotonic() of the last start or end; None: never compiled

    def started(self, _args=None) -> None:
        self.compiling, self.last = True, time.monotonic()

    def ended(self, _args=None) -> None:
        self.compiling, self.last = False, time.monotonic()

    def listen(self) -> None:
        """Told by torch of every compile of this process (its callbacks fire once for nested ones)."""
        from torch._dynamo import callback

        if self.started not in callback.callback_handler.start_callbacks:
            callback.on_compile_start(self.started)
            callback.on_compile_end(self.ended)


CLOCK = CompileClock()
compiles_in_training = False  # whether this process compiles in training (its layers, fused_loss's passes)


def expect_compiles() -> None:
    """This process compiles in training: its heartbeat and process group allow for it."""
    global compiles_in_training
    CLOCK.listen()
    compiles_in_training = True


def allowance_s() -> float:
    """How long past a compile's start or end a rank may make no progress (TANDEM_COMPILE_ALLOWANCE_S)."""
    return float(os.environ.get("TANDEM_COMPILE_ALLOWANCE_S") or ALLOWANCE_S)


def heartbeat_deadline(started: float, timeout: float, clock: CompileClock = CLOCK) -> float:
    """When a rank whose last forward began at `started` (time.monotonic()) has missed its heartbeat:
    `timeout` after it, or later, the allowance after this process's last compile start or end (a rank
    compiling, or waiting in a collective for a slower one to finish compiling).

    >>> clock = CompileClock()
    >>> heartbeat_deadline(100.0, 45.0, clock)
    145.0
    >>> clock.last = 90.0
    >>> heartbeat_deadline(100.0, 45.0, clock) == 90.0 + allowance_s()
    True
    """
    deadline = started + timeout
    if clock.last is not None:
        deadline = max(deadline, clock.last + allowance_s())
    return deadline


def process_group_timeout_s(heartbeat_s: float) -> float:
    """The process group's timeout for a run whose heartbeat is `heartbeat_s`: at least the compile
    allowance where the layers compile (a rank waits in its first all-reduce for the slowest compile)."""
    return max(heartbeat_s, allowance_s()) if compiles_in_training else heartbeat_s


def gpu_compiler_available() -> bool:
    """Whether torch.compile can make GPU kernels here (inductor writes them in Triton, which a
    CUDA build of torch normally brings along)."""
    import importlib.util

    return importlib.util.find_spec("triton") is not None


def install(backend: str = "inductor") -> None:
    """fairseq's Transformer encoder and decoder layers compiled in training (TANDEM_COMPILE_LAYERS=1),
    the heartbeat told of every compile."""
    if os.environ.get("TANDEM_COMPILE_LAYERS") != "1":
        return
    if backend == "inductor" and not gpu_compiler_available():
        logger.warning("tandem: compile_layers=true, but torch.compile cannot make GPU kernels here "
                       "(no triton next to torch): the layers stay as fairseq runs them")
        return
    from fairseq.modules import transformer_layer

    encoder, decoder = transformer_layer.TransformerEncoderLayerBase, transformer_layer.TransformerDecoderLayerBase
    if getattr(encoder.forward, "_tandem", False):
        return
    state_key_only_with_state()
    expect_compiles()
    encoder.forward = compiled_in_training(encoder.forward, backend, ENCODER_PADDING)
    decoder.forward = compiled_in_training(decoder.forward, backend, DECODER_PADDING, decoding)
    logger.info("tandem: Transformer layers compiled in training (train/agent/trainer/compiled_layers.py)")
