"""`--set` text as overrides: split on the commas between them, not those inside a value."""

from __future__ import annotations

import pytest

from train.recipe.presets import parse_overrides, resolve


@pytest.mark.parametrize(("text", "overrides"), [
    ("adam_betas=(0.9, 0.98),lr=0.001", ["adam_betas=(0.9, 0.98)", "lr=0.001"]),
    ("lr=0.001, max_update=300", ["lr=0.001", "max_update=300"]),
    ("restore_file='a,b.pt',lr=0.001", ["restore_file='a,b.pt'", "lr=0.001"]),
    ('restore_file="a,(b.pt",lr=0.001', ['restore_file="a,(b.pt"', "lr=0.001"]),
    ("activation_fn=[x, y],lr=1", ["activation_fn=[x, y]", "lr=1"]),
    ("lr=0.001,,", ["lr=0.001"]),
    ("", []),
    (None, []),
])
def test_set_text_splits_between_overrides_only(text, overrides):
    assert parse_overrides(text) == overrides


def test_a_bracketed_value_reaches_the_preset_whole():
    options = resolve("tiny", parse_overrides("adam_betas=(0.9, 0.999),lr=0.002")).options
    assert options["adam_betas"] == "(0.9, 0.999)" and options["lr"] == 0.002
