"""prepare-data: corpus → clean text → joint subword vocabulary → fairseq binaries.

Every stage streams: its memory does not grow with the corpus (WMT16 en-de is 4.56M pairs,
1.35 GB of text), and every stage uses every core of the machine doing it. The stages
(`stages.Stages`) are resumable: each is built under a temporary name and renamed when done
beside a marker of its inputs; a re-run continues from the last finished one and a re-run that
changes nothing does nothing. Sources:
- the WMT16 en→de corpora (`WMT16`: Europarl v7, Common Crawl, News Commentary v11 to train;
  newstest2013 to validate and newstest2014 to test, parsed from the dev archive's SGML, the
  test set every published en-de figure is on), downloaded resumably with checksums;
  $TANDEM_WMT16_MIRROR replaces the servers (the lab's rehearsal mirror);
- a local directory with {train,valid,test}.{en,de} (`--source DIR`);
- the synthetic corpus (`synthetic.py`): the lab's and the demo's default.
"""

from __future__ import annotations

import fcntl
import functools
import itertools
import json
import os
import re
import shutil
import socket
import sys
import unicodedata
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from . import binarize as binary
from . import check, download, sgml, synthetic
from .parallel import cores, ordered_map
from .progress import Silent
from .stages import Stages, key_of

LANGS = ("en", "de")
SPLITS = ("train", "valid", "test")
STATMT = "http://statmt.org/wmt13"
WMT16 = "http://data.statmt.org/wmt16/translation-task"
CHUNK_LINES = 20_000  # lines per batch handed to a worker: memory is a few batches, whatever the corpus
# Sentences sentencepiece learns from: its memory follows this, not the corpus (benchmarks/spm_memory.py:
# 1M sentences 2.7 GB, 400k 1.1 GB whether the corpus is 1M or 2M pairs): under prepare-data's 1.5 GB.
SPM_SAMPLE = 400_000
# The SGML test sets of the dev archive: split → {lang: member}
WMT16_DEV = {
    "valid": {"en": "newstest2013-src.en.sgm", "de": "newstest2013-ref.de.sgm"},
    "test": {"en": "newstest2014-deen-src.en.sgm", "de": "newstest2014-deen-ref.de.sgm"},
}
WMT16_TRAIN = ["europarl-v7.de-en", "commoncrawl.de-en", "news-commentary-v11.de-en"]


def wmt16_sources(mirror: str | None = None) -> dict[str, download.Source]:
    """The archives, with the SHA-256 of the published ones (dev.tgz's is not pinned yet: the first
    download prints it). A mirror (the lab's) serves the same names with its own sums: None."""
    def url(base: str, archive: str) -> str:
        return f"{mirror.rstrip('/')}/{archive}" if mirror else f"{base}/{archive}"

    def pin(digest: str | None) -> str | None:
        return None if mirror else digest

    dev_members = tuple(m for split in WMT16_DEV.values() for m in split.values())
    return {
        "europarl": download.Source(url(STATMT, "training-parallel-europarl-v7.tgz"),
                                    pin("0224c7c710c8a063dfd893b0cc0830202d61f4c75c17eb8e31836103d27d96e7"),
                                    ("europarl-v7.de-en.en", "europarl-v7.de-en.de")),
        "commoncrawl": download.Source(url(STATMT, "training-parallel-commoncrawl.tgz"),
                                       pin("c7a74e2ea01ac6c920123108627e35278d4ccb5701e15428ffa34de86fa3a9e5"),
                                       ("commoncrawl.de-en.en", "commoncrawl.de-en.de")),
        "news-commentary": download.Source(url(WMT16, "training-parallel-nc-v11.tgz"),
                                           pin("cfe8ab047e05043476e498ee765c98e939c7b7d6d294e856344c84476b619d6a"),
                                           ("news-commentary-v11.de-en.en", "news-commentary-v11.de-en.de")),
        "dev": download.Source(url(WMT16, "dev.tgz"), None, dev_members),
    }


WMT16_SOURCES = wmt16_sources()


def current_sources() -> dict[str, download.Source]:
    mirror = os.environ.get("TANDEM_WMT16_MIRROR")
    return wmt16_sources(mirror) if mirror else WMT16_SOURCES


class DataError(RuntimeError):
    pass


