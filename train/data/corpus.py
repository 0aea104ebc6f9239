"""prepare-data: corpus → clean text → joint subword vocabulary → fairseq binaries.

The pipeline runs on the controller, once; the result goes to /data on every host and is
checked there against its SHA-256 manifest (`fab prepare-data`). Sources:
- the WMT16 en→de corpora (`WMT16`: Europarl v7, Common Crawl, News Commentary v11;
  newstest2012 to validate, newstest2013 to test), downloaded resumably with checksums;
- a local directory with {train,valid,test}.{en,de} (`--source DIR`);
- the synthetic corpus (`train/data/synthetic.py`): the lab's and the demo's default.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import unicodedata
from dataclasses import asdict, dataclass
from pathlib import Path

from . import check, download, synthetic

LANGS = ("en", "de")
SPLITS = ("train", "valid", "test")
STATMT = "http://statmt.org/wmt13"
WMT16 = "http://data.statmt.org/wmt16/translation-task"
# SHA-256 of the published archives. dev.tgz's is not pinned yet: the first download prints it.
WMT16_SOURCES = {
    "europarl": download.Source(f"{STATMT}/training-parallel-europarl-v7.tgz",
                                "0224c7c710c8a063dfd893b0cc0830202d61f4c75c17eb8e31836103d27d96e7",
                                ("europarl-v7.de-en.en", "europarl-v7.de-en.de")),
    "commoncrawl": download.Source(f"{STATMT}/training-parallel-commoncrawl.tgz",
                                   "c7a74e2ea01ac6c920123108627e35278d4ccb5701e15428ffa34de86fa3a9e5",
                                   ("commoncrawl.de-en.en", "commoncrawl.de-en.de")),
    "news-commentary": download.Source(f"{WMT16}/training-parallel-nc-v11.tgz",
                                       "cfe8ab047e05043476e498ee765c98e939c7b7d6d294e856344c84476b619d6a",
                                       ("news-commentary-v11.de-en.en", "news-commentary-v11.de-en.de")),
    "dev": download.Source(f"{WMT16}/dev.tgz", None,
                           ("newstest2012.en", "newstest2012.de", "newstest2013.en", "newstest2013.de")),
}
WMT16_LAYOUT = {  # split → the files that make it, per language
    "train": ["europarl-v7.de-en", "commoncrawl.de-en", "news-commentary-v11.de-en"],
    "valid": ["newstest2012"],
    "test": ["newstest2013"],
}


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


def normalize(line: str) -> str:
    """NFKC, one space between words, no control characters."""
    line = unicodedata.normalize("NFKC", line)
    line = "".join(ch for ch in line if unicodedata.category(ch)[0] != "C" or ch == "\t")
    return " ".join(line.split())


def keep_pair(en: str, de: str, max_words: int = 250, max_ratio: float = 3.0) -> bool:
    """The usual filters: both sides present, not too long, lengths not wildly different."""
    a, b = len(en.split()), len(de.split())
    return 0 < a <= max_words and 0 < b <= max_words and max(a, b) / min(a, b) <= max_ratio


def clean_split(src: dict[str, Path], dest: Path, split: str, filter_pairs: bool) -> int:
    """Normalize one split's parallel files into dest/{split}.{en,de}; returns the lines kept.
    The files were checked (check.check_parallel): strict UTF-8, same line count."""
    with open(src["en"], encoding="utf-8") as fen, \
         open(src["de"], encoding="utf-8") as fde, \
         open(dest / f"{split}.en", "w", encoding="utf-8") as oen, \
         open(dest / f"{split}.de", "w", encoding="utf-8") as ode:
        kept = 0
        for en_line, de_line in zip(fen, fde, strict=True):
            en, de = normalize(en_line), normalize(de_line)
            if filter_pairs and not keep_pair(en, de):
                continue
            oen.write(en + "\n")
            ode.write(de + "\n")
            kept += 1
    return kept


def raw_from_directory(source: Path) -> dict[str, dict[str, Path]]:
    files = {split: {lang: source / f"{split}.{lang}" for lang in LANGS} for split in SPLITS}
    if not files["test"]["en"].exists() and files["valid"]["en"].exists():
        files["test"] = files["valid"]  # a sample with no test split: test on valid
    missing = [str(p) for split in files.values() for p in split.values() if not p.exists()]
    if missing:
        raise DataError(f"--source {source}: expected {{train,valid,test}}.{{en,de}}, missing {', '.join(missing)}")
    return files


def download_wmt16(downloads: Path, quiet: bool = False) -> dict[str, Path]:
    """Every WMT16 archive, fetched (resumed, checked) unless already there: {name: archive}."""
    archives = {}
    for name, source in WMT16_SOURCES.items():
        archives[name] = download.fetch(source.url, downloads / Path(source.url).name, source.sha256, quiet=quiet)
        if source.sha256 is None:
            print(f"{name}: sha256 {download.sha256_of(archives[name])} (pin it in train/data/corpus.py)")
    return archives


def raw_from_wmt16(downloads: Path, quiet: bool = False) -> dict[str, dict[str, Path]]:
    extracted = downloads / "extracted"
    for name, archive in download_wmt16(downloads, quiet=quiet).items():
        download.extract(archive, WMT16_SOURCES[name].members, extracted)
    files = {}
    for split, parts in WMT16_LAYOUT.items():
        files[split] = {}
        for lang in LANGS:
            joined = downloads / f"{split}.{lang}"
            with open(joined, "wb") as out:
                for part in parts:
                    out.write((extracted / f"{part}.{lang}").read_bytes())
            files[split][lang] = joined
    return files


def check_raw(raw: dict[str, dict[str, Path]]) -> None:
    """Every split valid before anything is made from it (DataError: file, line, what is wrong)."""
    try:
        for split in SPLITS:
            check.check_parallel(raw[split], split)
    except check.CorpusError as err:
        raise DataError(str(err)) from None


def piece_count(model: Path) -> int:
    import sentencepiece as spm

    return spm.SentencePieceProcessor(model_file=str(model)).get_piece_size()


def learn_subwords(text_dir: Path, model_prefix: Path, vocab_size: int) -> Path:
    """A joint sentencepiece (unigram) model over both languages' training text."""
    import sentencepiece as spm

    spm.SentencePieceTrainer.train(
        input=[str(text_dir / "train.en"), str(text_dir / "train.de")],
        model_prefix=str(model_prefix), vocab_size=vocab_size, character_coverage=1.0,
        model_type="unigram", input_sentence_size=2_000_000, shuffle_input_sentence=True,
        hard_vocab_limit=False, minloglevel=2, num_threads=2,
    )
    return model_prefix.with_suffix(".model")


