"""`fab prepare-data`: the corpus prepared on rank 0's host (the first of --hosts), then copied host to
host to the others; the controller sends the commands and draws the progress the host prints.

    controller ── ssh: python -m train.agent.data ──▶ rank 0's host: download, clean, subwords, binarize,
                                                      publish to /data/tandem/datasets/NAME
               ── ssh: rsync over the cluster key ──▶ rank 0's host ──▶ every other host
               ── ssh: sha256sum -c MANIFEST ───────▶ every host

Nothing large crosses the controller's link: a corpus of its own (--source DIR) is uploaded once, to
rank 0's host; the controller counts what its own connections carried and prints it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path

from ..agent.data import corpus
from ..agent.data.__main__ import RESULT
from ..cluster import ClusterError, Host, connect
from ..hosts.paths import DATA_ROOT
from ..hosts.remote import venv_of
from . import distribute, progress

WORK = str(Path(DATA_ROOT).parent / "prepare")  # rank 0's host: downloads and the resumable stages
SOURCES = str(Path(DATA_ROOT).parent / "sources")  # rank 0's host: --source corpora, uploaded once


def default_name(source: str | None, wmt16: bool) -> str:
    return "wmt16" if wmt16 else Path(source).name if source else "synthetic"


def check_name(name: str) -> str:
    """A dataset's name is a directory on every host, written into shell commands and rsync's remote
    path (which macOS's rsync passes to the host's shell as it is): letters, digits, '.', '_', '-'."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        raise ClusterError(f"dataset name {name!r}: letters, digits, '.', '_' and '-' only "
                           "(it names a directory on every host): give one with --name")
    return name


class _LiveLines:
    """Fabric's out_stream: the host's output split into lines, drawn as they come."""

    def __init__(self, bars: progress.Bars, console):
        self.bars, self.console, self.pending, self.result, self.received = bars, console, "", None, 0
        self.said: list[str] = []  # the lines that are not progress (an error's explanation)

    def write(self, text: str) -> None:
        self.received += len(text.encode())
        self.pending += text
        *lines, self.pending = self.pending.split("\n")
        for line in (line.rstrip("\r") for line in lines):  # a pty ends lines with \r\n
            event = progress.parse(line)
            if event is not None:
                self.bars.show(event)
            elif line.startswith(RESULT):
                self.result = json.loads(line[len(RESULT):])
            elif line.strip():
                self.said.append(line)
                self.console.print(line, markup=False, highlight=False)

    def flush(self) -> None:
        pass


def run_on_host(host: Host, args: list[str], console) -> tuple[dict, int]:
    """The stage runner on `host`, its progress drawn live. Returns its result and the bytes it sent us.
    On a pty: Ctrl-C here reaches the runner there (Fabric sends it), which stops where it is, leaving
    the stages it finished for the next run."""
    command = shlex.join([f"{venv_of(host)}/bin/python", "-m", "train.agent.data", *args])
    bars = progress.Bars(console, host.name)
    live = _LiveLines(bars, console)
    try:
        with connect(host) as conn:
            done = conn.run(command, out_stream=live, warn=True, pty=True)
    finally:
        bars.close()
    if done.exited != 0 or live.result is None:
        said = "\n".join(live.said[-20:])
        raise ClusterError(f"{host.name}: preparing the dataset failed (exit {done.exited}): {said[-1500:]}")
    return live.result, live.received + len(command)


def prepare_data(hosts: list[Host], console, name: str | None = None, source: str | None = None,
                 wmt16: bool = False, vocab_size: int | None = None, lines: int = 20000) -> None:
    """Prepare on rank 0's host into /data/tandem/datasets/NAME, copy host to host to every other host,
    and check each copy against its manifest."""
    name = check_name(name or default_name(source, wmt16))
    vocab = int(vocab_size or (32000 if (wmt16 or source) else 1000))
    rank0, peers = hosts[0], hosts[1:]
    controller_bytes = 0
    args = [WORK, name, "--vocab-size", str(vocab), "--publish", f"{DATA_ROOT}/{name}", "--host", rank0.name]
    if source:
        try:  # a broken corpus is refused here, in one line naming the file, before anything is uploaded
            corpus.check_raw(corpus.raw_from_directory(Path(source).expanduser()))
        except corpus.DataError as err:
            raise ClusterError(str(err)) from None
        remote_source = f"{SOURCES}/{name}"
        with console.status(f"uploading {source} to {rank0.name} (once; the other hosts get it from there)"):
            controller_bytes += distribute.upload_source(Path(source).expanduser(), rank0, remote_source + "/")
        args += ["--source", remote_source]
    elif wmt16:
        args += ["--wmt16"]
        if os.environ.get("TANDEM_WMT16_MIRROR"):  # the lab's rehearsal mirror, reached from the hosts
            args += ["--mirror", os.environ["TANDEM_WMT16_MIRROR"]]
    else:
        args += ["--lines", str(int(lines))]
    console.print(f"preparing {name} on {rank0.name} (rank 0's host): vocabulary {vocab}")
    result, received = run_on_host(rank0, args, console)
    controller_bytes += received
    prepared = result["corpus"]
    console.print(f"[green]✓[/] {name} on {rank0.name}: {prepared['train_lines']:,} training pairs, "
                  f"{prepared['train_mb']} MB of text, vocabulary {prepared['vocab_size']}"
                  + ("" if result["published"] else " (unchanged)"))
    order = ["raw", "text", "spm", "subwords", "bin"]
    built = sorted(result["built"], key=order.index)
    console.print(f"stages built now: {', '.join(built) or 'none'}; already done: "
                  f"{', '.join(s for s in order if s in result['stages'] and s not in built) or 'none'}")
    if prepared.get("vocab_note"):
        console.print(f"[yellow]note:[/] {prepared['vocab_note']}")
    if peers:
        have = distribute.manifests(peers, name)
        stale = [p for p in peers if have[p.name] != result["manifest"]]
        if stale:
            distribute.check_receivers_disk(stale, int(result["bytes"] * 1.1))
            console.print(f"copying {result['bytes'] / 1e6:.1f} MB host to host: {rank0.name} → "
                          f"{', '.join(p.name for p in stale)}")
            with distribute.copy_progress(console, rank0, stale, name, result["bytes"]):
                distribute.spread(rank0, stale, name)
        else:
            console.print(f"every host already holds this {name}: nothing copied")
    sums = distribute.check_copies(hosts, name)
    console.print(f"[green]✓[/] identical on every host ({', '.join(sums)}): manifest "
                  f"{next(iter(sums.values()))[:12]}, at {DATA_ROOT}/{name}")
    console.print(f"through the controller: {controller_bytes / 1e3:.0f} kB of the runner's output and uploads "
                  f"(the dataset: {result['bytes'] / 1e6:.1f} MB, copied host to host)")
