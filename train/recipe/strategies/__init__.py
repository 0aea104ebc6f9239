"""Communication strategies (`--comm`): how the ranks share what each learned. One module per
strategy in this folder, each holding everything about it (base.Strategy lists what); every module
here is imported, so a new strategy is one file (and its host-side hook, train/agent/comm_*.py).

    strategies.parse("local-sgd:16")   # a typed, frozen value: LocalSGD(period=16)
    strategies.ladder("fp32")           # what --comm auto tries, least invasive first

`auto` is resolved before the run starts (train.plan.model.choose, from train.plan.predict) and the
run remembers the concrete choice, so a resumed run keeps it.
"""

from __future__ import annotations

import importlib
import pkgutil

from .base import CommError, Strategy
from .registry import (
    UPDATE_FREQ,
    fairseq_options_of,
    get,
    ladder,
    names,
    options,
    overlapping,
    parse,
    starts,
    syntax,
    tandem_options,
)

for _module in pkgutil.iter_modules(__path__):
    if _module.name not in ("base", "registry"):
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["UPDATE_FREQ", "CommError", "Strategy", "fairseq_options_of", "get", "ladder", "names", "options",
           "overlapping", "parse", "starts", "syntax", "tandem_options"]
