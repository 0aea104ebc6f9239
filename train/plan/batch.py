"""The recipe's batch on any cluster: max_tokens per GPU from a GPU memory model, update_freq from
the preset's tokens per update (train.recipe.presets.RECIPES).

    >>> b = derive(458752, ranks=2, cap=20480)  # big on 2 hosts x 1 H100
    >>> b.max_tokens, b.update_freq, b.tokens_per_update
    (19114, 12, 458736)

Memory model: the peak GPU memory of a rank (GiB, as NVML counts it: the allocator's pool, its
fragmentation and the CUDA context included) = the static part (parameters x bytes per parameter of
precision and optimizer, and fp16's flat master copy's buffer: FLAT_COPY_BYTES) + max_tokens x bytes
per token: BYTES_PER_TOKEN's first figure per vocabulary entry (logits, log-probabilities and their
gradients), its second per layer and model dimension (activations kept for the backward pass), and
the sentence-length term (`length_bytes`: attention's tensors that grow with the longest pair of the
batch, ATTENTION_BYTES per head, decoder layer and position, counted on CPU from fairseq's own model
by benchmarks/activation_bytes.py). The rows were measured on a corpus whose longest pair is 99/87
subwords (SAMPLE_LONGEST: the fit takes their length term out), a run is predicted at WMT16's
(WMT16_LONGEST, 400 a side): big's bytes a token +20% at the same batch, base's +15%.

The allocator matters as much as the batch: GPU ranks run torch's caching allocator with expandable
segments (train.run.command.environment), and at the same batch on one H100 the default allocator
peaked 60% (big fp16 26,985 x 17: 48.1 GiB against 30.0) and 83% higher (base 32,768: 44.4 against
24.3): most likely blocks it reserved for one batch's shapes and could not reuse for the next's.
Each row of MEASURED says its allocator, each allocator has its own fit (BYTES_PER_TOKEN), and
every function here takes the one the ranks will get from fab train's environment (`allocator_of`:
expandable segments unless the user's PYTORCH_CUDA_ALLOC_CONF leaves them out), so a user who
sets torch's defaults is sized by the default allocator's rows.

The fit (`fit(MEASURED)`: expandable segments; `fit(MEASURED, DEFAULT)`) is an upper envelope, not a
least-squares line: the per-token bytes are the least whose line lies on or above every measured
peak. A peak is the worst batch a run met (the longest sentences make the largest attention scores)
plus, with the default allocator, what it kept from earlier shapes; a run of hours meets more
batches than a benchmark's hundreds: with the default allocator big at 40,960 x 1 (100 batches)
peaked at 44.1 GiB, at 57,344 x 8 (480 batches) at 134.7. Model against each measured peak, each
row by its allocator's fit (+: over-predicts; 0%: the points that set the fit):

    allocator   run                          card   measured   model   error
    expandable  big  fp16  26,985 x 17       H100     30.0      30.1     +0%  (sets big's; 510 batches)
    expandable  big  bf16  26,985 x 17       H100     29.7      29.7     +0%  (no flat master copy)
    expandable  big  fp16  26,985 x 17       H100     28.1      29.7     +6%  (memory_efficient_fp16)
    expandable  base fp16  32,768 x 1        H100     24.3      24.3     +0%  (sets base's; 300 batches)
    default     base fp16   4,096 x 1        H100      5.7       8.2    +44%
    default     base fp16  16,384 x 1        H100     29.5      29.5     +0%  (sets base's)
    default     base fp16  32,768 x 1        H100     46.0      57.9    +26%  (twice: 300 and 600 updates)
    default     base fp16  32,768 x 1        H200     46.1      57.9    +26%
    default     base fp16  32,768 x 1        H100     44.5      57.9    +30%  (issue 36's -before run)
    default     big  fp16   3,584 x 1        H100     10.4      12.1    +16%
    default     big  fp16  10,240 x 1        H100     20.4      27.3    +34%
    default     big  bf16  10,240 x 1        H100     21.4      27.3    +27%
    default     big  fp16  20,480 x 1        H100     43.8      50.6    +16%
    default     big  fp16  26,985 x 17       H100     48.1      65.5    +36%  (issue 36's -before run)
    default     big  fp16  30,583 x 15       H100     63.8      73.7    +16%
    default     big  fp16  40,960 x 1        H200     44.1      97.4   +121%  (100 batches)
    default     big  fp16  57,344 x 8        H200    134.7     134.8     +0%  (sets big's)

With expandable segments one batch per architecture is measured so far, so the fit meets both
points and says nothing yet of other batches: below them (16-40 GB cards) it is a straight line
towards the static bytes, measured nowhere. The CUDA context and workspaces (not measured apart),
which the two points fold into the bytes a token, are what RESERVED_GIB covers there.

MARGIN on top: the derived batch's predicted peak x MARGIN + RESERVED_GIB fits the card
(`headroom_gib`: what it leaves), for what a run of hours may meet beyond any benchmark. 1.15, kept
from the default allocator's rows, the only ones with several batches and run lengths: the highest
row's bytes a token (big at 57,344 x 8) are 16% above the next (30,583 x 15, 20,480 x 1), and
another such step beyond the highest measured still fits. Under expandable segments the spread at
one batch is smaller (28.1-30.0 GiB for big's fp16, bf16 and memory-efficient fp16, 7%); a longer
run under them (hours, the whole corpus's longest sentences) is what would say whether 1.15 can
shrink.

Extrapolation is refused: the derived max_tokens is at most the largest measured for the arch and
precision (`measured_cap`; fp16 and bf16 hold the same bytes and share their rows) with the
allocator or with one that needs more at the same batch (HOLDS_LESS: a batch torch's default
allocator held, expandable segments hold): 57,344 for big and 32,768 for base, so an H200 derives
big's 57,344 x 8 with expandable segments and 45,875 x 10 without, never the other way round (it
derived 26,985 x 17 against 50,972 x 9 while each allocator had its own cap). The cap rises with a
measured row; the model of a batch larger than any measured is a guess, and the largest batch (on
the H200) is where the older, least-squares model fell 25.7% short.
New measurements (benchmarks.gpu's `gpu_mem_peak_mb`, in MiB: a row's GiB is it / 1024, with the
allocator the run had) are rows of MEASURED; `fit(MEASURED, allocator)` then gives the constants
(tests/unit/train/plan/test_batch.py checks that they are the fit's).
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from ..recipe.gpu_defaults import ALLOC_CONF, ALLOCATOR
from ..recipe.params import ARCH_DIMS, preset_params

# Bytes a parameter takes on the GPU: fairseq's fp16/bf16 optimizer keeps the half-precision weights
# and gradients (2 + 2) beside fp32 master weights and gradients (4 + 4) and Adam's two moments (8).
BYTES_PER_PARAM = {("fp16", "adam"): 20, ("bf16", "adam"): 20, ("fp32", "adam"): 16,
                   ("fp16", "sgd"): 12, ("bf16", "sgd"): 12, ("fp32", "sgd"): 8}
# FP16Optimizer's flat fp32 master copy through tandem's one-kernel copies (train/agent/trainer/fast_steps.py,
# flat_master_copy, on unless set false) keeps one fp16 staging buffer the size of the model besides
FLAT_COPY_BYTES = 2
# Sentence length: bytes a target token keeps for the backward pass per attention head, decoder layer
# and position of its (source, target) sentence, in fp16. Counted on CPU with fairseq 0.12.3's own
# Transformer (benchmarks/activation_bytes.py: torch.autograd's saved-tensor hooks over a training
# forward and the loss, fp16, one padded sentence a batch): the encoder-decoder attention runs
# fairseq's own bmm/softmax path and keeps its probabilities twice (softmax's fp32 output, 4 B, and
# the fp16 copy the value product saves, 2 B: per source position); the decoder's self-attention goes
# through torch's MHA, which merges the causal and padding masks into one fp16 (batch, heads, T, T)
# tensor that scaled_dot_product_attention keeps (2 B: per target position). Base's and big's saved
# bytes a token grew by 8.0 B x heads x decoder layers per position from 25 to 400 (tests check it
# on a small model).
ATTENTION_BYTES = (6.0, 2.0)
# The longest (source, target) pair in subwords, EOS included, of the corpus the rows were measured
# on (tandem's 32k subwords of the shared WMT sample, cut at 50 words a side) and of WMT16 en-de as
# prepare-data cleans it (250 words a side, train.agent.data.corpus.keep_pair: x 1.6 subwords a word,
# the sample's 99th percentile of sentences of 40 words and more, 1.71, rounded down, = 400)
SAMPLE_LONGEST = (99, 87)
WMT16_LONGEST = (400, 400)
# Attention heads of the fairseq architectures (their decoder_attention_heads)
HEADS = {"transformer": 8, "transformer_wmt_en_de": 8, "transformer_iwslt_de_en": 4,
         "transformer_vaswani_wmt_en_de_big": 16, "transformer_wmt_en_de_big": 16}
# Activations of fp32 training take 4 bytes where fp16/bf16 take 2: twice the measured half-precision
# bytes is an upper bound (the loss's fp32 part is the same in both). fp32 itself is not measured.
ACTIVATION_SCALE = {"fp16": 1.0, "bf16": 1.0, "fp32": 2.0}
# torch's caching allocator: with expandable segments (what tandem gives GPU ranks: train.run.command) or
# with its defaults (a user's PYTORCH_CUDA_ALLOC_CONF without them); each has its own rows and fit
EXPANDABLE, DEFAULT = "expandable", "default"
# the allocators whose measured batches an allocator holds too: the same batch peaked 38-45% lower with
# expandable segments than with torch's defaults (big 26,985 x 17 and base 32,768, one H100, issue 36)
HOLDS_LESS = {EXPANDABLE: (DEFAULT,)}
# fit(MEASURED, allocator), rounded up: bytes a token per vocabulary entry, and per (encoder + decoder
# layers) x model dimension
BYTES_PER_TOKEN = {EXPANDABLE: (15.2, 38.7), DEFAULT: (39.7, 90.8)}
MARGIN = 1.15  # the predicted peak x MARGIN must fit: beyond the envelope of every measured peak
RESERVED_GIB = 1.0  # other processes, NCCL's buffers (the measured runs had one GPU): what a batch may not count on
GIB = 2**30
FIT_VOCAB = 32000  # the measured runs' joint dictionary (tandem's WMT16 subwords)

BASE, BIG = "transformer_wmt_en_de", "transformer_vaswani_wmt_en_de_big"
H100, H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"


class Measured(NamedTuple):
    """One measured peak: NVML's whole-GPU memory in use at its highest during a run of benchmarks.gpu
    (one GPU, the preset named after its fairseq arch, Adam, vocabulary FIT_VOCAB)."""

    arch: str
    precision: str
    max_tokens: int
    update_freq: int
    gib: float
    card: str
    source: str
    allocator: str  # EXPANDABLE or DEFAULT: what the run's PYTORCH_CUDA_ALLOC_CONF gave it
    flat_copy: bool = False  # fp16 with tandem's flat master copy (FLAT_COPY_BYTES a parameter more)
    longest: tuple[int, int] = SAMPLE_LONGEST  # the corpus's longest (source, target) pair, in subwords


_README = "benchmarks/README.md 'Batch size, after the fix'"
_ISSUE = "issue 36 (main 0d9d639, preset defaults)"
_ISSUE36 = "benchmarks/README.md 'Issue 36 (2026-11-26)'"
# 300 updates unless said. The default allocator's rows are kept for a user who sets
# PYTORCH_CUDA_ALLOC_CONF without expandable segments (fit(MEASURED, DEFAULT)).
MEASURED: list[Measured] = [
    # expandable segments (what tandem's GPU ranks run with), one H100, the batch fab train derived then
    Measured(BIG, "fp16", 26985, 17, 30.01, H100, f"{_ISSUE36}, big-fp16-after, 30 updates (510 batches)",
             EXPANDABLE, flat_copy=True),
    Measured(BIG, "bf16", 26985, 17, 29.68, H100, f"{_ISSUE36}, big-bf16-after, 30 updates", EXPANDABLE),
    Measured(BIG, "fp16", 26985, 17, 28.09, H100, f"{_ISSUE36}, big-fp16-mefp16 (memory_efficient_fp16), 30 updates",
             EXPANDABLE),
    Measured(BASE, "fp16", 32768, 1, 24.31, H100, f"{_ISSUE36}, base-fp16-after", EXPANDABLE, flat_copy=True),
    # torch's default allocator
    Measured(BASE, "fp16", 4096, 1, 5.7, H100, f"{_README}, base-fp16-4k (the profiled run)", DEFAULT),
    Measured(BASE, "fp16", 16384, 1, 29.5, H100, f"{_README}, base-fp16-16k (maybe with a previous run's memory)",
             DEFAULT),
    Measured(BASE, "fp16", 32768, 1, 46.0, H100, f"{_README}, base-fp16-32k", DEFAULT),
    Measured(BASE, "fp16", 32768, 1, 46.0, H100, f"{_ISSUE}, base-fp16, 600 updates", DEFAULT),
    Measured(BASE, "fp16", 32768, 1, 46.1, H200, f"{_ISSUE}, base-fp16, 600 updates", DEFAULT),
    Measured(BASE, "fp16", 32768, 1, 44.45, H100, f"{_ISSUE36}, base-fp16-before", DEFAULT),
    Measured(BIG, "fp16", 3584, 1, 10.4, H100, f"{_README}, big-fp16-3.5k", DEFAULT),
    Measured(BIG, "fp16", 10240, 1, 20.4, H100, f"{_README}, big-fp16-10k", DEFAULT),
    Measured(BIG, "bf16", 10240, 1, 21.4, H100, f"{_README}, big-bf16-10k", DEFAULT),
    Measured(BIG, "fp16", 20480, 1, 43.8, H100, f"{_README}, big-fp16-20k", DEFAULT),
    Measured(BIG, "fp16", 26985, 17, 48.15, H100, f"{_ISSUE36}, big-fp16-before, 30 updates (510 batches)", DEFAULT),
    Measured(BIG, "fp16", 30583, 15, 63.8, H100, f"{_ISSUE}, big-fp16, 60 updates (900 batches)", DEFAULT),
    Measured(BIG, "fp16", 40960, 1, 44.1, H200, f"{_ISSUE}, big-fp16-40k, 100 updates", DEFAULT),
    Measured(BIG, "fp16", 57344, 8, 134.7, H200, f"{_ISSUE}, big-fp16, 60 updates (480 batches)", DEFAULT),
]


def _dims(options: Mapping[str, object]) -> tuple[int, int]:
    """(encoder + decoder layers, model dimension) of the options' model."""
    arch = ARCH_DIMS.get(str(options.get("arch", "transformer")), ARCH_DIMS["transformer"])
    width = int(options.get("encoder_embed_dim") or arch["embed_dim"])  # type: ignore[call-overload]
    layers = int(options.get("encoder_layers") or arch["encoder_layers"]) + int(  # type: ignore[call-overload]
        options.get("decoder_layers") or arch["decoder_layers"])  # type: ignore[call-overload]
    return layers, width


