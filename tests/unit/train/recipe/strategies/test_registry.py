"""The strategies' registry (train.recipe.strategies.registry): a strategy is a Strategy, once by its name."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from train.agent.trainer import comm_local_sgd, comm_powersgd
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


def test_every_strategys_environment_is_what_its_host_side_hook_reads():
    """The variables a strategy sets are spelled once a side (train.recipe may not import train.agent,
    which the hosts run): each must be one a hook in train/agent/comm_*.py reads."""
    read = {comm_local_sgd.SYNC_UPDATES_VARIABLE, comm_powersgd.VARIABLE}
    options = {"warmup_updates": 10}
    set_by = {name: set(strategies.parse(name).environment(options)) for name in strategies.names()}
    assert set_by["local-sgd"] and set_by["powersgd"]
    assert all(variables <= read for variables in set_by.values()), set_by
