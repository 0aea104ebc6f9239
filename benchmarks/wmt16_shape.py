"""A benchmark corpus with WMT16 en-de's sentence lengths and its batches' padding, at any size.

    python -m benchmarks.wmt16_shape build --subwords KIT/subwords --out DIR --pairs N [--seed 1]
    python -m benchmarks.wmt16_shape fill --subwords KIT/subwords [--max-tokens 4096,26985,57344]

Why: the GPU runs trained on the shared sample (9,980 pairs) repeated REPEAT times, and fairseq's
length-sorted batches carry more padding the fewer copies there are: target words per max_tokens
unit (the fill) 0.745 at REPEAT=12 and 0.837 at 30 for big's 26,985 (`fill` below, fairseq's own
batch_by_size), so words/s of two runs could not be compared. This corpus: 0.888 at any REPEAT up to
33 (0.906 at 60), WMT16's lengths at full size 0.898. The sample is also cut at 50 words a
side (its longest pair 99/87 subwords), WMT16's cleaning at 250 (~400 subwords): the longest batches,
which set the memory peak, never came.

How (`lengths`): WMT16_PAIRS (source, target) lengths in subwords are drawn at WMT16's full size: the
source's from HISTOGRAM, the target's as the source's times a pair's ratio drawn from the sample (its
target over source subwords). They are put in fairseq's order (LanguagePairDataset.ordered_indices:
by source, then target); the corpus is BLOCKS runs of consecutive pairs of BLOCK_TOKENS tokens each,
evenly spaced in tokens (a batch is max_tokens whatever its length: WMT16's share of batches at a
length is its share of tokens), and the LAST_BLOCK longest pairs. A block holds more than two
batches, so the corpus's batches are WMT16's: 334,653 pairs, the same for any REPEAT up to 33 (on_gpu.sh
asks REPEAT x 9,980), whole copies beyond. The text of a pair
(`build`) is its lengths' worth of the sample's subwords, read on from a random line: no translation,
tokens as frequent as the sample's (what the embedding and the softmax see).

HISTOGRAM, the share of pairs by source length in subwords (tandem's 32k sentencepiece):
- up to 99 subwords (50 words): the sample's own (WMT's training text, OpenNMT-py's en-de sample),
  scaled to 1 - TAIL;
- beyond: TAIL = 3.7% of pairs, the log-normal fit of the sample's English words a sentence (log mean
  3.00, sd 0.52) past 50 words (it gives 6.5% of the sample at 41-50 words against 5.0%: the real
  tail is if anything heavier), its shares between 50 and 250 words at 1.36 subwords a word (the
  sample's); then the LONGEST pairs at prepare-data's limit, 250 words (WMT16_LONGEST, 400 subwords:
  train.plan.batch), the batch a run of hours meets and its memory must hold.
Not WMT16's measured histogram (no copy of WMT16 here): `histogram DIR` prints one from a prepared
corpus's subwords (fab prepare-data --wmt16 leaves them in DATA/wmt16/subwords) to replace it.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import numpy as np

from train.plan import batch as batch_model

WMT16_PAIRS = 4_562_102  # Europarl v7 + Common Crawl + News Commentary v11 (benchmarks.wmt16_mirror)
BLOCK_TOKENS = 131072  # tokens (max(source, target) a pair) a block: 2.3 batches of big's 57,344
BLOCKS = 96  # blocks of the corpus: 12.6M tokens
LAST_BLOCK = 1024  # the longest pairs of WMT16's order, always in the corpus
LONGEST = 64  # pairs at WMT16_LONGEST (in the last block)
TAIL, TAIL_LOG_MEAN, TAIL_LOG_SD, SUBWORDS_A_WORD = 0.037, 2.997, 0.519, 1.36
SAMPLE_MAX = 99  # the sample's longest source in subwords (EOS included): where its own shares end
MULTIPLE = 8  # fairseq's --required-batch-size-multiple (its default; tandem's presets keep it)


def sizes(subword_file: Path) -> np.ndarray:
    """Each line's length as fairseq counts it: its subwords and EOS."""
    with open(subword_file) as f:
        return np.array([len(line.split()) + 1 for line in f], dtype=np.int64)