@dataclass(frozen=True)
class Corpus:
    """What prepare-data produced: where, and the figures users ask about."""

    name: str
    bin_dir: str
    train_lines: int
    train_mb: float
    vocab_size: int
    files: int
    vocab_asked: int = 0
    # '' or why the vocabulary is smaller than asked
    vocab_note: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


@functools.cache
def _control_characters() -> re.Pattern:
    """Every code point of Unicode category C (control, format, unassigned...) but the tab."""
    ranges: list[list[int]] = []
    for c in range(sys.maxunicode + 1):
        if unicodedata.category(chr(c))[0] == "C" and c != 0x09 and not 0xD800 <= c <= 0xDFFF:
            if ranges and ranges[-1][1] == c - 1:
                ranges[-1][1] = c
            else:
                ranges.append([c, c])
    return re.compile("[" + "".join(f"{re.escape(chr(a))}-{re.escape(chr(b))}" for a, b in ranges) + "]")


def normalize(line: str) -> str:
    """NFKC, one space between words, no control characters."""
    if not line.isascii():
        line = unicodedata.normalize("NFKC", line)
    line = line.rstrip("\n")  # a file's line ending
    # The regex's class of ~700 ranges costs ~90 us a line; isprintable() is False for every
    # category C character (and tabs, unusual spaces): the rare line that needs it gets it.
    if not line.isprintable():
        line = _control_characters().sub("", line)
    return " ".join(line.split())


def keep_pair(en: str, de: str, max_words: int = 250, max_ratio: float = 3.0) -> bool:
    """The usual filters: both sides present, not too long, lengths not wildly different."""
    a, b = len(en.split()), len(de.split())
    return 0 < a <= max_words and 0 < b <= max_words and max(a, b) / min(a, b) <= max_ratio


def _clean_chunk(job: tuple[list[str], list[str], bool]) -> tuple[str, str, int]:
    ens, des, filter_pairs = job
    out_en, out_de = [], []
    for en_line, de_line in zip(ens, des, strict=True):
        en, de = normalize(en_line), normalize(de_line)
        if filter_pairs and not keep_pair(en, de):
            continue
        out_en.append(en + "\n")
        out_de.append(de + "\n")
    return "".join(out_en), "".join(out_de), len(out_en)


def _pairs_in_chunks(parts: list[dict[str, Path]], filter_pairs: bool) -> Iterator[tuple]:
    for part in parts:
        with open(part["en"], encoding="utf-8") as fen, open(part["de"], encoding="utf-8") as fde:
            while True:
                ens = list(itertools.islice(fen, CHUNK_LINES))
                des = list(itertools.islice(fde, len(ens)))
                if not ens:
                    break
                yield ens, des, filter_pairs


def clean_split(src: dict[str, Path] | list[dict[str, Path]], dest: Path, split: str, filter_pairs: bool,
                report: Silent | None = None, workers: int = 1) -> int:
    """Normalize one split's parallel files (one pair of files, or several one after the other) into
    dest/{split}.{en,de}, streamed in batches over `workers` processes; returns the lines kept.
    The files were checked (check.check_parallel): strict UTF-8, same line count."""
    parts = src if isinstance(src, list) else [src]
    report = report or Silent()
    kept = 0
    with open(dest / f"{split}.en", "w", encoding="utf-8") as oen, \
         open(dest / f"{split}.de", "w", encoding="utf-8") as ode:
        for en, de, n in ordered_map(_clean_chunk, _pairs_in_chunks(parts, filter_pairs), workers):
            oen.write(en)
            ode.write(de)
            kept += n
            report.advance(n)
    return kept


def raw_from_directory(source: Path) -> dict[str, list[dict[str, Path]]]:
    files = {split: {lang: source / f"{split}.{lang}" for lang in LANGS} for split in SPLITS}
    if not files["test"]["en"].exists() and files["valid"]["en"].exists():
        files["test"] = files["valid"]  # a sample with no test split: test on valid
    missing = [str(p) for split in files.values() for p in split.values() if not p.exists()]
    if missing:
        raise DataError(f"--source {source}: expected {{train,valid,test}}.{{en,de}}, missing {', '.join(missing)}")
    return {split: [pair] for split, pair in files.items()}


