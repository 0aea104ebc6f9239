"""The one parameter count of a fairseq Transformer, from a preset's options (no torch).

Used where a size follows from the model: the heartbeat's checkpoint-save allowance
(train.run.presets), the gradient bytes of the cost model (train.plan.model).
"""

from __future__ import annotations

from collections.abc import Mapping

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


def transformer_params(
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
) -> int:
    """Parameters of a fairseq `TransformerModel`, counted from its dimensions (no torch).

    Embeddings V×d (one matrix when all embeddings are shared, else source, target and,
    unless tied, the output projection); per encoder layer self-attention 4d²+4d (q, k, v,
    out with biases), FFN 2·d·f+f+d, two LayerNorms 4d; per decoder layer the same plus
    encoder attention 4d²+4d and a third LayerNorm. Sinusoidal positions have no parameters.
    """
    d, f = embed_dim, ffn_dim
    target_vocab = vocab if target_vocab is None else target_vocab
    attention = 4 * d * d + 4 * d
    ffn = 2 * d * f + f + d
    encoder_layer = attention + ffn + 2 * 2 * d
    decoder_layer = 2 * attention + ffn + 3 * 2 * d
    if share_all_embeddings:
        embeddings = vocab * d
    else:
        embeddings = vocab * d + target_vocab * d
        if not share_decoder_input_output_embed:
            embeddings += target_vocab * d
    total = embeddings + encoder_layers * encoder_layer + decoder_layers * decoder_layer
    if normalize_before:
        total += 2 * 2 * d  # final LayerNorm of encoder and decoder
    if learned_positions:
        total += 2 * (max_positions + 2) * d
    return total


def preset_params(options: Mapping[str, object], vocab: int) -> int:
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
