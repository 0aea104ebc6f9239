"""benchmarks/wmt16_shape.py: a benchmark corpus whose batches are WMT16's, whatever REPEAT sizes it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from benchmarks import gpu_kit, wmt16_shape
from train.plan import batch

SAMPLE = gpu_kit.SAMPLE


@pytest.fixture(scope="module")
def subwords(tmp_path_factory) -> Path:
    """tandem's 32k subwords of the shared sample, as `make gpu-kit` puts them in kit/subwords."""
    if not (SAMPLE / "train.en").exists():
        pytest.skip(f"no shared sample at {SAMPLE}")
    return gpu_kit.subwords(tmp_path_factory.mktemp("kit"), SAMPLE) / "subwords"


def test_the_fill_no_longer_follows_repeat_and_is_wmt16_s(subwords):
    """Big's 26,985 max_tokens batched by fairseq's own batch_by_size: the repeated sample fills 0.74
    of its batches at REPEAT=12 and 0.84 at 30; the shaped corpus is the same at both, within 3% of
    WMT16's lengths at full size (4.56M pairs)."""
    src, tgt = wmt16_shape.sizes(subwords / "train.en"), wmt16_shape.sizes(subwords / "train.de")
    sample = {r: wmt16_shape.fill(np.tile(src, r), np.tile(tgt, r), 26985) for r in (12, 30)}
    assert sample[30] - sample[12] > 0.05, sample
    shaped = {r: wmt16_shape.fill(*wmt16_shape.lengths(subwords, r * len(src)), 26985) for r in (12, 30)}
    full = wmt16_shape.fill(*wmt16_shape.full_size(subwords), 26985)
    assert shaped[12] == shaped[30] and abs(shaped[12] / full - 1) < 0.03, (shaped, full)


def test_the_corpus_holds_wmt16_s_longest_pairs_and_its_lines_are_their_lengths(subwords, tmp_path):
    """The sample stops at 99/87 subwords; the memory peak comes with the longest batch a run of WMT16
    meets, 400 a side (train.plan.batch.WMT16_LONGEST): the corpus has it, line for line."""
    made = wmt16_shape.build(subwords, tmp_path, pairs=1)
    src, tgt = wmt16_shape.lengths(subwords, 1)
    assert made["longest"] == list(batch.WMT16_LONGEST) and made["pairs"] == len(src)
    assert (wmt16_shape.sizes(tmp_path / "train.en") == src).all() and (wmt16_shape.sizes(tmp_path / "train.de")
                                                                         == tgt).all()
    assert {p.name for p in tmp_path.iterdir()} == {f"{s}.{lang}" for s in ("train", "valid", "test")
                                                    for lang in ("en", "de")}
