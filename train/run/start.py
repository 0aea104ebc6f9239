"""A start of a run, resolved in one place: the preset as the hosts train it, the batch, the checkpoint
interval, the length and every host's command, read by every step after it (the keepers' spec, the
start line, --dry-run); none of them resolves the preset or the batch again (the keepers' spec only for
its smaller memberships: other worlds, each with its own update-freq).

`fab train` resolves a start when what decides it is known: before the hosts are probed, from what
can be known then (the batch without the GPUs' memory: what --dry-run prints, and every command
built, so a bad one fails before any host is reached); then once the probe (GPU memory: the batch),
the network check (the link: the heartbeat; --comm auto's choice) and the resume (the hosts' layout)
have decided the rest: what starts, and what the start line says.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..cluster import Host
from ..plan.batch import Batch
from ..plan.batching import VOCAB
from ..recipe.presets import Preset
from ..recipe.record import Run
from . import command, disk, interval, launch, length


@dataclass(frozen=True)
class Start:
    """What one start of a run trains with, resolved once (`resolve`)."""

    preset: Preset  # the user's overrides, max_tokens and the interval as derived, the heartbeat for the link
    max_tokens: int | None  # a rank's batch (None: the preset sizes it in sentences, or fairseq does)
    batch_size: int | None  # a rank's sentences, for a preset without max_tokens
    update_freq: int
    hosts: int
    ranks_per_host: int
    ranks: int  # every host's ranks together
    derived: Batch | None  # how max_tokens and update_freq came from the recipe (None: kept as they were)
    saves: interval.Checkpoints  # how often it saves, and why
    dataset: str
    disk_need: disk.DiskNeed  # what it writes on each host's /data at most (preflight refuses a host without it)
    commands: dict[str, str]  # each host's exact training command, rank 0's host first

    @property
    def tokens_per_update(self) -> int | None:
        """max_tokens x update_freq x ranks (None without max_tokens)."""
        if not self.max_tokens:
            return None
        return command.tokens_per_update(self.max_tokens, max(1, self.update_freq), self.ranks)

    @property
    def max_update(self) -> int | None:
        value = self.preset.options.get("max_update")
        return int(value) if value else None  # type: ignore[call-overload]

    def batch_line(self) -> str:
        """The effective batch in words (command.batch_line)."""
        return command.batch_line(self.hosts, self.ranks_per_host, self.max_tokens, self.update_freq,
                                  self.batch_size)

    def length(self, dataset_tokens: int | None, unread: str = "not read from the hosts") -> str:
        """The run's length in words (length.length_phrase): its tokens per update, max_update, epochs."""
        return length.length_phrase(self.tokens_per_update, self.max_update, dataset_tokens, self.dataset, unread)

    def said(self, dataset_tokens: int | None = None, unread: str = "not read from the hosts") -> str:
        """The start line's middle, and --dry-run's: the batch; the length; the checkpoint interval."""
        return f"{self.batch_line()}; {self.length(dataset_tokens, unread)}; {self.saves.phrase()}"


def resolve(run: Run, hosts: list[Host], derived: Batch | None, read_log: bool) -> Start:
    """The start of `run` on `hosts` (rank order) as decided so far: its checkpoint interval chosen
    (interval.choose, which sets it on the run; `read_log`: a resume's rank 0 log gives the measured
    step), then its preset resolved once and everything read from it. `derived`: what
    batching.apply gave for these hosts, said beside the batch."""
    saves = interval.choose(run, hosts, read_log=read_log)
    preset = run.resolved_preset()
    options = preset.options
    max_tokens, batch_size = options.get("max_tokens"), options.get("batch_size")
    return Start(preset=preset, max_tokens=int(max_tokens) if max_tokens else None,  # type: ignore[call-overload]
                 batch_size=int(batch_size) if batch_size else None,  # type: ignore[call-overload]
                 update_freq=run.update_freq, hosts=len(hosts), ranks_per_host=hosts[0].ranks,
                 ranks=sum(h.ranks for h in hosts), derived=derived,
                 saves=saves, dataset=run.dataset,
                 disk_need=disk.run_need(options, VOCAB, offsite=bool(run.checkpoints_to)),
                 commands=launch.host_commands(run, hosts, preset))