def length_bytes(options: Mapping[str, object], longest: tuple[int, int] = WMT16_LONGEST) -> float:
    """Bytes a max_tokens unit keeps for attention in a batch of `longest` (source S, target T) pairs,
    fp16: per sentence, heads x decoder layers x T x (ATTENTION_BYTES[0] x S + ATTENTION_BYTES[1] x T)
    (the encoder-decoder probabilities are T x S, the self-attention's mask T x T), over the
    max(S, T) units a sentence takes of max_tokens. Equal lengths are the worst case."""
    arch = str(options.get("arch", "transformer"))
    heads = int(options.get("decoder_attention_heads") or HEADS.get(arch, 8))  # type: ignore[call-overload]
    decoder = int(options.get("decoder_layers") or ARCH_DIMS.get(arch, ARCH_DIMS["transformer"])[  # type: ignore[call-overload]
        "decoder_layers"])
    source, target = longest
    return heads * decoder * target * (ATTENTION_BYTES[0] * source + ATTENTION_BYTES[1] * target) / max(source,
                                                                                                      target)


def flat_copy_of(options: Mapping[str, object], precision: str) -> bool:
    """Whether a run keeps fp16's flat master copy's staging buffer: fp16 with FairseqAdam's
    FP16Optimizer (not memory-efficient fp16) and flat_master_copy not set false (on by default,
    train.run.command.FAST_STEP_SWITCHES)."""
    return (precision == "fp16" and options.get("flat_master_copy") is not False
            and not options.get("memory_efficient_fp16"))


