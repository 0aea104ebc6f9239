"""Transformer layers through torch.compile (train/agent/compiled_layers.py): the same outputs and
gradients as fairseq's eager layers, one graph per kind of layer whatever the batch's shape (a
recompile per batch would stall every update), eval and beam search untouched. torch.compile's
graph capture and autograd run here on CPU (backend aot_eager); the GPU's code generation is
torch's own."""

from __future__ import annotations

import argparse
import copy

import pytest
import torch
import torch._dynamo
from fairseq.data import Dictionary
from fairseq.incremental_decoding_utils import FairseqIncrementalState
from fairseq.models import ARCH_CONFIG_REGISTRY
from fairseq.models.transformer import TransformerModel
from fairseq.modules import transformer_layer
from torch._dynamo.utils import counters

from train.agent import compiled_layers
from train.recipe import presets

SHAPES = [(3, 7, 9), (5, 4, 6), (2, 11, 12), (4, 9, 3)]  # sentences, source length, target length
MORE_SHAPES = [(6, 5, 5), (2, 13, 14), (7, 3, 8)]


def tiny_model() -> TransformerModel:
    dictionary = Dictionary()
    for i in range(60):
        dictionary.add_symbol(f"w{i}")
    options = presets.PRESETS["tiny"]
    args = argparse.Namespace(**{k: v for k, v in options.items() if k.endswith(("_dim", "_layers", "_heads"))})
    args.share_all_embeddings, args.arch = True, options["arch"]
    args.dropout = args.attention_dropout = args.activation_dropout = 0.0  # the same numbers both ways
    ARCH_CONFIG_REGISTRY[args.arch](args)
    task = argparse.Namespace(source_dictionary=dictionary, target_dictionary=dictionary)
    torch.manual_seed(0)
    return TransformerModel.build_model(args, task)


def batch(sentences: int, source: int, target: int):
    gen = torch.Generator().manual_seed(sentences * 100 + source)
    src = torch.randint(4, 60, (sentences, source), generator=gen)
    if source % 2:
        src[0, :2] = 1  # left-padded, as fairseq batches the source (in some batches only)
    prev = torch.randint(4, 60, (sentences, target), generator=gen)
    if sentences % 2:
        prev[-1, -2:] = 1  # right-padded targets in some batches only
    lengths = (src != 1).sum(1)
    return {"src_tokens": src, "src_lengths": lengths, "prev_output_tokens": prev}


def train_steps(model, shapes=SHAPES):
    """Each shape's logits and the gradients they give."""
    results = []
    for shape in shapes:
        model.zero_grad()
        logits, _ = model(**batch(*shape))
        logits.float().pow(2).mean().backward()
        results.append((logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    return results


@pytest.fixture
def compiled(monkeypatch):
    """compiled_layers installed for one test (aot_eager: no C++ compiler on the way), undone after."""
    for cls in (transformer_layer.TransformerEncoderLayerBase, transformer_layer.TransformerDecoderLayerBase):
        monkeypatch.setattr(cls, "forward", cls.forward)
    monkeypatch.setattr(FairseqIncrementalState, "get_incremental_state", FairseqIncrementalState.get_incremental_state)
    monkeypatch.setenv("TANDEM_COMPILE_LAYERS", "1")
    torch._dynamo.reset()
    counters.clear()
    compiled_layers.install(backend="aot_eager")
    yield
    torch._dynamo.reset()


def test_compiled_layers_train_as_fairseqs_with_one_graph_a_kind_of_layer(compiled):
    eager = tiny_model()
    model = copy.deepcopy(eager)
    for cls in (transformer_layer.TransformerEncoderLayerBase, transformer_layer.TransformerDecoderLayerBase):
        assert cls.forward._tandem
    with torch.compiler.set_stance("force_eager"):  # fairseq's own layers, for the reference
        expected = train_steps(eager)
    got = train_steps(model)
    for (logits, grads), (their_logits, their_grads) in zip(got, expected, strict=True):
        torch.testing.assert_close(logits, their_logits, rtol=1e-4, atol=1e-5)
        for name, grad in grads.items():
            torch.testing.assert_close(grad, their_grads[name], rtol=1e-4, atol=1e-5, msg=name)
    # the encoder one, the decoder two (its last layer returns attention weights), padding or not
    assert counters["stats"]["unique_graphs"] == 3, dict(counters["stats"])
    train_steps(model, MORE_SHAPES)
    assert counters["stats"]["unique_graphs"] == 3, "a new batch shape compiled again"
    assert model.state_dict().keys() == eager.state_dict().keys()  # checkpoints as before


def test_validation_and_beam_search_stay_eager(compiled):
    model = tiny_model().eval()
    with torch.no_grad():
        model(**batch(*SHAPES[0]))
        encoder_out = model.encoder(batch(*SHAPES[0])["src_tokens"], src_lengths=batch(*SHAPES[0])["src_lengths"])
        state: dict = {}
        for step in range(1, 4):
            model.decoder(batch(*SHAPES[0])["prev_output_tokens"][:, :step], encoder_out=encoder_out,
                          incremental_state=state)
    assert counters["stats"]["unique_graphs"] == 0
    assert state, "beam search kept its decoding state"


def test_without_a_gpu_compiler_the_layers_stay_fairseqs(monkeypatch, caplog):
    """A GPU image whose torch came without triton: the run goes on uncompiled, and says so."""
    encoder = transformer_layer.TransformerEncoderLayerBase
    monkeypatch.setattr(encoder, "forward", encoder.forward)
    monkeypatch.setenv("TANDEM_COMPILE_LAYERS", "1")
    monkeypatch.setattr(compiled_layers, "gpu_compiler_available", lambda: False)
    before = encoder.forward
    compiled_layers.install()
    assert encoder.forward is before
    assert "no triton" in caplog.text
