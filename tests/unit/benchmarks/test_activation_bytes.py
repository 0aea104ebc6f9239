"""benchmarks/activation_bytes.py: the memory model's sentence-length term is what fairseq's Transformer keeps."""

from __future__ import annotations

import pytest

from benchmarks import activation_bytes
from train.plan import batch


def test_fairseqs_saved_bytes_a_token_grow_with_the_sentence_as_the_memory_model_says():
    """A small fairseq Transformer (4 heads, 2 + 2 layers) in fp16 on CPU, sentences of 25 and of 200
    subwords: the bytes a token kept for the backward pass grow by the model's bytes a position
    (ATTENTION_BYTES, 6 + 2) x heads x decoder layers."""
    model, words = activation_bytes.build(
        "transformer", vocab=1000, encoder_embed_dim=64, decoder_embed_dim=64, encoder_ffn_embed_dim=256,
        decoder_ffn_embed_dim=256, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4)
    short, long = (activation_bytes.per_token(model, words, length, 800) for length in (25, 200))
    options = {"arch": "transformer", "decoder_layers": 2, "decoder_attention_heads": 4}
    predicted = batch.length_bytes(options, (200, 200)) - batch.length_bytes(options, (25, 25))
    assert long - short == pytest.approx(predicted, rel=0.05), (short, long, predicted)