def _measured_options(arch: str) -> dict[str, object]:
    """The options of the preset a row measured (each is named after its arch; all share embeddings)."""
    return {"arch": arch, "share_all_embeddings": True}


def row_peak_gib(row: Measured) -> float:
    """The model's peak for a measured row: its batch, precision, allocator, master copy and corpus."""
    options = {**_measured_options(row.arch), "flat_master_copy": row.flat_copy,
               "memory_efficient_fp16": "memory_efficient_fp16" in row.source}
    return peak_gib(options, FIT_VOCAB, row.max_tokens, row.precision, allocator=row.allocator, longest=row.longest)


def allocator_of(env: Mapping[str, str] | None = None) -> str:
    """The allocator GPU ranks get from `env` (default: the environment fab train runs in), as
    train.run.command.environment gives it: expandable segments unless PYTORCH_CUDA_ALLOC_CONF is set
    without `expandable_segments:True` (set empty: torch's defaults)."""
    conf = (os.environ if env is None else env).get(ALLOC_CONF, ALLOCATOR)
    return EXPANDABLE if "expandable_segments:True" in conf.replace(" ", "").split(",") else DEFAULT


def _allocator(allocator: str | None) -> str:
    if allocator is None:
        return allocator_of()
    if allocator not in BYTES_PER_TOKEN:
        raise ValueError(f"allocator {allocator!r}: {EXPANDABLE!r} or {DEFAULT!r}")
    return allocator


