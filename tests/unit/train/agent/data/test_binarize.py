"""tandem's binarizer writes what fairseq-preprocess writes: every sentence of every split the
same pieces, through dictionaries fairseq loads, in the mmap files fairseq-train reads; in one
streamed pass over sentencepiece's vocabulary instead of fairseq-preprocess's two Python ones."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from train.agent.data import binarize, corpus, synthetic

SPLITS, LANGS = corpus.SPLITS, corpus.LANGS


@pytest.fixture(scope="module")
def pieces(tmp_path_factory) -> tuple[Path, Path]:
    """A subword corpus: sentencepiece learned on synthetic pairs, applied; the valid split holds a
    character the model never saw (unk) and an empty line."""
    root = tmp_path_factory.mktemp("binarize")
    text = root / "text"
    synthetic.write_corpus(text, train=600, valid=40, test=40, seed=3)
    with open(text / "valid.en", "a", encoding="utf-8") as en, open(text / "valid.de", "a", encoding="utf-8") as de:
        en.write("the snowman ☃ sings\n\n")
        de.write("der Schneemann ☃ singt\n\n")
    model = corpus.learn_subwords(text, root / "spm", vocab_size=200, threads=1)
    corpus.apply_subwords(model, text, root / "sub", threads=1)
    return root / "sub", model


def load(bin_dir: Path, split: str, lang: str):
    from fairseq.data import Dictionary
    from fairseq.data.indexed_dataset import MMapIndexedDataset

    vocab = Dictionary.load(str(bin_dir / f"dict.{lang}.txt"))
    data = MMapIndexedDataset(str(bin_dir / f"{split}.en-de.{lang}"))
    return vocab, [vocab.string(data[i]) for i in range(len(data))], list(data.sizes)


def test_the_binaries_hold_what_fairseq_preprocess_makes_of_the_same_pieces(pieces, tmp_path):
    sub, model = pieces
    ours, theirs = tmp_path / "ours", tmp_path / "fairseq"
    size = binarize.write(sub, ours, model, SPLITS, LANGS, batch_lines=64, workers=2)
    preprocess = Path(sys.executable).with_name("fairseq-preprocess")
    subprocess.run([str(preprocess), "--source-lang", "en", "--target-lang", "de", "--trainpref", str(sub / "train"),
                    "--validpref", str(sub / "valid"), "--testpref", str(sub / "test"), "--destdir", str(theirs),
                    "--joined-dictionary", "--workers", "1"], check=True, capture_output=True)
    for split in SPLITS:
        for lang in LANGS:
            our_vocab, our_lines, our_sizes = load(ours, split, lang)
            their_vocab, their_lines, their_sizes = load(theirs, split, lang)
            assert our_lines == their_lines, (split, lang)
            assert our_sizes == their_sizes, (split, lang)
    assert "<unk>" in load(ours, "valid", "en")[1][-2]  # the snowman: a character the model never saw
    assert len(our_vocab) == size and size % binarize.PADDING_FACTOR == 0
    assert set(their_vocab.symbols) - set(our_vocab.symbols) <= {f"madeupword{i:04d}" for i in range(8)}
    assert (ours / "dict.en.txt").read_text() == (ours / "dict.de.txt").read_text()


def test_the_dictionary_counts_the_training_pieces(pieces, tmp_path):
    sub, model = pieces
    binarize.write(sub, tmp_path, model, SPLITS, LANGS, batch_lines=50)
    counted: dict[str, int] = {}
    for lang in LANGS:
        for line in (sub / f"train.{lang}").read_text(encoding="utf-8").splitlines():
            for piece in line.split():
                counted[piece] = counted.get(piece, 0) + 1
    written = dict(line.rsplit(" ", 1) for line in (tmp_path / "dict.en.txt").read_text(encoding="utf-8").splitlines())
    assert {p: int(c) for p, c in written.items() if int(c)} == counted
