"""prepare-data in constant memory: the streaming stages (clean, subwords applied, check, manifest)
hold a few batches of lines, never a split. Measured with tracemalloc (Python's own allocations,
none of the interpreter's baseline) at two corpus sizes: 4x the lines, the same peak. A stage that
reads a whole split into lists grows 4x here, as it grew to ~30 GB at WMT16's 4.56M pairs."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest

from train.agent.data import check, corpus, download, synthetic

BATCH = 250  # lines a batch here (CHUNK_LINES is 20,000: a split of this test would fit in one)
SMALL, LARGE = 2_000, 8_000


@pytest.fixture(scope="module")
def pairs():
    return synthetic.generate_pairs(400, seed=7)


def write_split(directory: Path, pairs, lines: int) -> dict[str, Path]:
    """train/valid/test of `lines` pairs (the 400 sentences repeated), returned as {lang: train file}."""
    directory.mkdir(parents=True)
    for split in corpus.SPLITS:
        for lang, column in (("en", 0), ("de", 1)):
            count = lines if split == "train" else 50
            (directory / f"{split}.{lang}").write_text(
                "".join(pairs[i % len(pairs)][column] + "\n" for i in range(count)), encoding="utf-8")
    return {lang: directory / f"train.{lang}" for lang in corpus.LANGS}


def peak_kib(stage) -> float:
    tracemalloc.start()
    try:
        stage()
        return tracemalloc.get_traced_memory()[1] / 1024
    finally:
        tracemalloc.stop()


def streaming_peaks(tmp_path: Path, pairs, lines: int, model: Path) -> dict[str, float]:
    raw = write_split(tmp_path / f"raw-{lines}", pairs, lines)
    text, sub = tmp_path / f"text-{lines}", tmp_path / f"sub-{lines}"
    text.mkdir()

    def clean():
        for split in corpus.SPLITS:
            corpus.clean_split({lang: raw[lang].with_name(f"{split}.{lang}") for lang in corpus.LANGS},
                               text, split, filter_pairs=split == "train")

    peaks = {"check": peak_kib(lambda: check.check_parallel(raw, "train")), "clean": peak_kib(clean),
             "subwords": peak_kib(lambda: corpus.apply_subwords(model, text, sub, threads=1))}
    peaks["manifest"] = peak_kib(lambda: corpus.write_manifest(sub))
    return peaks


def test_the_streaming_stages_peak_the_same_at_four_times_the_corpus(tmp_path, pairs, monkeypatch):
    monkeypatch.setattr(corpus, "CHUNK_LINES", BATCH)
    monkeypatch.setattr(download, "CHUNK", 64 * 1024)  # the manifest's read size (1 MiB: a file here is less)
    first = write_split(tmp_path / "learn", pairs, 400)
    model = corpus.learn_subwords(first["en"].parent, tmp_path / "spm", vocab_size=300, threads=1)
    small = streaming_peaks(tmp_path, pairs, SMALL, model)
    large = streaming_peaks(tmp_path, pairs, LARGE, model)
    for stage in small:
        # a whole split of LARGE lines is ~0.5 MB of str objects: 4x the lines must not move the peak
        assert large[stage] < small[stage] * 1.25 + 32, (
            f"{stage}: peak {small[stage]:.0f} KiB at {SMALL:,} pairs, {large[stage]:.0f} KiB at {LARGE:,}")
