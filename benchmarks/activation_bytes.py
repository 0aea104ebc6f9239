"""What a fairseq Transformer keeps for its backward pass, per target token, at several sentence lengths:
the sentence-length term of the GPU memory model (train.plan.batch.ATTENTION_BYTES), counted on CPU.

    python -m benchmarks.activation_bytes [--arch transformer_wmt_en_de] [--lengths 25,100,400] [--tokens 1600]

How: fairseq 0.12.3's own TransformerModel (the arch's dimensions, shared embeddings, a 32,000-entry
dictionary) in fp16 and training mode, one forward pass and the label-smoothed loss's log-softmax
under torch.autograd.graph.saved_tensors_hooks; every tensor autograd saves is counted once by its
storage (the parameters left out). A batch of `tokens` / L sentences of L source and L target
subwords, one of them half padding on each side (fairseq then passes the padding masks, as in
training). This is what stays alive until the backward pass, not the GPU's peak (which adds the
backward's gradients and the allocator's pool): the slope over L is what the memory model takes from
it, the intercept comes from the GPU rows. The CPU runs torch's CPU kernels; the tensors that grow
with L (the encoder-decoder attention's probabilities from fairseq's own bmm/softmax path, the
decoder self-attention's merged mask that scaled_dot_product_attention keeps) are the same on a GPU.
"""

from __future__ import annotations

import argparse
import time
import types

import torch

VOCAB = 32000


def build(arch: str, vocab: int = VOCAB, **dims: int):
    """fairseq's TransformerModel for `arch` (dims override the arch's: encoder_embed_dim=64, ...)."""
    from fairseq.data import Dictionary
    from fairseq.models import ARCH_CONFIG_REGISTRY
    from fairseq.models.transformer import TransformerModel

    words = Dictionary()
    for i in range(vocab - len(words)):
        words.add_symbol(f"w{i}")
    args = argparse.Namespace(arch=arch, share_all_embeddings=True, dropout=0.1, max_source_positions=1024,
                              max_target_positions=1024, **dims)
    ARCH_CONFIG_REGISTRY[arch](args)
    model = TransformerModel.build_model(args, types.SimpleNamespace(source_dictionary=words, target_dictionary=words))
    return model, words


def saved_bytes(model, words, sentences: int, source: int, target: int, dtype=torch.float16) -> int:
    """Bytes autograd keeps from one training forward and the loss of `sentences` pairs of these
    lengths (the first half padding on each side), parameters left out."""
    model = model.to(dtype).train()
    generator = torch.Generator().manual_seed(0)
    src = torch.randint(words.nspecial, len(words), (sentences, source), generator=generator)
    tgt = torch.randint(words.nspecial, len(words), (sentences, target), generator=generator)
    src[:, -1] = tgt[:, -1] = words.eos()
    src[0, : source // 2] = words.pad()  # fairseq pads sources on the left
    tgt[0, target // 2:] = words.pad()
    prev = torch.roll(tgt, 1, 1)
    kept: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        kept[storage.data_ptr()] = max(kept.get(storage.data_ptr(), 0), storage.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out, _ = model(src, torch.full((sentences,), source), prev)
        lprobs = torch.log_softmax(out.float(), dim=-1)  # fairseq's get_normalized_probs
        _ = -lprobs.gather(-1, tgt.unsqueeze(-1)).sum() - 0.1 * lprobs.sum()  # label smoothing's two terms
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    return sum(n for ptr, n in kept.items() if ptr not in params)


def per_token(model, words, length: int, tokens: int = 1600) -> float:
    """Saved bytes a target token at source = target = `length`."""
    sentences = max(2, tokens // length)
    return saved_bytes(model, words, sentences, length, length) / (sentences * length)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", default="transformer_wmt_en_de")
    p.add_argument("--lengths", default="25,100,400")
    p.add_argument("--tokens", type=int, default=1600, help="tokens a batch (its sentences: tokens / length)")
    a = p.parse_args(argv)
    model, words = build(a.arch)
    heads, layers = model.decoder.layers[0].self_attn.num_heads, len(model.decoder.layers)
    print(f"{a.arch}: {heads} heads, {layers} decoder layers, fp16, CPU")
    print("length  sentences  saved B/token  B/token per length x heads x decoder layers (from the first)")
    first = None
    for length in [int(x) for x in a.lengths.split(",")]:
        started = time.monotonic()
        b = per_token(model, words, length, a.tokens)
        slope = "" if first is None else f"{(b - first[1]) / (length - first[0]) / (heads * layers):.2f}"
        first = first or (length, b)
        took = time.monotonic() - started
        print(f"{length:6d}  {max(2, a.tokens // length):9d}  {b:13,.0f}  {slope}   ({took:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