def download_need(downloads: Path, sources: dict[str, download.Source]) -> int | None:
    """Disk the WMT16 preparation takes before its first byte is downloaded: the archives still to
    come (the servers' sizes, less what a resumable .part already holds), and the text, pieces and
    binaries made from all of them (text ≈ 3 x gzip). None when a server does not say a size."""
    total = missing = 0
    for source in sources.values():
        dest = downloads / Path(source.url).name
        size = dest.stat().st_size if dest.exists() else download.remote_size(source.url)
        if size is None:
            return None
        part = dest.with_name(dest.name + ".part")
        total += size
        missing += 0 if dest.exists() else max(0, size - (part.stat().st_size if part.exists() else 0))
    return disk_needed(total * 3, missing)


def download_wmt16(downloads: Path, report: Silent | None = None, host: str | None = None) -> dict[str, Path]:
    """Every WMT16 archive, fetched (resumed, checked) unless already there: {name: archive}. The
    disk is checked first against what the whole preparation will take (download_need)."""
    need = download_need(downloads, current_sources())
    if need is not None:
        check_disk(downloads, need, host)
    archives = {}
    for name, source in current_sources().items():
        archives[name] = download.fetch(source.url, downloads / Path(source.url).name, source.sha256,
                                        report=report)
        if source.sha256 is None:
            print(f"{name}: sha256 {download.sha256_of(archives[name])} (pin it in train/agent/data/corpus.py)")
    return archives


def extract_wmt16(archives: dict[str, Path], out: Path, report: Silent) -> dict:
    """The archives' members, flat in `out`; the SGML test sets as text, one segment a line."""
    report.start("extract", total=len(archives), unit="archives")
    for name, archive in archives.items():
        download.extract(archive, current_sources()[name].members, out)
        report.advance(1)
    for split, members in WMT16_DEV.items():
        for lang, member in members.items():
            sgml.to_text(out / member, out / f"{split}.{lang}")
            (out / member).unlink()
    report.finish()
    return {}


def raw_from_extracted(extracted: Path) -> dict[str, list[dict[str, Path]]]:
    train = [{lang: extracted / f"{part}.{lang}" for lang in LANGS} for part in WMT16_TRAIN]
    return {"train": train, **{split: [{lang: extracted / f"{split}.{lang}" for lang in LANGS}]
                               for split in ("valid", "test")}}


def check_raw(raw: dict[str, list[dict[str, Path]]], report: Silent | None = None) -> dict[str, int]:
    """Every split valid before anything is made from it (DataError: file, line, what is wrong).
    Returns the lines of each split."""
    report = report or Silent()
    total = sum(p.stat().st_size for parts in raw.values() for part in parts for p in part.values())
    report.start("check", total=total, unit="bytes")
    lines = {}
    try:
        for split in SPLITS:
            lines[split] = 0
            for part in raw[split]:
                lines[split] += check.check_parallel(part, split)
                report.advance(sum(p.stat().st_size for p in part.values()))
    except check.CorpusError as err:
        raise DataError(str(err)) from None
    report.finish()
    return lines


def fingerprint(raw: dict[str, list[dict[str, Path]]]) -> list:
    """What identifies the input files without reading them: path, size, modification time."""
    return [(str(p), p.stat().st_size, p.stat().st_mtime_ns)
            for parts in raw.values() for part in parts for p in part.values()]


def piece_count(model: Path) -> int:
    import sentencepiece as spm

    return spm.SentencePieceProcessor(model_file=str(model)).get_piece_size()


def learn_subwords(text_dir: Path, model_prefix: Path, vocab_size: int, sample: int = SPM_SAMPLE,
                   threads: int | None = None) -> Path:
    """A joint sentencepiece (unigram) model over both languages' training text, learned from a
    random sample of `sample` sentences (sentencepiece reads them all but keeps the sample: its
    memory follows the sample, not the corpus)."""
    import sentencepiece as spm

    spm.SentencePieceTrainer.train(
        input=[str(text_dir / "train.en"), str(text_dir / "train.de")],
        model_prefix=str(model_prefix), vocab_size=vocab_size, character_coverage=1.0,
        model_type="unigram", input_sentence_size=sample, shuffle_input_sentence=True,
        hard_vocab_limit=False, minloglevel=2, num_threads=threads or cores(),
    )
    return model_prefix.with_suffix(".model")


