"""Subword text to the binary dataset fairseq-train reads (its mmap format), streamed in batches of
lines on every core. The joined dictionary is sentencepiece's own vocabulary in sentencepiece's
order, so there is no counting pass: fairseq-preprocess reads the corpus twice with Python per
token (554 s of the 979 s pipeline at 1M pairs on two cores, ~40 minutes at WMT16's 4.56M).
The files are fairseq-preprocess's: {split}.en-de.{lang}.bin/.idx, dict.en.txt = dict.de.txt."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from .parallel import ordered_map
from .progress import Silent

PADDING_FACTOR = 8  # fairseq-preprocess's default: the embedding's rows a multiple of 8 (tensor cores)


def dictionary(model: Path):
    """fairseq's Dictionary of the sentencepiece model's pieces (its control and unknown pieces are
    fairseq's own specials), padded as fairseq-preprocess pads it; counts filled in by `write`."""
    import sentencepiece as spm
    from fairseq.data import Dictionary

    sp = spm.SentencePieceProcessor(model_file=str(model))
    vocab = Dictionary()
    for i in range(sp.get_piece_size()):
        if not (sp.is_control(i) or sp.is_unknown(i) or sp.is_unused(i)):
            vocab.add_symbol(sp.id_to_piece(i), n=0)
    vocab.pad_to_multiple_(PADDING_FACTOR)
    return vocab


class _Index(dict):
    """piece -> id; a piece sentencepiece could not place (a character its sample never had) is unk."""

    unk = 3

    def __missing__(self, piece):
        return self.unk


def _encode(job: tuple[list[str], _Index, int, str, int]) -> tuple[bytes, list[int], np.ndarray]:
    """One batch of lines: their ids (and end of sentence) as bytes, each line's length, the ids' counts."""
    lines, index, eos, dtype, size = job
    ids: list[int] = []
    lengths = []
    for line in lines:
        pieces = line.split()
        ids.extend(map(index.__getitem__, pieces))
        ids.append(eos)
        lengths.append(len(pieces) + 1)
    array = np.array(ids, dtype=dtype)
    return array.tobytes(), lengths, np.bincount(array, minlength=size)


def _batches(path: Path, size: int) -> Iterator[list[str]]:
    with open(path, encoding="utf-8") as f:
        while batch := list(itertools.islice(f, size)):
            yield batch


def write(sub_dir: Path, bin_dir: Path, model: Path, splits: tuple[str, ...], langs: tuple[str, ...],
          batch_lines: int, workers: int = 1, report: Silent | None = None, total_lines: int | None = None) -> int:
    """Every {split}.{lang} of `sub_dir` (pieces, one line a sentence) into `bin_dir` as
    {split}.{langs[0]}-{langs[1]}.{lang}.bin/.idx, and the joined dictionary as dict.{lang}.txt;
    returns the dictionary's size. Memory: a few batches of lines and each file's line lengths."""
    report = report or Silent()
    report.start("binarize", total=total_lines, unit="lines")  # before fairseq's import: seconds of torch
    from fairseq.data.indexed_dataset import MMapIndexedDataset, best_fitting_int_dtype

    vocab = dictionary(model)
    index = _Index((vocab[i], i) for i in range(len(vocab)))
    index.unk = vocab.unk()
    dtype = np.dtype(best_fitting_int_dtype(len(vocab))).name
    counts = np.zeros(len(vocab), dtype=np.int64)
    bin_dir.mkdir(parents=True, exist_ok=True)
    pair = "-".join(langs)
    for split in splits:
        for lang in langs:
            stem = bin_dir / f"{split}.{pair}.{lang}"
            lengths: list[int] = []
            jobs = ((batch, index, vocab.eos(), dtype, len(vocab))
                    for batch in _batches(sub_dir / f"{split}.{lang}", batch_lines))
            with open(f"{stem}.bin", "wb") as data:
                for ids, batch_lengths, batch_counts in ordered_map(_encode, jobs, workers):
                    data.write(ids)
                    lengths.extend(batch_lengths)
                    if split == splits[0]:  # fairseq-preprocess's counts are the training set's
                        counts += batch_counts
                    report.advance(len(batch_lengths))
            with MMapIndexedDataset.Index.writer(f"{stem}.idx", np.dtype(dtype).type) as idx:
                idx.write(lengths)
    vocab.count = [int(c) for c in counts]
    for lang in langs:
        vocab.save(str(bin_dir / f"dict.{lang}.txt"))
    report.finish()
    return len(vocab)
