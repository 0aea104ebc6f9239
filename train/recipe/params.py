"""The one parameter count of a fairseq Transformer, from a preset's options (no torch).

Used where a size follows from the model: the heartbeat's checkpoint-save allowance
(train.recipe.presets), the gradient bytes of the cost model (train.plan.model); the count carries
the tensors' shapes (ParamCount), for a strategy whose bytes follow from them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

# Dimensions the fairseq architectures set (fairseq/models/transformer/transformer_legacy.py)
ARCH_DIMS: dict[str, dict[str, int | bool]] = {
    "transformer": {"embed_dim": 512, "ffn_dim": 2048, "encoder_layers": 6, "decoder_layers": 6},
    "transformer_wmt_en_de": {"embed_dim": 512, "ffn_dim": 2048, "encoder_layers": 6, "decoder_layers": 6},
    "transformer_iwslt_de_en": {"embed_dim": 512, "ffn_dim": 1024, "encoder_layers": 6, "decoder_layers": 6},
    "transformer_vaswani_wmt_en_de_big": {
        "embed_dim": 1024,
        "ffn_dim": 4096,
        "encoder_layers": 6,
        "decoder_layers": 6,
    },
    "transformer_wmt_en_de_big": {"embed_dim": 1024, "ffn_dim": 4096, "encoder_layers": 6, "decoder_layers": 6},
}


class ParamCount(int):
    """A parameter count that knows the model's tensors: `shapes`, one tuple a tensor (what a strategy
    whose bytes follow from the shapes reads, train.recipe.strategies.powersgd). It is the count
    everywhere else (arithmetic gives plain ints; JSON writes the number)."""

    shapes: tuple[tuple[int, ...], ...]

    def __new__(cls, shapes: Iterable[tuple[int, ...]]) -> ParamCount:
        shapes = tuple(shapes)
        count = super().__new__(cls, sum(math.prod(s) for s in shapes))
        count.shapes = shapes
        return count

    def __reduce__(self):  # copies and pickles (dataclasses.asdict deep-copies) keep the shapes
        return ParamCount, (self.shapes,)


def transformer_shapes(
    vocab: int,
    embed_dim: int,
    ffn_dim: int,
    encoder_layers: int,
    decoder_layers: int,
    *,
    share_all_embeddings: bool = True,
    share_decoder_input_output_embed: bool = False,
    target_vocab: int | None = None,
    normalize_before: bool = False,
    learned_positions: bool = False,
    max_positions: int = 1024,
) -> list[tuple[int, ...]]:
    """The tensors of a fairseq `TransformerModel` (weights as torch lays them out: Linear (out, in)),
    from its dimensions (no torch).

    Embeddings V×d (one matrix when all embeddings are shared, else source, target and, unless
    tied, the output projection); per encoder layer self-attention q, k, v, out (d×d, with biases),
    FFN d→f→d (with biases), two LayerNorms (weight and bias); per decoder layer the same plus
    encoder attention and a third LayerNorm. Sinusoidal positions have no parameters.
    """
    d, f = embed_dim, ffn_dim
    target_vocab = vocab if target_vocab is None else target_vocab
    attention = [(d, d), (d,)] * 4
    ffn = [(f, d), (f,), (d, f), (d,)]
    norms = [(d,), (d,)]
    shapes: list[tuple[int, ...]] = [(vocab, d)]
    if not share_all_embeddings:
        shapes.append((target_vocab, d))
        if not share_decoder_input_output_embed:
            shapes.append((target_vocab, d))
    if learned_positions:
        shapes += [(max_positions + 2, d)] * 2
    shapes += (attention + ffn + 2 * norms) * encoder_layers
    shapes += (2 * attention + ffn + 3 * norms) * decoder_layers
    if normalize_before:
        shapes += 2 * norms  # final LayerNorm of encoder and decoder
    return shapes


def transformer_params(vocab: int, embed_dim: int, ffn_dim: int, encoder_layers: int, decoder_layers: int,
                       **kwargs: object) -> ParamCount:
    """Parameters of a fairseq `TransformerModel`, counted from its dimensions (no torch): per
    encoder layer 4d²+4d of self-attention, 2·d·f+f+d of FFN, 4d of LayerNorms; per decoder layer
    the same plus encoder attention 4d²+4d and a third LayerNorm; the embeddings V×d
    (transformer_shapes lists the tensors)."""
    return ParamCount(transformer_shapes(vocab, embed_dim, ffn_dim, encoder_layers, decoder_layers,
                                         **kwargs))  # type: ignore[arg-type]


def preset_params(options: Mapping[str, object], vocab: int) -> ParamCount:
    """Parameters of the model a preset's options describe (explicit dims win over the arch's)."""
    arch = str(options.get("arch", "transformer"))
    if arch not in ARCH_DIMS:
        raise ValueError(f"no dimensions known for arch {arch!r} (known: {', '.join(ARCH_DIMS)})")
    dims = ARCH_DIMS[arch]

    def pick(key: str, default: object) -> int:
        value = options.get(key)
        return int(value if value is not None else default)  # type: ignore[call-overload]

    return transformer_params(
        vocab,
        embed_dim=pick("encoder_embed_dim", dims["embed_dim"]),
        ffn_dim=pick("encoder_ffn_embed_dim", dims["ffn_dim"]),
        encoder_layers=pick("encoder_layers", dims["encoder_layers"]),
        decoder_layers=pick("decoder_layers", dims["decoder_layers"]),
        share_all_embeddings=bool(options.get("share_all_embeddings", False)),
        share_decoder_input_output_embed=bool(options.get("share_decoder_input_output_embed", False)),
        normalize_before=bool(options.get("encoder_normalize_before", False)),
        learned_positions=bool(options.get("encoder_learned_pos", False)),
        max_positions=pick("max_source_positions", 1024),
    )