def fit(rows: Iterable[Measured], allocator: str = EXPANDABLE) -> tuple[float, float]:
    """(bytes a token per vocabulary entry, per layer x width) of the rows measured with `allocator`:
    the least per-token bytes whose model lies on or above every such row, least in the sum of the
    model's ratios to the rows. A linear program in two unknowns, solved at its corners: each pair of
    rows (or a row and an axis) met exactly."""
    needs = []  # (bytes a token per vocab coefficient, per layer-width coefficient, bytes to cover, measured)
    for r in (r for r in rows if r.allocator == _allocator(allocator)):
        options = _measured_options(r.arch)
        static = preset_params(options, FIT_VOCAB) * (BYTES_PER_PARAM[(r.precision, "adam")] +
                                                      FLAT_COPY_BYTES * r.flat_copy)
        layers, width = _dims(options)
        scale = r.max_tokens * ACTIVATION_SCALE[r.precision]
        attention = scale * length_bytes(options, r.longest)  # the rows' own longest pairs
        needs.append((FIT_VOCAB * scale, layers * width * scale, r.gib * GIB - static - attention, r.gib * GIB))
    if not needs:
        raise ValueError(f"no peaks measured with the {allocator} allocator to fit")
    lines = [(v, w, need) for v, w, need, _ in needs] + [(1.0, 0.0, 0.0), (0.0, 1.0, 0.0)]  # and a, b >= 0
    best: tuple[float, float, float] | None = None
    for (v1, w1, n1), (v2, w2, n2) in itertools.combinations(lines, 2):
        det = v1 * w2 - v2 * w1
        if abs(det) < 1e-9 * max(abs(v1 * w2), abs(v2 * w1), 1.0):
            continue  # parallel: rows of one architecture
        a, b = (n1 * w2 - n2 * w1) / det, (v1 * n2 - v2 * n1) / det
        if a < 0 or b < 0 or any(a * v + b * w < need * (1 - 1e-9) for v, w, need, _ in needs):
            continue
        cost = sum((a * v + b * w + (m - need)) / m for v, w, need, m in needs)
        if best is None or cost < best[0]:
            best = (cost, a, b)
    if best is None:
        raise ValueError("no per-token bytes cover every row")
    return best[1], best[2]


