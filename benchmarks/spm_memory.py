"""sentencepiece's learning memory against its sample: the one prepare-data stage whose peak does not
stream (it holds its sample's sentences and their suffix array). Learns a 32k joint vocabulary from
a corpus of PAIRS pairs (the shared sample's sentences repeated to size) with each sample size, each
in a fresh process, and prints its peak resident memory and time.

    python -m benchmarks.spm_memory --pairs 1000000 --samples 1000000 500000 300000
"""

from __future__ import annotations

import argparse
import itertools
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.wmt16_mirror import SAMPLE

LEARN = """
import sys
from pathlib import Path
from train.agent.data import corpus
corpus.learn_subwords(Path(sys.argv[1]), Path(sys.argv[2]) / "spm", 32000, sample=int(sys.argv[3]))
"""


def write_text(out: Path, pairs: int, sample: Path = SAMPLE) -> None:
    for lang in ("en", "de"):
        lines = (sample / f"train.{lang}").read_text(encoding="utf-8").splitlines(keepends=True)
        with open(out / f"train.{lang}", "w", encoding="utf-8") as f:
            f.writelines(itertools.islice(itertools.cycle(lines), pairs))


def measure(text: Path, sample: int) -> tuple[float, float]:
    """(seconds, peak MB) of one learning in a child process."""
    with tempfile.TemporaryDirectory() as model:
        started = time.monotonic()
        subprocess.run([sys.executable, "-c", LEARN, str(text), model, str(sample)], check=True)
        seconds = time.monotonic() - started
    return seconds, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=1_000_000)
    parser.add_argument("--samples", type=int, nargs="+", default=[1_000_000, 500_000, 300_000])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        write_text(Path(tmp), args.pairs)
        mb = sum(p.stat().st_size for p in Path(tmp).iterdir()) / 1e6
        print(f"{args.pairs:,} pairs, {mb:.0f} MB of text")
        for sample in sorted(args.samples):  # ascending: RUSAGE_CHILDREN's maximum is the latest child's
            seconds, peak = measure(Path(tmp), sample)
            print(f"  sample {sample:>9,} sentences: {seconds:6.1f} s, peak {peak:6.0f} MB", flush=True)


if __name__ == "__main__":
    main()