def apply_subwords(model: Path, text_dir: Path, out_dir: Path) -> None:
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(model))
    out_dir.mkdir(parents=True, exist_ok=True)
    for split in SPLITS:
        for lang in LANGS:
            lines = (text_dir / f"{split}.{lang}").read_text(encoding="utf-8").splitlines()
            pieces = sp.encode(lines, out_type=str)
            (out_dir / f"{split}.{lang}").write_text("".join(" ".join(p) + "\n" for p in pieces), encoding="utf-8")


def binarize(sub_dir: Path, bin_dir: Path, workers: int = 2) -> None:
    preprocess = Path(sys.executable).with_name("fairseq-preprocess")
    command = [str(preprocess), "--source-lang", "en", "--target-lang", "de",
               "--trainpref", str(sub_dir / "train"), "--validpref", str(sub_dir / "valid"),
               "--testpref", str(sub_dir / "test"), "--destdir", str(bin_dir),
               "--joined-dictionary", "--workers", str(workers)]
    proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode != 0:
        raise DataError(f"fairseq-preprocess failed:\n{proc.stderr[-2000:]}")


def write_manifest(bin_dir: Path) -> Path:
    """sha256sum-compatible list of every file: hosts check their copy with `sha256sum -c`."""
    lines = []
    for path in sorted(p for p in bin_dir.rglob("*") if p.is_file() and p.name != "MANIFEST.sha256"):
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        lines.append(f"{digest}  {path.relative_to(bin_dir)}\n")
    manifest = bin_dir / "MANIFEST.sha256"
    manifest.write_text("".join(lines))
    return manifest