def static_gib(params: int, precision: str = "fp16", optimizer: str = "adam", extra_per_param: int = 0) -> float:
    """Weights, gradients and optimizer state; `extra_per_param`: what the communication strategy
    keeps beside them (local SGD's flat fp32 copy and BMUF's outer state: comm.Strategy)."""
    key = (precision, optimizer if optimizer in ("adam", "sgd") else "adam")
    return params * (BYTES_PER_PARAM[key] + extra_per_param) / GIB


def bytes_per_token(options: Mapping[str, object], vocab: int, precision: str = "fp16",
                    allocator: str | None = None, longest: tuple[int, int] = WMT16_LONGEST) -> float:
    """A batch's bytes a max_tokens unit when it holds the `longest` (source, target) pairs (default:
    WMT16's). `allocator`: EXPANDABLE or DEFAULT; None, the one the ranks get from fab train's
    environment (allocator_of), as in every function below."""
    layers, width = _dims(options)
    per_vocab, per_width = BYTES_PER_TOKEN[_allocator(allocator)]
    return (per_vocab * vocab + per_width * layers * width + length_bytes(options, longest)) * \
        ACTIVATION_SCALE[precision]


def options_static_gib(options: Mapping[str, object], vocab: int, precision: str = "fp16",
                       extra_per_param: int = 0) -> float:
    """Every static byte of the options' model: static_gib, and fp16's flat master copy's buffer."""
    extra = extra_per_param + FLAT_COPY_BYTES * flat_copy_of(options, precision)
    return static_gib(preset_params(options, vocab), precision, str(options.get("optimizer", "adam")), extra)


