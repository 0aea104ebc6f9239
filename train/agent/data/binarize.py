"""Subword text to the binary dataset fairseq-train reads (its mmap format), streamed in batches of
lines on every core. The joined dictionary is sentencepiece's own vocabulary in sentencepiece's
order, so there is no counting pass: fairseq-preprocess reads the corpus twice with Python and a
tensor per line (554 s of the 979 s pipeline at 1M pairs on two cores, ~40 minutes at WMT16's
4.56M). The files are fairseq-preprocess's: {split}.en-de.{lang}.bin/.idx, dict.en.txt = dict.de.txt.

torch (fairseq) is imported only once the workers are done: a worker forked from a parent that
holds it copies the pages its garbage collector touches, ~200 MB each on an 8-core host."""

from __future__ import annotations

import itertools
from array import array
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from .parallel import ordered_map
from .progress import Silent

# fairseq's Dictionary: these four first, in this order (fairseq/data/dictionary.py), then the
# words of dict.txt; fairseq-preprocess pads it to a multiple of 8 (the embedding's rows: tensor cores)
SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")
EOS, UNK = SPECIALS.index("</s>"), SPECIALS.index("<unk>")
PADDING_FACTOR = 8


def vocabulary(model: Path) -> list[str]:
    """The symbols of the joined dictionary: fairseq's specials, the sentencepiece model's pieces
    (its own control and unknown pieces are fairseq's specials), fairseq's padding."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(model))
    symbols = list(SPECIALS)
    symbols += [sp.id_to_piece(i) for i in range(sp.get_piece_size())
                if not (sp.is_control(i) or sp.is_unknown(i) or sp.is_unused(i)) and sp.id_to_piece(i) not in SPECIALS]
    symbols += [f"madeupword{i:04d}" for i in range(-len(symbols) % PADDING_FACTOR)]
    return symbols


class _Index(dict):
    """piece -> id; a piece sentencepiece could not place (a character its sample never had) is unk."""

    def __missing__(self, piece):
        return UNK


def _encode(job: tuple[list[str], _Index, str, int]) -> tuple[bytes, array, np.ndarray]:
    """One batch of lines: their ids (and end of sentence) as bytes, each line's length, the ids' counts."""
    lines, index, dtype, size = job
    ids: list[int] = []
    lengths = array("I")
    for line in lines:
        pieces = line.split()
        ids.extend(map(index.__getitem__, pieces))
        ids.append(EOS)
        lengths.append(len(pieces) + 1)
    encoded = np.array(ids, dtype=dtype)
    return encoded.tobytes(), lengths, np.bincount(encoded, minlength=size)


def _batches(path: Path, size: int) -> Iterator[list[str]]:
    with open(path, encoding="utf-8") as f:
        while batch := list(itertools.islice(f, size)):
            yield batch


def write(sub_dir: Path, bin_dir: Path, model: Path, splits: tuple[str, ...], langs: tuple[str, ...],
          batch_lines: int, workers: int = 1, report: Silent | None = None, total_lines: int | None = None) -> int:
    """Every {split}.{lang} of `sub_dir` (pieces, one line a sentence) into `bin_dir` as
    {split}.{langs[0]}-{langs[1]}.{lang}.bin/.idx, and the joined dictionary as dict.{lang}.txt;
    returns the dictionary's size. Memory: a few batches of lines, and 4 bytes a sentence for the index."""
    report = report or Silent()
    report.start("binarize", total=total_lines, unit="lines")
    symbols = vocabulary(model)
    index = _Index((s, i) for i, s in enumerate(symbols))
    dtype = "uint16" if len(symbols) < 65500 else "uint32"  # fairseq's best_fitting_int_dtype
    counts = np.zeros(len(symbols), dtype=np.int64)
    bin_dir.mkdir(parents=True, exist_ok=True)
    pair = "-".join(langs)
    lengths: dict[str, array] = {}
    for split in splits:
        for lang in langs:
            stem = f"{split}.{pair}.{lang}"
            lengths[stem] = array("I")
            jobs = ((batch, index, dtype, len(symbols)) for batch in _batches(sub_dir / f"{split}.{lang}", batch_lines))
            with open(bin_dir / f"{stem}.bin", "wb") as data:
                for ids, batch_lengths, batch_counts in ordered_map(_encode, jobs, workers):
                    data.write(ids)
                    lengths[stem].extend(batch_lengths)
                    if split == splits[0]:  # fairseq-preprocess's counts are the training set's
                        counts += batch_counts
                    report.advance(len(batch_lengths))
    from fairseq.data.indexed_dataset import MMapIndexedDataset  # the workers are done: see the docstring

    for stem, sizes in lengths.items():
        with MMapIndexedDataset.Index.writer(str(bin_dir / f"{stem}.idx"), np.dtype(dtype).type) as idx:
            idx.write(sizes.tolist())  # Python ints: fairseq sums the pointers with them
    words = "".join(f"{symbol} {count}\n" for symbol, count in zip(symbols[len(SPECIALS):],
                                                                     counts[len(SPECIALS):].tolist(), strict=True))
    for lang in langs:
        (bin_dir / f"dict.{lang}.txt").write_text(words, encoding="utf-8")
    report.finish()
    return len(symbols)
