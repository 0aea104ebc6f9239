"""The strategies' registry (train.recipe.strategies.registry): a strategy is a Strategy, once by its name."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from train.recipe import strategies
from train.recipe.strategies.registry import register


def test_only_a_strategy_is_registered():
    @dataclass(frozen=True)
    class Gossip:  # says a name, as a strategy would, but is none
        name = "gossip"

    for wrong in (Gossip, Gossip(), lambda: None):
        with pytest.raises(TypeError, match=r"register takes a subclass of train\.recipe\.strategies\.base\.Strategy, "
                                            r"not ") as refused:
            register(wrong)
        assert str(refused.value).endswith(repr(wrong))  # what was given, named
    assert "gossip" not in strategies.names()


def test_a_strategy_needs_a_name_of_its_own():
    for taken in ("sync", "auto", "update-freq", ""):
        @dataclass(frozen=True)
        class Again(strategies.Strategy):
            name = taken

        with pytest.raises(ValueError, match=f"a strategy needs a name of its own, not '{taken}'"):
            register(Again)
    assert strategies.get("sync").__name__ == "Sync"
