"""Presets and `--set key=value` overrides: typed, unknown keys rejected with a hint."""

from __future__ import annotations

import pytest

from train.recipe.presets import PRESETS, OverrideError, resolve, to_args


def test_every_preset_has_the_training_recipe():
    for name, options in PRESETS.items():
        assert options["lr_scheduler"] == "inverse_sqrt", name
        assert options["warmup_updates"] > 0, name
        assert options["criterion"] == "label_smoothed_cross_entropy", name
        assert options["keep_best_checkpoints"] == 5 and options["best_checkpoint_metric"] == "loss", name
        assert options["log_format"] == "json" and options["tensorboard_logdir"], name
        assert options["adam_betas"] == "(0.9, 0.98)", name


def test_overrides_are_typed():
    preset = resolve("transformer_wmt_en_de", ["max_update=300000", "lr=0.001", "max-tokens=8192"])
    assert preset.options["max_update"] == 300000
    assert preset.options["lr"] == 0.001
    assert preset.options["max_tokens"] == 8192
    assert PRESETS["transformer_wmt_en_de"]["max_update"] == 100000, "the preset itself is untouched"


def test_bool_and_extra_options():
    preset = resolve("tiny", ["no_epoch_checkpoints=false", "attention_dropout=0.1", "patience=3"])
    assert preset.options["no_epoch_checkpoints"] is False
    assert preset.options["attention_dropout"] == 0.1
    assert preset.options["patience"] == 3


def test_unknown_option_rejected_with_close_matches():
    with pytest.raises(OverrideError, match=r"unknown option `max_updates`.*did you mean max_update"):
        resolve("tiny", ["max_updates=10"])


def test_wrong_type_rejected():
    with pytest.raises(OverrideError, match="expected an integer"):
        resolve("tiny", ["max_update=lots"])
    with pytest.raises(OverrideError, match="expected true/false"):
        resolve("tiny", ["share_all_embeddings=maybe"])


def test_launcher_options_cannot_be_overridden():
    with pytest.raises(OverrideError, match="set by the launcher"):
        resolve("tiny", ["distributed_world_size=8"])


def test_malformed_override_and_unknown_preset():
    with pytest.raises(OverrideError, match="key=value"):
        resolve("tiny", ["max_update"])
    with pytest.raises(OverrideError, match="did you mean transformer_wmt_en_de"):
        resolve("transformer_wmt_ende")


def test_to_args_flags_and_values():
    args = to_args({"share_all_embeddings": True, "no_save": False, "lr": 0.5, "restore_file": None})
    assert args == ["--share-all-embeddings", "--lr", "0.5"]