def prepare(name: str, work: Path, source: Path | None = None, wmt16: bool = False,
            vocab_size: int = 32000, synthetic_train: int = 20000, quiet: bool = False) -> Corpus:
    """Run the whole pipeline into work/<name>/bin; returns what it made. It is built beside, in
    work/.<name>.partial, and replaces work/<name> only when it succeeded: a failure leaves the
    cache as it was (a previous good preparation of the same name included). Two controllers
    preparing at once (two labs, two terminals) take turns: the second waits on a lock of the
    work directory itself (nothing left behind) rather than deleting the first one's half-built files."""
    root, partial = work / name, work / f".{name}.partial"
    work.mkdir(parents=True, exist_ok=True)
    lock = os.open(work, os.O_RDONLY)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        shutil.rmtree(partial, ignore_errors=True)
        try:
            corpus = _build(name, partial, work, source, wmt16, vocab_size, synthetic_train, quiet)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        shutil.rmtree(root, ignore_errors=True)
        partial.rename(root)
    finally:
        os.close(lock)  # and with it the lock
    return Corpus(**{**corpus.as_dict(), "bin_dir": str(root / "bin")})


def _build(name: str, root: Path, work: Path, source: Path | None, wmt16: bool, vocab_size: int,
           synthetic_train: int, quiet: bool) -> Corpus:
    raw_dir, text_dir, sub_dir, bin_dir = root / "raw", root / "text", root / "subwords", root / "bin"
    for d in (raw_dir, text_dir):
        d.mkdir(parents=True)
    if wmt16:
        raw = raw_from_wmt16(work / "downloads", quiet=quiet)
    elif source is not None:
        raw = raw_from_directory(source)
    else:
        synthetic.write_corpus(raw_dir, train=synthetic_train)
        raw = raw_from_directory(raw_dir)
    check_raw(raw)
    lines = {split: clean_split(raw[split], text_dir, split, filter_pairs=split == "train") for split in SPLITS}
    if lines["train"] == 0:
        raise DataError(f"{name}: no training pairs left after cleaning")
    model = learn_subwords(text_dir, root / "spm", vocab_size)
    apply_subwords(model, text_dir, sub_dir)
    binarize(sub_dir, bin_dir)
    (bin_dir / "preprocess.log").rename(root / "preprocess.log")  # has paths and times: not data
    shutil.copy2(model, bin_dir / "spm.model")
    shutil.copy2(text_dir / "test.de", bin_dir / "test.ref.de")  # BLEU's reference, untokenized
    train_bytes = sum((text_dir / f"train.{lang}").stat().st_size for lang in LANGS)
    vocab = len((bin_dir / "dict.en.txt").read_text(encoding="utf-8").splitlines())
    corpus = Corpus(name=name, bin_dir=str(bin_dir), train_lines=lines["train"],
                    train_mb=round(train_bytes / 1e6, 2), vocab_size=vocab,
                    files=len(list(bin_dir.iterdir())) + 1, vocab_asked=vocab_size,
                    vocab_note=check.vocabulary_note(piece_count(model), vocab_size, lines["train"]))
    figures = {k: v for k, v in corpus.as_dict().items() if k != "bin_dir"}
    (bin_dir / "corpus.json").write_text(json.dumps(figures, indent=2))
    write_manifest(bin_dir)
    return corpus
