"""What a run writes on a host's /data, estimated before it starts (preflight refuses a host
without the room, naming it, the need and the free space).

A fairseq checkpoint holds the model's fp32 weights and Adam's two moments (12 bytes a parameter:
the base preset's 60.5M parameters -> 0.74 GB, big's 209M -> 2.5 GB, as their checkpoint_last.pt
measure), and rank 0 keeps several: last, best, `keep_best_checkpoints` best_loss files,
`keep_interval_updates` interval files, epoch files unless `no_epoch_checkpoints`, plus one being
written (fairseq saves to a temporary name, then renames). Every host is counted as rank 0: after a
loss any survivor may become it, and peers hold rank 0's copies (host to host). The keepers add the
history set aside after a split (train.agent.keeper.replica.SET_ASIDE_KEPT) and, when the run copies its
checkpoints off the cluster (--checkpoints-to), the two an upload under way keeps (hard links to the
last and best saves fairseq has replaced since: train.agent.offsite.schedule).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..agent.keeper.replica import SET_ASIDE_KEPT
from ..recipe.params import preset_params

# the histories the keepers set aside after a split (a copy arriving from a peer lands on a host that
# is not rank 0's, which holds fewer files than the count below)
KEEPER_FILES = SET_ASIDE_KEPT
# an upload off the cluster holds (hard links) the saves it sends while fairseq writes the next: its
# checkpoint_last and its checkpoint_best, both staged in one job (train.agent.offsite.schedule.due)
OFFSITE_FILES = 2

# bytes a parameter in a checkpoint: fp32 weights + the optimizer's state (Adam: two moments)
CHECKPOINT_BYTES_PER_PARAM = {"adam": 12, "nag": 8, "sgd": 8, "adagrad": 8}
CHECKPOINT_OVERHEAD_BYTES = 16e6  # fairseq's cfg, meters, the iterator's state: ~MBs
LOG_BYTES_PER_LINE = 2_000  # train.log's JSON line + tensorboard's event per log_interval
SAMPLES_BYTES = 0.5e9  # train.agent.measure.monitor's samples and torchrun's own logs over days


@dataclass(frozen=True)
class DiskNeed:
    """What one run writes on a host at most."""

    checkpoint_bytes: float
    files: int
    log_bytes: float

    @property
    def total(self) -> float:
        return self.checkpoint_bytes * self.files + self.log_bytes

    def line(self) -> str:
        return (f"{self.files} checkpoint files of {self.checkpoint_bytes / 1e9:.2f} GB + "
                f"{self.log_bytes / 1e9:.1f} GB of logs and samples")


def checkpoint_bytes(options: Mapping[str, object], vocab: int) -> float:
    """One checkpoint file of the model `options` describe."""
    per_param = CHECKPOINT_BYTES_PER_PARAM.get(str(options.get("optimizer", "adam")), 12)
    return preset_params(options, vocab) * per_param + CHECKPOINT_OVERHEAD_BYTES


def checkpoint_files(options: Mapping[str, object], offsite: bool = False) -> int:
    """How many checkpoint files rank 0 holds at once at most (fairseq's keep_* rules, + 1 being written,
    + the keepers' set-aside, + the two an upload off the cluster holds when `offsite`); none when the run
    saves none (`no_save`: bench-step's runs)."""
    if options.get("no_save") in (True, "true", "True", 1):
        return 0

    def number(key: str, default: int) -> int:
        value = options.get(key)
        return int(value) if value not in (None, "") else default  # type: ignore[call-overload]

    files = 2 + max(0, number("keep_best_checkpoints", -1))  # last, best, best_loss_*
    interval = number("keep_interval_updates", -1)  # 0 or -1: fairseq keeps every one
    if number("save_interval_updates", 0) > 0:
        files += interval if interval > 0 else number("max_update", 0) // number("save_interval_updates", 1)
    if not options.get("no_epoch_checkpoints"):
        epochs = number("keep_last_epochs", -1)
        files += epochs if epochs > 0 else max(1, number("max_epoch", 0))
    return files + 1 + KEEPER_FILES + (OFFSITE_FILES if offsite else 0)


def run_need(options: Mapping[str, object], vocab: int, offsite: bool = False) -> DiskNeed:
    """What a run of these options writes on each host at most (`offsite`: it copies its checkpoints off
    the cluster)."""
    logs = number_of_log_lines(options) * LOG_BYTES_PER_LINE + SAMPLES_BYTES
    return DiskNeed(checkpoint_bytes(options, vocab), checkpoint_files(options, offsite), logs)


def number_of_log_lines(options: Mapping[str, object]) -> int:
    max_update = int(options.get("max_update") or 0)  # type: ignore[call-overload]
    every = int(options.get("log_interval") or 100)  # type: ignore[call-overload]
    return max_update // max(1, every)


def problem(host: str, need: DiskNeed, free_gb: float, already_gb: float = 0.0) -> str | None:
    """The line that refuses `host`, or None where /data has the room. `already_gb`: the run's own
    files there (a resume replaces them)."""
    needed_gb = max(0.0, need.total / 1e9 - already_gb)
    if free_gb >= needed_gb:
        return None
    return (f"{host}: the run writes up to {need.total / 1e9:.1f} GB on /data ({need.line()}; any host may "
            f"become rank 0 after a loss), {free_gb:.1f} GB free"
            + (f" beside its own {already_gb:.1f} GB" if already_gb else "")
            + ": free space, or keep fewer files (--set keep_best_checkpoints=, keep_interval_updates=)")