def histogram(subwords: Path) -> dict[int, float]:
    """The share of pairs by source length (subwords and EOS) of a corpus's train.en."""
    src = sizes(subwords / "train.en")
    lengths, counts = np.unique(src, return_counts=True)
    return {int(n): c / len(src) for n, c in zip(lengths, counts, strict=True)}


def source_shares(sample: dict[int, float]) -> tuple[np.ndarray, np.ndarray]:
    """(lengths, shares) of HISTOGRAM: the sample's up to SAMPLE_MAX, the log-normal's tail beyond."""
    body = {n: s * (1 - TAIL) for n, s in sample.items() if n <= SAMPLE_MAX}
    top = batch_model.WMT16_LONGEST[0]
    tail_lengths = np.arange(SAMPLE_MAX + 1, top + 1)
    words = (tail_lengths - 1) / SUBWORDS_A_WORD
    density = np.exp(-((np.log(words) - TAIL_LOG_MEAN) ** 2) / (2 * TAIL_LOG_SD**2)) / words
    tail = dict(zip(tail_lengths.tolist(), (TAIL * density / density.sum()).tolist(), strict=True))
    shares = {**body, **tail}
    lengths = np.array(sorted(shares))
    p = np.array([shares[n] for n in lengths])
    return lengths, p / p.sum()


