"""The synthetic en→de corpus: deterministic, the sizes asked for, German grammar right."""

from __future__ import annotations

from train.agent.data.synthetic import NOUNS, Phrase, generate_pairs, write_corpus


def _noun(en: str):
    return next(n for n in NOUNS if n.en == en)


def test_same_seed_same_corpus_byte_for_byte(tmp_path):
    a = write_corpus(tmp_path / "a", train=300, valid=50, test=40, seed=7)
    b = write_corpus(tmp_path / "b", train=300, valid=50, test=40, seed=7)
    assert a == b
    for name in a:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_another_seed_another_corpus():
    assert generate_pairs(50, seed=1) != generate_pairs(50, seed=2)


def test_sizes_as_asked_and_sides_aligned(tmp_path):
    summary = write_corpus(tmp_path, train=500, valid=60, test=70, seed=1)
    for split, lines in (("train", 500), ("valid", 60), ("test", 70)):
        for lang in ("en", "de"):
            text = (tmp_path / f"{split}.{lang}").read_text(encoding="utf-8")
            assert text.count("\n") == lines == summary[f"{split}.{lang}"]["lines"]
            assert all(line.strip() for line in text.splitlines())


def test_test_and_valid_never_seen_in_train(tmp_path):
    write_corpus(tmp_path, train=2000, valid=200, test=200, seed=3)
    train = set((tmp_path / "train.en").read_text().splitlines())
    valid = set((tmp_path / "valid.en").read_text().splitlines())
    test = set((tmp_path / "test.en").read_text().splitlines())
    assert not train & test and not train & valid and not valid & test


def test_test_set_does_not_depend_on_train_size(tmp_path):
    write_corpus(tmp_path / "small", train=100, valid=20, test=30, seed=5)
    write_corpus(tmp_path / "big", train=1000, valid=20, test=30, seed=5)
    assert (tmp_path / "small/test.de").read_bytes() == (tmp_path / "big/test.de").read_bytes()


def test_case_and_adjective_agreement():
    dog, house, cat = _noun("dog"), _noun("house"), _noun("cat")
    big = ("big", "groß")
    assert Phrase("the big dog", "the", dog, big, False).de("n") == "der große Hund"
    assert Phrase("the big dog", "the", dog, big, False).de("a") == "den großen Hund"
    assert Phrase("a big dog", "a", dog, big, False).de("n") == "ein großer Hund"
    assert Phrase("a big house", "a", house, big, False).de("a") == "ein großes Haus"
    assert Phrase("a big cat", "a", cat, big, False).de("d") == "einer großen Katze"
    assert Phrase("the dogs", "the", dog, None, True).de("d") == "den Hunden"
    assert Phrase("two tired dogs", "two", dog, ("tired", "müde"), True, "zwei").de("n") == "zwei müde Hunde"


def test_word_order_verb_final_and_verb_second():
    pairs = generate_pairs(3000, seed=11)
    dass = [de for _, de in pairs if ", dass " in de]
    assert dass, "reported speech appears"
    # the subordinate clause ends with its verb: never with an article or adjective
    assert all(de.rstrip(".").split()[-1] not in {"der", "die", "das", "den", "dem"} for de in dass)
    fronted = [(en, de) for en, de in pairs if en.startswith("Today ")]
    assert fronted and all(de.startswith("Heute ") for _, de in fronted)
    # verb second: the word after "Heute" is a verb, not an article
    assert all(de.split()[1] not in {"der", "die", "das", "ein", "eine"} for _, de in fronted)


def test_sentences_are_capitalised_and_punctuated():
    for en, de in generate_pairs(200, seed=2):
        assert en[0].isupper() and de[0].isupper()
        assert en[-1] in ".?" and de[-1] == en[-1]
