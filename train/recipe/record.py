"""What the controller remembers of a run: its id, hosts, preset, membership (reports/<id>/run.json).

A run has an id. On every host its files live in /data/tandem/runs/<id>/ (train.log,
train.pid, checkpoints/, tensorboard/); on the controller in reports/<id>/ (run.json, the
off-host copy of the last and best checkpoints, collected logs). Every command that needs a
run finds it by id, the latest by default.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from ..cluster import TOP, ClusterError, Host
from ..hosts import paths
from . import presets

REPORTS = TOP / "reports"
# a name that becomes a directory on every host and goes into shell commands (runs, datasets): what the
# CLI takes for --run and --dataset (train.cli.options.NAME), and all a record read back may hold
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
NAMED = "a name of letters, digits, '.', '_' and '-'"


def check_record(held: object, where: str, folder: str) -> None:
    """A run record read from a host or a bucket (`where`: the file, as a user would find it), read as the
    CLI reads --run and --dataset: its run_id and dataset names, its run_id its `folder`'s name.
    ClusterError in one line saying what was expected and what was found."""
    if not isinstance(held, dict):
        raise ClusterError(f"{where} refused: expected a run record (a JSON object), found {type(held).__name__}")
    for key in ("run_id", "dataset"):
        if not isinstance(held.get(key), str) or not NAME.fullmatch(held[key]):
            raise ClusterError(f"{where} refused: {key} expected {NAMED}, found {held.get(key)!r}")
    if held["run_id"] != folder:
        raise ClusterError(f"{where} refused: run_id expected {folder!r} (its folder's name), found {held['run_id']!r}")


@dataclass
class Run:
    """What the controller remembers of a run (reports/<id>/run.json)."""

    run_id: str
    hosts: list[str]
    preset: str
    overrides: list[str]
    dataset: str
    master_port: int = 29500
    update_freq: int = 1
    update_freq_given: bool = False  # the user's --update-freq: kept; else derived (train.plan.batching)
    # --comm auto's accumulation beyond the recipe's (model.choose: update_freq x 2 or x 4 on a slow
    # link): every new world's derived update_freq is multiplied by it, so the chosen strategy lasts
    update_freq_scale: int = 1
    max_tokens: int | None = None  # derived from the preset's tokens per update (train.plan.batching)
    max_tokens_cap: int | None = None  # the largest max_tokens the GPUs hold (memory model), as derived
    # checkpoints every ~10 minutes of this run's measured or predicted step (train.run.interval.choose)
    save_interval_updates: int | None = None
    gpu_name: str | None = None  # rank 0's GPU as NVML names it (the probe): MFU's peak (train.plan.mfu)
    precision: str = "fp32"
    comm: str = "sync"  # train.recipe.strategies.Strategy, `auto` already resolved
    link_mbps: float | None = None  # the cluster link as measured when the run started
    members: list[dict] = field(default_factory=list)  # which hosts from which update (the keepers' timeline)
    order: list[str] = field(default_factory=list)  # every host the keepers know, in rank order (train.run.keepers)
    data_manifest: str | None = None  # the dataset's MANIFEST.sha256 checksum it trains on (a moved run checks it)
    ranks_per_host: int = 1  # every host's ranks as it last started (train.cluster.Host.ranks)
    checkpoints_to: str | None = None  # where the hosts copy checkpoints off the cluster (train.run.offsite)
    checkpoints_every_min: float | None = None  # checkpoint_last's interval there (None: train.run.offsite's 30)
    created: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))

    @property
    def remote_dir(self) -> str:
        return f"{paths.RUNS_ROOT}/{self.run_id}"

    @property
    def data_dir(self) -> str:
        return f"{paths.DATA_ROOT}/{self.dataset}"

    @property
    def local_dir(self) -> Path:
        return REPORTS / self.run_id

    def hosts_of(self, hosts: list[Host]) -> list[Host]:
        """Those of `hosts` this run ran on, in rank order (rank 0 first)."""
        by_name = {h.name: h for h in hosts}
        chosen = [by_name[n] for n in self.hosts if n in by_name]
        if not chosen:
            raise ClusterError(f"run {self.run_id} ran on {', '.join(self.hosts)}; none of them is among "
                               f"{', '.join(by_name) or 'the hosts given'}")
        return chosen

    def known_of(self, hosts: list[Host]) -> list[Host]:
        """Those of `hosts` the run's keepers know (its members now and the hosts it may take back)."""
        by_name = {h.name: h for h in hosts}
        return [by_name[n] for n in (self.order or self.hosts) if n in by_name] or self.hosts_of(hosts)

    def resolved_preset(self) -> presets.Preset:
        """The preset with the user's overrides, and max_tokens and save_interval_updates as derived
        for the run unless the user set them; the heartbeat and collective timeouts sized to the bytes
        over the measured link."""
        preset = presets.resolve(self.preset, self.overrides, ranks=len(self.hosts) * self.ranks_per_host,
                                 link_mbps=self.link_mbps)
        if self.max_tokens and not presets.overridden(self.overrides, "max_tokens"):
            preset.options["max_tokens"] = self.max_tokens
        if self.save_interval_updates and not presets.overridden(self.overrides, "save_interval_updates"):
            preset.options["save_interval_updates"] = self.save_interval_updates
        return preset

    @property
    def max_update(self) -> int | None:
        value = self.resolved_preset().options.get("max_update")
        return int(value) if value else None

    def save(self) -> None:
        """reports/<id>/run.json, and reports/latest pointing to it; never anywhere else (an id not a name)."""
        if not isinstance(self.run_id, str) or not NAME.fullmatch(self.run_id):
            raise ClusterError(f"no record written for run_id {self.run_id!r}: expected {NAMED}")
        self.local_dir.mkdir(parents=True, exist_ok=True)
        (self.local_dir / "run.json").write_text(json.dumps(asdict(self), indent=2))
        latest = REPORTS / "latest"
        latest.unlink(missing_ok=True)
        latest.symlink_to(self.run_id)

    @classmethod
    def load(cls, run_id: str | None) -> Run:
        path = REPORTS / (run_id or "latest") / "run.json"
        if not path.exists():
            raise ClusterError(f"no run {run_id or '(latest)'} on this controller: start one with `fab train`")
        return cls(**json.loads(path.read_text()))


def new_run_id() -> str:
    return datetime.now().strftime("run-%Y%m%d-%H%M%S")