def full_size(subwords: Path, pairs: int = WMT16_PAIRS, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """(source, target) lengths of `pairs` pairs with HISTOGRAM's sources and the sample's ratios, the
    LONGEST last ones at WMT16_LONGEST."""
    rng = np.random.default_rng(seed)
    sample_src, sample_tgt = sizes(subwords / "train.en"), sizes(subwords / "train.de")
    lengths, p = source_shares(histogram(subwords))
    src = rng.choice(lengths, size=pairs, p=p)
    ratio = rng.choice(sample_tgt / sample_src, size=pairs)
    top_src, top_tgt = batch_model.WMT16_LONGEST
    tgt = np.clip(np.rint(src * ratio), 2, top_tgt).astype(np.int64)
    src[-LONGEST:], tgt[-LONGEST:] = top_src, top_tgt
    return src, tgt


def fairseq_order(src: np.ndarray, tgt: np.ndarray, seed: int = 1) -> np.ndarray:
    """LanguagePairDataset.ordered_indices (shuffled, no buckets): by source, then target."""
    order = np.random.default_rng(seed).permutation(len(src))
    order = order[np.argsort(tgt[order], kind="mergesort")]
    return order[np.argsort(src[order], kind="mergesort")]


def lengths(subwords: Path, pairs: int = 0, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """The benchmark corpus's (source, target) lengths: BLOCKS evenly spaced blocks of WMT16's
    full-size order and its LAST_BLOCK longest pairs, the same whatever `pairs` asks; copies of it
    where `pairs` asks for more (each block then longer: its batches as homogeneous or more)."""
    src, tgt = full_size(subwords, seed=seed)
    order = fairseq_order(src, tgt, seed)
    # evenly spaced in tokens, not pairs: a batch is max_tokens whatever its length, so the share of
    # WMT16's batches at a length is its share of the tokens, and so is the corpus's
    tokens = np.cumsum(np.maximum(src, tgt)[order])
    middles = (np.arange(BLOCKS) + 0.5) / BLOCKS * tokens[-LAST_BLOCK]
    ends = np.searchsorted(tokens, [(m - BLOCK_TOKENS / 2, m + BLOCK_TOKENS / 2) for m in middles])
    picked = np.concatenate([*(order[a:b] for a, b in ends), order[-LAST_BLOCK:]])
    copies = max(1, round(pairs / len(picked)))
    return np.tile(src[picked], copies), np.tile(tgt[picked], copies)


def fill(src: np.ndarray, tgt: np.ndarray, max_tokens: int, seed: int = 1) -> float:
    """Target tokens over max_tokens x batches, batched as fairseq-train does (fairseq's own
    data_utils.batch_by_size over ordered_indices; a token counts max(source, target) of a pair)."""
    from fairseq.data import data_utils

    order = fairseq_order(src, tgt, seed)
    per_pair = np.maximum(src, tgt)
    batches = data_utils.batch_by_size(order, num_tokens_fn=lambda i: per_pair[i], max_tokens=max_tokens,
                                       required_batch_size_multiple=MULTIPLE, num_tokens_vec=per_pair[order])
    return float(tgt.sum()) / (len(batches) * max_tokens)


def build(subwords: Path, out: Path, pairs: int, seed: int = 1) -> dict:
    """Write out/{train,valid,test}.{en,de}: `pairs` training pairs of WMT16's lengths (see the module),
    the sample's valid and test as they are."""
    src, tgt = lengths(subwords, pairs, seed)
    rng = np.random.default_rng(seed + 1)
    out.mkdir(parents=True, exist_ok=True)
    for lang, want in (("en", src), ("de", tgt)):
        stream = (subwords / f"train.{lang}").read_text().split()
        starts = rng.integers(0, len(stream), size=len(want))
        doubled = stream + stream  # a line may read on past the end
        with open(out / f"train.{lang}", "w") as f:
            for start, n in zip(starts.tolist(), (want - 1).tolist(), strict=True):
                f.write(" ".join(doubled[start:start + n]) + "\n")
        for split in ("valid", "test"):
            shutil.copy2(subwords / f"{split}.{lang}", out / f"{split}.{lang}")
    return {"pairs": len(src), "longest": [int(src.max()), int(tgt.max())], "mean_target": float(tgt.mean())}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="what", required=True)
    b = sub.add_parser("build", help="write the corpus's text (then fairseq-preprocess it)")
    b.add_argument("--subwords", type=Path, required=True, help="the sample's subwords (kit/subwords)")
    b.add_argument("--out", type=Path, required=True)
    b.add_argument("--pairs", type=int, required=True)
    b.add_argument("--seed", type=int, default=1)
    f = sub.add_parser("fill", help="the fill of the repeated sample and of this corpus (fairseq's batching)")
    f.add_argument("--subwords", type=Path, required=True)
    f.add_argument("--max-tokens", default="4096,26985,32768,57344")
    f.add_argument("--repeats", default="12,30")
    h = sub.add_parser("histogram", help="the source-length shares of a prepared corpus's subwords")
    h.add_argument("subwords", type=Path)
    a = p.parse_args(argv)
    if a.what == "build":
        print(build(a.subwords, a.out, a.pairs, a.seed))
    elif a.what == "histogram":
        for n, share in histogram(a.subwords).items():
            print(f"{n}\t{share:.6f}")
    else:
        tokens = [int(x) for x in a.max_tokens.split(",")]
        src, tgt = sizes(a.subwords / "train.en"), sizes(a.subwords / "train.de")
        print("corpus                         pairs      " + "  ".join(f"{t:>7,}" for t in tokens))
        rows = [(f"sample x{r}", np.tile(src, r), np.tile(tgt, r)) for r in map(int, a.repeats.split(","))]
        rows += [(f"WMT16-shaped, {r} x sample", *lengths(a.subwords, r * len(src)))
                 for r in map(int, a.repeats.split(","))]
        rows.append(("WMT16's lengths, full size", *full_size(a.subwords)))
        for name, s, t in rows:
            print(f"{name:28s} {len(s):9,}  " + "  ".join(f"{fill(s, t, m):7.3f}" for m in tokens), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
