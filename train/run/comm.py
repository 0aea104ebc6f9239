"""Communication as the run's modules know it: the strategies (sync, fp16, local-sgd:H, ...:
train.recipe.strategies) and the link's arithmetic (train.recipe.link_time: what a ring all-reduce
sends per host, how long a transfer takes, a collective's time limit), re-exported here for the
modules that knew them here.
"""

from __future__ import annotations

from train.recipe.link_time import TRANSFER_MARGIN, allreduce_bytes_per_host, collective_timeout_s, transfer_s
from train.recipe.strategies import CommError, Strategy
from train.recipe.strategies.local_sgd import (
    DEFAULT_PERIOD,
    OUTER_STEP_OPTIONS,
    SYNC_UPDATES_OPTION,
    sync_start,
)

__all__ = ["DEFAULT_PERIOD", "OUTER_STEP_OPTIONS", "SYNC_UPDATES_OPTION", "TRANSFER_MARGIN", "CommError", "Strategy",
           "allreduce_bytes_per_host", "collective_timeout_s", "sync_start", "transfer_s"]
