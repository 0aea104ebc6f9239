"""Experiment trackers' keys (W&B, through fairseq's own `--wandb-project`): from the controller's
environment to the ranks' without being written to a host's disk.

`fab train` sends the keys it finds in its own environment to each keeper's launch on its standard
input; the keeper's supervisor holds them in its environment (memory, /proc readable by its user
alone), the keeper and the ranks inherit them. Where systemd supervises the keeper, they reach its
unit through a 0600 file in the runtime directory, in memory too (train.agent.keeper.supervision).
Nothing in spec.json, the command lines or a log has them. A keeper started again by tandem-boot
after a reboot has none: its ranks then log to W&B offline (`WANDB_MODE=offline`, kept in the run's
wandb/ directory; `wandb sync` sends it later) rather than fail at wandb.init without a key.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import IO

KEYS = ("WANDB_API_KEY",)


def from_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The keys the controller passes on: those set in its environment."""
    return {key: environ[key] for key in KEYS if environ.get(key)}


def read(stream: IO[str]) -> dict[str, str]:
    """One JSON line of keys (the launch's standard input); anything but KEYS is ignored."""
    given = json.loads(stream.readline() or "{}")
    return {key: str(value) for key, value in given.items() if key in KEYS and value}


def rank_environment(command: str, environ: Mapping[str, str]) -> dict[str, str]:
    """The environment a rank command starts in: W&B offline where it logs to W&B without a key."""
    env = dict(environ)
    if "--wandb-project" in command and not env.get("WANDB_API_KEY") and not env.get("WANDB_MODE"):
        env["WANDB_MODE"] = "offline"
    return env
