"""The stage runner: prepare-data on the machine that does the work, its progress as lines.

    python -m train.data WORK NAME [--source DIR | --wmt16 | --lines N] [--vocab-size V] [--progress lines|bars]

Prints `@@tandem-progress {...}` lines (progress.Lines) that a controller draws (progress.render),
then one `@@tandem-result {...}` line: the Corpus and each stage's seconds and peak memory.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import corpus, download, progress
from .stages import Stages

RESULT = "@@tandem-result "


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m train.data")
    parser.add_argument("work", type=Path)
    parser.add_argument("name")
    parser.add_argument("--source", type=Path)
    parser.add_argument("--wmt16", action="store_true")
    parser.add_argument("--lines", type=int, default=20000, help="synthetic corpus: training pairs")
    parser.add_argument("--vocab-size", type=int, default=32000)
    parser.add_argument("--progress", choices=("lines", "bars", "none"), default="lines")
    args = parser.parse_args(argv)
    report = {"lines": progress.Lines, "bars": progress.Bars, "none": progress.Silent}[args.progress]()
    try:
        prepared = corpus.prepare(args.name, args.work, source=args.source, wmt16=args.wmt16,
                                  vocab_size=args.vocab_size, synthetic_train=args.lines, report=report)
    except (corpus.DataError, download.DownloadError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    finally:
        report.close()
    result = {"corpus": prepared.as_dict(), "stages": Stages(args.work / args.name).timings()}
    print(RESULT + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
