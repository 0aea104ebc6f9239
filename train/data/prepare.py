"""`fab prepare-data`: a corpus cleaned, subworded and binarized, then identical on every host."""

from __future__ import annotations

import os
import re
from pathlib import Path

from ..cluster import ClusterError, Host
from ..run.record import DATA_ROOT
from . import corpus, distribute, download


def default_name(source: str | None, wmt16: bool) -> str:
    return "wmt16" if wmt16 else Path(source).name if source else "synthetic"


def check_name(name: str) -> str:
    """A dataset's name is a directory on every host, written into shell commands and rsync's remote
    path (which macOS's rsync passes to the host's shell as it is): letters, digits, '.', '_', '-'."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        raise ClusterError(f"dataset name {name!r}: letters, digits, '.', '_' and '-' only "
                           "(it names a directory on every host): give one with --name")
    return name


def prepare_data(hosts: list[Host], console, name: str | None = None, source: str | None = None,
                 wmt16: bool = False, vocab_size: int | None = None, lines: int = 20000) -> None:
    """Prepare the corpus in the controller's cache ($TANDEM_CACHE/data), then copy it to
    /data/tandem/datasets/NAME on every host and check each copy against its manifest."""
    name = check_name(name or default_name(source, wmt16))
    vocab = int(vocab_size or (32000 if (wmt16 or source) else 1000))
    work = Path(os.environ.get("TANDEM_CACHE", Path.home() / ".cache/tandem")) / "data"
    try:
        if wmt16:  # first, with a progress bar per archive: not under the spinner below
            corpus.download_wmt16(work / "downloads")
        with console.status(f"preparing {name}: clean, sentencepiece ({vocab}), fairseq-preprocess"):
            prepared = corpus.prepare(name, work, source=Path(source) if source else None, wmt16=wmt16,
                                      vocab_size=vocab, synthetic_train=int(lines))
    except (corpus.DataError, download.DownloadError) as err:
        raise ClusterError(str(err)) from err
    console.print(f"[green]✓[/] {name}: {prepared.train_lines:,} training pairs, {prepared.train_mb} MB of text, "
                  f"vocabulary {prepared.vocab_size}")
    if prepared.vocab_note:
        console.print(f"[yellow]note:[/] {prepared.vocab_note}")
    with console.status(f"copying to {', '.join(h.name for h in hosts)} and checking checksums"):
        sums = distribute.upload(Path(prepared.bin_dir), name, hosts)
    console.print(f"[green]✓[/] identical on every host ({', '.join(sums)}): manifest "
                  f"{next(iter(sums.values()))[:12]}, at {DATA_ROOT}/{name}")
