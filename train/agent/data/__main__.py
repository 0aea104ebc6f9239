"""The stage runner: prepare-data on the host that does the work (rank 0's), its progress as lines.

    python -m train.agent.data WORK NAME [--source DIR | --wmt16 | --lines N] [--vocab-size V]
                               [--publish DIR] [--host NAME] [--mirror URL] [--progress lines|none]

Prints `@@tandem-progress {...}` lines (progress.Lines) that the controller draws
(train/data/progress.py), then one `@@tandem-result {...}` line: the Corpus, each stage's seconds
and peak memory, and the published dataset's manifest checksum. `--publish DIR`: the binaries
put in DIR whole (copied beside it, then renamed in), where training reads them; a DIR that
already holds the same manifest is left as it is.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

from . import corpus, download, progress
from .stages import Stages

RESULT = "@@tandem-result "


def manifest_sum(directory: Path) -> str | None:
    manifest = directory / "MANIFEST.sha256"
    return hashlib.sha256(manifest.read_bytes()).hexdigest() if manifest.exists() else None


def markers(root: Path) -> dict[str, int]:
    """{stage: its marker's modification time}: which stages a run built, which it found done."""
    return {p.name[1:-len(".done")]: p.stat().st_mtime_ns for p in sorted(root.glob(".*.done"))}


def publish(bin_dir: Path, dest: Path) -> bool:
    """`bin_dir` at `dest`, whole: training never sees half a dataset. False: it was there already."""
    if dest.exists() and manifest_sum(dest) == manifest_sum(bin_dir):
        return False
    incoming, old = dest.with_name(f".{dest.name}.incoming"), dest.with_name(f".{dest.name}.old")
    shutil.rmtree(incoming, ignore_errors=True)
    shutil.rmtree(old, ignore_errors=True)
    shutil.copytree(bin_dir, incoming)
    if dest.exists():
        os.rename(dest, old)
    os.rename(incoming, dest)
    shutil.rmtree(old, ignore_errors=True)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m train.agent.data")
    parser.add_argument("work", type=Path)
    parser.add_argument("name")
    parser.add_argument("--source", type=Path)
    parser.add_argument("--wmt16", action="store_true")
    parser.add_argument("--lines", type=int, default=20000, help="synthetic corpus: training pairs")
    parser.add_argument("--vocab-size", type=int, default=32000)
    parser.add_argument("--publish", type=Path, help="put the binaries here, whole, when done")
    parser.add_argument("--host", help="this host's name in messages (the inventory's)")
    parser.add_argument("--mirror", help="a WMT16 mirror's URL instead of statmt.org's (the lab's rehearsal)")
    parser.add_argument("--progress", choices=("lines", "none"), default="lines")
    args = parser.parse_args(argv)
    if args.mirror:
        os.environ["TANDEM_WMT16_MIRROR"] = args.mirror
    report = progress.Lines() if args.progress == "lines" else progress.Silent()
    before = markers(args.work / args.name)
    try:
        prepared = corpus.prepare(args.name, args.work, source=args.source, wmt16=args.wmt16,
                                  vocab_size=args.vocab_size, synthetic_train=args.lines, report=report,
                                  host=args.host)
        published = publish(Path(prepared.bin_dir), args.publish) if args.publish else False
    except (corpus.DataError, download.DownloadError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    finally:
        report.close()
    after = markers(args.work / args.name)
    result = {"corpus": prepared.as_dict(), "stages": Stages(args.work / args.name).timings(),
              "built": [stage for stage, stamp in after.items() if before.get(stage) != stamp],
              "manifest": manifest_sum(Path(prepared.bin_dir)), "published": published,
              "bytes": sum(f.stat().st_size for f in Path(prepared.bin_dir).rglob("*") if f.is_file())}
    print(RESULT + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
