"""A parallel corpus checked before anything is made from it: every problem is one line that
names the file, the line where there is one, and what is wrong.

Checked: each side exists and is not empty, it is valid UTF-8 (a replaced byte would become
U+FFFD in the vocabulary and on every host), and both sides have the same number of lines.
"""

from __future__ import annotations

from pathlib import Path


class CorpusError(ValueError):
    """A corpus that must not be prepared; str() is the one line the user sees."""


def count_utf8_lines(path: Path) -> int:
    """Lines in the file; raises CorpusError at the first one that is not UTF-8 (file:line: column)."""
    lines = 0
    with open(path, "rb") as f:
        for lines, raw in enumerate(f, start=1):  # noqa: B007 - the count is the result
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise CorpusError(f"{path}:{lines}: not UTF-8 (byte 0x{raw[err.start]:02x} at column "
                                  f"{err.start + 1}): convert the file, e.g. iconv -f latin1 -t utf-8") from None
    return lines


def check_parallel(files: dict[str, Path], split: str) -> int:
    """{lang: path} of one split -> its line count, or CorpusError."""
    counts = {}
    for lang, path in files.items():
        counts[lang] = count_utf8_lines(path)
        if counts[lang] == 0:
            raise CorpusError(f"{path}: empty: the {split} split needs one sentence per line")
    (a, n_a), (b, n_b) = counts.items()
    if n_a != n_b:
        raise CorpusError(f"{files[a]}: {n_a} lines but {files[b]} has {n_b}: the two sides of {split} must be "
                          f"line-aligned (line i of one translates line i of the other)")
    return n_a


def vocabulary_note(made: int, asked: int, train_lines: int) -> str:
    """'' when sentencepiece made the vocabulary asked for, else what happened and what to do."""
    if made >= asked:
        return ""
    return (f"vocabulary {made} of the {asked} asked: {train_lines:,} training pairs do not hold enough distinct "
            f"subwords for more; pass --vocab-size {made} (or less) to say so, or give a larger corpus")
