"""The WMT test sets as the dev archive ships them: SGML, one `<seg id="N">text</seg>` a line.

Read as SacreBLEU reads them (the text between the tags, whitespace runs made one space, no
entity unescaping), so that a reference taken from here is the one published scores used.
"""

from __future__ import annotations

import re
from pathlib import Path

SEGMENT = re.compile(r"<seg.*?>(.*)</seg>.*?")


class SgmlError(ValueError):
    pass


def segments(path: Path) -> list[str]:
    """The segments of one .sgm file, in order (a test set: a few thousand lines)."""
    found = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            match = SEGMENT.match(line) if line.startswith("<seg ") else None
            if match:
                found.append(re.sub(r"\s+", " ", match.group(1)).strip())
    if not found:
        raise SgmlError(f"{path}: no <seg> lines: not a WMT SGML file")
    return found


def to_text(path: Path, dest: Path) -> int:
    """Write `path`'s segments one a line into `dest`; returns how many."""
    lines = segments(path)
    dest.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return len(lines)