def _read_batches(path: Path, size: int | None = None) -> Iterator[list[str]]:
    with open(path, encoding="utf-8") as f:
        while batch := [line.rstrip("\n") for line in itertools.islice(f, size or CHUNK_LINES)]:
            yield batch


def apply_subwords(model: Path, text_dir: Path, out_dir: Path, report: Silent | None = None,
                   threads: int | None = None) -> int:
    """Every split's text as pieces, a batch of lines at a time (sentencepiece's threads on each
    batch); returns the pieces written (the binaries' size follows from it)."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(model))
    report = report or Silent()
    out_dir.mkdir(parents=True, exist_ok=True)
    pieces_total = 0
    for split in SPLITS:
        for lang in LANGS:
            with open(out_dir / f"{split}.{lang}", "w", encoding="utf-8") as out:
                for batch in _read_batches(text_dir / f"{split}.{lang}"):
                    pieces = sp.encode(batch, out_type=str, num_threads=threads or cores())
                    pieces_total += sum(len(p) for p in pieces)
                    out.write("".join(" ".join(p) + "\n" for p in pieces))
                    report.advance(len(batch))
    return pieces_total


def write_manifest(bin_dir: Path, report: Silent | None = None) -> Path:
    """sha256sum-compatible list of every file, each hashed as a stream: hosts check their copy
    with `sha256sum -c`."""
    lines = []
    for path in sorted(p for p in bin_dir.rglob("*") if p.is_file() and p.name != "MANIFEST.sha256"):
        lines.append(f"{download.sha256_of(path)}  {path.relative_to(bin_dir)}\n")
        (report or Silent()).advance(path.stat().st_size)
    manifest = bin_dir / "MANIFEST.sha256"
    manifest.write_text("".join(lines))
    return manifest


def disk_needed(raw_bytes: int, archives_bytes: int = 0) -> int:
    """What preparing takes on disk: the archives, the extracted and cleaned text (×2), the pieces
    (≈ 1.5 × text), the binaries (≈ 0.6 × text), and a margin of 10%."""
    return int((archives_bytes + raw_bytes * (1 + 1 + 1.5 + 0.6)) * 1.1)


def check_disk(path: Path, need: int, host: str | None = None) -> None:
    path.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(path).free
    if free < need:
        raise DataError(f"{host or socket.gethostname()}: not enough disk to prepare in {path}: needs "
                        f"{need / 1e9:.2f} GB, {free / 1e9:.2f} GB free; free some space or use another "
                        "directory")


def prepare(name: str, work: Path, source: Path | None = None, wmt16: bool = False,
            vocab_size: int = 32000, synthetic_train: int = 20000, report: Silent | None = None,
            host: str | None = None) -> Corpus:
    """Run the pipeline into work/<name>/bin; returns what it made. Each stage is resumable (see
    `stages`): an interrupted or failed run leaves the stages it finished, and the next run goes
    on from there; a run with the same inputs does nothing. A run that fails before finishing
    any stage leaves nothing. Two preparations at once (two labs, two terminals) take turns: the
    second waits on a lock of the work directory itself (nothing left behind)."""
    root = work / name
    work.mkdir(parents=True, exist_ok=True)
    lock = os.open(work, os.O_RDONLY)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        had_stages = root.exists() and Stages(root).any_finished()
        try:
            return _build(name, root, work, source, wmt16, vocab_size, synthetic_train, report or Silent(),
                          host)
        except BaseException:
            if not had_stages and not (root.exists() and Stages(root).any_finished()):
                shutil.rmtree(root, ignore_errors=True)
            raise
    finally:
        os.close(lock)  # and with it the lock


def _build(name: str, root: Path, work: Path, source: Path | None, wmt16: bool, vocab_size: int,
           synthetic_train: int, report: Silent, host: str | None = None) -> Corpus:
    root.mkdir(parents=True, exist_ok=True)
    stages = Stages(root)
    workers = cores()
    if wmt16:
        downloads = work / "downloads"
        archives = download_wmt16(downloads, report=report, host=host)
        archive_bytes = sum(p.stat().st_size for p in archives.values())
        check_disk(root, disk_needed(archive_bytes * 3), host)  # text ≈ 3 × gzip
        raw_key = key_of("wmt16", [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in archives.values()])
        stages.run("raw", raw_key, lambda out: extract_wmt16(archives, out, report))
        raw = raw_from_extracted(root / "raw")
    elif source is not None:
        raw = raw_from_directory(source)
        raw_key = key_of("dir", fingerprint(raw))
    else:
        raw_key = key_of("synthetic", synthetic_train)
        stages.run("raw", raw_key, lambda out: (synthetic.write_corpus(out, train=synthetic_train), {})[1])
        raw = raw_from_directory(root / "raw")
    raw_bytes = sum(p.stat().st_size for parts in raw.values() for part in parts for p in part.values())

    text_key = key_of(raw_key, "clean-1")
    if stages.finished("text", text_key) is None:
        check_disk(root, disk_needed(raw_bytes), host)
    lines = stages.run("text", text_key, lambda out: _clean(raw, out, report, workers))
    if lines["train"] == 0:
        raise DataError(f"{name}: no training pairs left after cleaning")
    text_dir = root / "text"
    spm_key = key_of(text_key, vocab_size, SPM_SAMPLE)
    spm_info = stages.run("spm", spm_key, lambda out: _learn(text_dir, out, vocab_size, report))
    model = root / "spm" / "spm.model"
    sub_key = key_of(spm_key, "encode-1")
    stages.run("subwords", sub_key, lambda out: _encode(model, text_dir, out, lines, report))
    bin_key = key_of(sub_key, "binarize-1")
    info = stages.run("bin", bin_key, lambda out: _binarize(
        name, root, out, raw, lines, spm_info, vocab_size, workers, report))
    return Corpus(**{**info, "bin_dir": str(root / "bin")})


def _clean(raw, out: Path, report: Silent, workers: int) -> dict[str, int]:
    total = check_raw(raw, report)
    report.start("clean", total=sum(total.values()), unit="pairs")
    kept = {split: clean_split(raw[split], out, split, filter_pairs=split == "train", report=report,
                               workers=workers) for split in SPLITS}
    report.finish()
    return kept


def _learn(text_dir: Path, out: Path, vocab_size: int, report: Silent) -> dict:
    report.start("subwords: learn", total=None, unit="")
    model = learn_subwords(text_dir, out / "spm", vocab_size)
    report.finish()
    return {"pieces": piece_count(model)}


def _encode(model: Path, text_dir: Path, out: Path, lines: dict[str, int], report: Silent) -> dict:
    report.start("subwords: apply", total=2 * sum(lines.values()), unit="lines")
    pieces = apply_subwords(model, text_dir, out, report)
    report.finish()
    return {"pieces": pieces}


def _binarize(name, root, bin_dir, raw, lines, spm_info, vocab_size, workers, report) -> dict:
    binary.write(root / "subwords", bin_dir, root / "spm" / "spm.model", SPLITS, LANGS, CHUNK_LINES, workers,
                 report, total_lines=2 * sum(lines.values()))
    shutil.copy2(root / "spm" / "spm.model", bin_dir / "spm.model")
    # BLEU's reference: the test set's target side as it came, not normalized, not split
    shutil.copy2(raw["test"][0]["de"], bin_dir / "test.ref.de")
    text_dir = root / "text"
    train_bytes = sum((text_dir / f"train.{lang}").stat().st_size for lang in LANGS)
    vocab = len((bin_dir / "dict.en.txt").read_text(encoding="utf-8").splitlines())
    corpus = Corpus(name=name, bin_dir="", train_lines=lines["train"],
                    train_mb=round(train_bytes / 1e6, 2), vocab_size=vocab,
                    files=len(list(bin_dir.iterdir())) + 1, vocab_asked=vocab_size,
                    vocab_note=check.vocabulary_note(spm_info["pieces"], vocab_size, lines["train"]))
    figures = {k: v for k, v in corpus.as_dict().items() if k != "bin_dir"}
    (bin_dir / "corpus.json").write_text(json.dumps(figures, indent=2))
    report.start("manifest", total=sum(p.stat().st_size for p in bin_dir.iterdir()), unit="bytes")
    write_manifest(bin_dir, report)
    report.finish()
    return figures

