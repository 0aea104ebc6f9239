"""`fab train`'s start line says how long the run is: tokens per update, updates, total tokens and
epochs of its dataset (the dataset's tokens read from its prepared binaries)."""

from __future__ import annotations

from train.cluster import Host, HostResult
from train.recipe.presets import PRESETS
from train.run import length

WMT16_TOKENS = 140_000_000  # ~4.5M pairs x ~31 tokens the longer side


def test_the_big_recipe_trains_about_seventy_epochs_not_a_thousand():
    big = PRESETS["transformer_vaswani_wmt_en_de_big"]
    phrase = length.length_phrase(int(big["tokens_per_update"]), int(big["max_update"]), WMT16_TOKENS, "wmt16")
    assert phrase == ("458,752 tokens per update x 24,000 updates = 11.0 B tokens ≈ 79 epochs of wmt16 "
                      "(140.0 M tokens)")
    base = PRESETS["transformer_wmt_en_de"]
    assert length.length_phrase(int(base["tokens_per_update"]), int(base["max_update"]), WMT16_TOKENS,
                                "wmt16").endswith("= 3.3 B tokens ≈ 23 epochs of wmt16 (140.0 M tokens)")


def test_an_unknown_dataset_size_or_length_is_said():
    assert length.length_phrase(4096, 300, None, "synthetic") == (
        "4,096 tokens per update x 300 updates = 1.2 M tokens (epochs of synthetic: its size unknown, "
        "not read from the hosts)")
    assert length.length_phrase(4096, 300, 2_000_000, "synthetic").endswith("≈ 0.61 epochs of synthetic (2.0 M tokens)")
    assert length.length_phrase(4096, None, 2_000_000, "synthetic") == (
        "4,096 tokens per update, no max_update (fairseq stops at max_epoch)")
    assert length.length_phrase(None, 300, None, "synthetic") == "300 updates"


def test_the_datasets_tokens_come_from_its_binaries():
    # a 32k dictionary: 2 bytes a token; the longer side counts (German here)
    assert length.dataset_tokens([260_000_000, 280_000_000], 32_000) == 140_000_000
    assert length.dataset_tokens([400_000, 400_000], 70_000) == 100_000  # past uint16: 4 bytes
    assert length.dataset_tokens([], 32_000) is None


def test_a_dataset_size_not_read_says_on_which_host_and_why():
    host = Host("g0", "203.0.113.10", gpus=8)
    missing = HostResult("g0", stderr="stat: cannot stat '/data/tandem/datasets/wmt16/train.en-de.en.bin': "
                                      "No such file or directory\n", exited=1)
    size, unread = length.tokens_of_answer(missing, host)
    assert size is None
    phrase = length.length_phrase(458752, 24000, size, "wmt16", unread)
    assert phrase.endswith("(epochs of wmt16: its size unknown, not read on g0: stat: cannot stat "
                           "'/data/tandem/datasets/wmt16/train.en-de.en.bin': No such file or directory)")
    assert length.tokens_of_answer(HostResult("g0", stdout="280000000\n270000000\n31992\n", exited=0), host) == (
        140_000_000, "")


def test_the_size_comes_with_preflights_probe_of_rank_0s_host(tmp_path):
    """No SSH round trip of its own: the probe already read the binaries' sizes."""
    from train.agent.measure.probe import training_files

    (tmp_path / "train.en-de.en.bin").write_bytes(b"\0" * 2_000)
    (tmp_path / "train.en-de.de.bin").write_bytes(b"\0" * 2_400)
    (tmp_path / "dict.en.txt").write_text("".join(f"w{i} 1\n" for i in range(996)))
    host = Host("v100a", "10.10.0.1")
    assert length.tokens_of_probe({"training_files": training_files(str(tmp_path))}, host) == (1_200, "")
    (tmp_path / "train.en-de.de.bin").unlink()
    size, unread = length.tokens_of_probe({"training_files": training_files(str(tmp_path))}, host)
    assert size is None and unread.startswith("not read on v100a: [Errno 2] No such file or directory")
    assert length.tokens_of_probe({}, host) is None  # an agent from before: the start line reads it itself