def peak_gib(options: Mapping[str, object], vocab: int, max_tokens: int, precision: str = "fp16",
             extra_per_param: int = 0, allocator: str | None = None,
             longest: tuple[int, int] = WMT16_LONGEST) -> float:
    """Predicted peak GPU memory of one rank training with `max_tokens` on a corpus whose longest pair
    is `longest` (no margin)."""
    return options_static_gib(options, vocab, precision, extra_per_param) + \
        max_tokens * bytes_per_token(options, vocab, precision, allocator, longest) / GIB


def headroom_gib(peak: float) -> float:
    """What a batch predicted to peak at `peak` GiB must leave free on its card: MARGIN's share of the
    peak and RESERVED_GIB."""
    return peak * (MARGIN - 1) + RESERVED_GIB


def fits(options: Mapping[str, object], vocab: int, max_tokens: int, gpu_gib: float, precision: str = "fp16",
         extra_per_param: int = 0, allocator: str | None = None, longest: tuple[int, int] = WMT16_LONGEST) -> bool:
    peak = peak_gib(options, vocab, max_tokens, precision, extra_per_param, allocator, longest)
    return peak + headroom_gib(peak) <= gpu_gib


def measured_cap(options: Mapping[str, object], precision: str = "fp16",
                 rows: Iterable[Measured] = MEASURED, allocator: str | None = None) -> tuple[int, str]:
    """The largest max_tokens measured for the options' arch at the precision (fp16 and bf16 together:
    the same bytes) with the allocator or one that needs more (HOLDS_LESS: a batch torch's default
    allocator held, expandable segments hold with 38-45% less at the same batch, measured both ways),
    and where it comes from; an arch or precision without rows: the arch's largest, else the largest
    of any. So expandable segments never derive a smaller batch than the default allocator would."""
    arch = str(options.get("arch", "transformer"))
    allocator = _allocator(allocator)
    rows = [r for r in rows if r.allocator == allocator or r.allocator in HOLDS_LESS.get(allocator, ())]
    half = ACTIVATION_SCALE[precision]
    for found, said in (([r for r in rows if r.arch == arch and ACTIVATION_SCALE[r.precision] == half], ""),
                        ([r for r in rows if r.arch == arch], f", {precision} not measured"),
                        (rows, f", {arch} not measured")):
        if found:
            top = max(found, key=lambda r: r.max_tokens)
            segments = "expandable segments" if top.allocator == EXPANDABLE else "torch's default allocator"
            return top.max_tokens, f"the largest measured ({top.arch} {top.precision} on {top.card}, {segments}{said})"
    raise ValueError(f"no peaks measured with the {allocator} allocator")


