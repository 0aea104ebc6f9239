"""`--set KEY=VALUE` reaches fairseq as the user typed it: braces in a value are text, never a str.format
field (`--set wandb_project={x}` raised KeyError: 'x' as a traceback; issue 54). Only the preset's own
`{log_dir}`, `{save_dir}` and `{run_id}` are filled in."""

from __future__ import annotations

import shlex

from train.cluster import Host
from train.recipe.record import Run
from train.run import launch


def test_braces_in_a_set_value_reach_fairseq_as_typed():
    run = Run(run_id="r1", hosts=["a"], preset="tiny", overrides=["wandb_project={x}"], dataset="synthetic")
    words = shlex.split(launch.host_commands(run, [Host(name="a", address="10.0.0.1")])["a"])
    assert "{x}" in " ".join(words)
    assert not any("{log_dir}" in w for w in words)  # the preset's own field still filled in
