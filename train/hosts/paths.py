"""Where tandem puts things on a host, as the controller names them in the commands it sends:

    ENV_FILE      /etc/tandem/env    the KEY=VALUE file every job sources first
    DEFAULT_VENV  /opt/tandem/venv   the training virtualenv, where the inventory names none
    RUNS_ROOT     /data/tandem/runs  each run's directory (its keeper's record too)
    DATA_ROOT     /data/tandem/datasets  each prepared dataset's directory (prepare-data publishes there)
    CACHE_ROOT    /data/tandem/cache  torch.compile's code (inductor/, triton/), kept across restarts

One definition: roles/tandem/defaults/main.yml, which the provisioning roles get through their meta
dependency on roles/tandem, read here once at import (a few lines of YAML). Its values are plain paths
or `{{ tandem_... }}` references to its own names; anything else Jinja would make is refused.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

DEFAULTS = Path(__file__).resolve().parents[2] / "roles" / "tandem" / "defaults" / "main.yml"
_REFERENCE = re.compile(r"\{\{\s*(\w+)\s*\}\}")


def read(path: Path = DEFAULTS) -> dict[str, str]:
    """The shared defaults, references resolved: {'tandem_root': '/opt/tandem',
    'tandem_venv': '/opt/tandem/venv', 'tandem_env_file': '/etc/tandem/env'}."""
    raw = yaml.safe_load(path.read_text()) or {}

    def resolve(name: str, seen: tuple[str, ...]) -> str:
        if name in seen:
            raise ValueError(f"{path}: {' -> '.join((*seen, name))} refer to each other")
        if name not in raw:
            raise ValueError(f"{path}: {seen[-1]} refers to {name}, which it does not define")
        value = _REFERENCE.sub(lambda m: resolve(m[1], (*seen, name)), str(raw[name]))
        if "{{" in value or "{%" in value:
            raise ValueError(f"{path}: {name}: {raw[name]!r} is more Jinja than train/hosts/paths.py reads "
                             f"(plain values or {{{{ tandem_... }}}} references)")
        return value

    return {name: resolve(name, ()) for name in raw}


_PATHS = read()
ENV_FILE: str = _PATHS["tandem_env_file"]
DEFAULT_VENV: str = _PATHS["tandem_venv"]
RUNS_ROOT: str = _PATHS["tandem_runs"]
DATA_ROOT: str = _PATHS["tandem_datasets"]
CACHE_ROOT: str = _PATHS["tandem_cache"]