def largest_max_tokens(options: Mapping[str, object], vocab: int, gpu_gib: float, precision: str = "fp16",
                       multiple: int = 256, extra_per_param: int = 0, allocator: str | None = None,
                       longest: tuple[int, int] = WMT16_LONGEST) -> int:
    """The largest max_tokens predicted to fit `gpu_gib` with the margin on a batch of the `longest`
    pairs (a multiple of `multiple`) and at most the largest measured (measured_cap, as measured); 0
    when not even the model fits."""
    room = (gpu_gib - RESERVED_GIB) / MARGIN - options_static_gib(options, vocab, precision, extra_per_param)
    if room <= 0:
        return 0
    by_memory = int(room * GIB / bytes_per_token(options, vocab, precision, allocator, longest))
    return min(by_memory // multiple * multiple, measured_cap(options, precision, allocator=allocator)[0])


def fill(words_per_update: float | None, max_tokens: int | None, update_freq: int | None,
         ranks: int | None) -> float | None:
    """Target words an update over the tokens its batches may hold (max_tokens x update_freq x ranks):
    what padding and the sentences that did not fit leave of a batch. fairseq's words/s count target
    words only, so two runs' words/s compare only at the same fill; None where a figure is missing."""
    if not words_per_update or not max_tokens or not update_freq or not ranks:
        return None
    return words_per_update / (max_tokens * update_freq * ranks)


def fill_text(value: float | None) -> str:
    """`fill 0.89` (target words / (max_tokens x update-freq x ranks)), or nothing."""
    return f"fill {value:.2f}" if value is not None else ""


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
    """The batch for `ranks` ranks: update_freq the least whose max_tokens, ⌊target / (update_freq x
    ranks)⌋, is within the cap, so the product is within one token per rank-batch of the target
    (within 5% unless ranks x update_freq is near the target itself): big's 458,752 on one H100 is
    the measured 26,985 x 17 (458,745), not 25,486 x 18. A `max_tokens` or `update_freq`
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
        while update_freq > 1 and target // ((update_freq - 1) * ranks) <= cap:
            update_freq -= 1  # the product a few tokens short of the target, one pass fewer
        max_tokens = max(1, min(cap, target // (update_freq * ranks)))
    return Batch(int(max_tokens), int(update_freq), ranks, target, cap, why)  # type: ignore[arg-type]
