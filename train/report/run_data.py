"""A collected run, read: the files `fab report` brought under `reports/<run_id>/`, or the log lines and
samples `fab watch` reads live, parsed into one `RunData` (no arithmetic on it, no answers).

`load(run_dir)` reads:

    run.json                the run (run_id, hosts, preset, overrides, ...); rank 0 = hosts[0]
    logs/<host>.log         each host's fairseq log (rank 0's has the statistics lines)
    samples/<host>.jsonl    the sampler's lines: {"t", "host", "nic", "tx_Bps", "rx_Bps",
                            "cpu_percent", "mem_used_mb", "mem_total_mb", "gpus": null | [...]}
    bench/*.json            optional: bench-net ({"link_mbps": ...}) and bench-step results
    bleu.json               optional: sacrebleu's JSON ({"score": ...})
    checkpoints.txt         optional: `ls -l --time-style=+%s <save_dir>` on rank 0
    corpus.json             optional: {"train_lines", "train_mb", "vocab_size"}
    cost.json, offsite.json optional: written by `fab report` (read by the answers, train.report.answers)

Log times (`YYYY-mm-dd HH:MM:SS`, the host's local time, no zone) are read as the controller's local
time; if that puts the log and the samples apart, they are shifted by the whole quarter-hours that line
them up (a host in another time zone).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from train.recipe import presets
from train.recipe.logformat import Log, Record, logged_params, parse_log, timestamp

_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) \| ")
_START = re.compile(r"\| fairseq_cli\.train \| \{'_name'")


@dataclass
class Checkpoint:
    name: str
    size: int  # bytes
    mtime: int | None = None  # unix seconds


@dataclass
class RunData:
    """Everything collected for one run, parsed."""

    run_dir: Path
    run: dict
    hosts: list[str]
    options: dict  # the resolved fairseq options (train.recipe.presets)
    log: Log  # rank 0's
    logs: dict[str, Log]
    log_times: list[float]  # unix times of rank 0's timestamped lines
    starts: list[float]  # unix times at which fairseq (re)started, from rank 0's log
    params: int | None
    samples: dict[str, list[dict]]
    bench: list[dict]
    bleu: dict | None
    checkpoints: list[Checkpoint] | None
    corpus: dict | None
    tails: dict[str, str] = field(default_factory=dict)  # each host's last log line
    time_shift_s: float = 0.0  # added to log times to line them up with the samples
    rank0_logs: list[str] = field(default_factory=list)  # the hosts whose logs hold rank 0's progress, in turn

    @property
    def rank0(self) -> str | None:
        return self.hosts[0] if self.hosts else None

    def when(self, record: Record) -> float:
        return log_time(record.time) + self.time_shift_s


def log_time(text: str) -> float:
    """A log timestamp as unix seconds (the controller's local time zone)."""
    return timestamp(text).timestamp()


def parse_checkpoints(text: str) -> list[Checkpoint]:
    """`ls -l --time-style=+%s` lines → checkpoints (files only; `total` and dirs skipped).

        -rw-r--r-- 1 root root 3662769 1795335330 checkpoint_best.pt
    """
    out = []
    for line in text.splitlines():
        fields = line.split(None, 6)
        if len(fields) < 7 or not fields[0].startswith("-"):
            continue
        try:
            size, mtime = int(fields[4]), int(fields[5])
        except ValueError:
            continue
        out.append(Checkpoint(fields[6].strip(), size, mtime))
    return out


def read_samples(path: Path) -> list[dict]:
    """The sampler's JSON lines, sorted by time; bad lines (a sampler killed mid-write) skipped."""
    samples = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            sample = json.loads(line)
        except ValueError:
            continue
        if isinstance(sample, dict) and isinstance(sample.get("t"), int | float):
            samples.append(sample)
    return sorted(samples, key=lambda s: s["t"])


def read_json(path: Path) -> dict | None:
    """A JSON object from a file; None when it is missing, unreadable or not an object."""
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def resolve_options(run: dict) -> dict:
    try:
        return dict(presets.resolve(run.get("preset", ""), run.get("overrides") or []).options)
    except presets.OverrideError:
        return {}


def load(run_dir: Path) -> RunData:
    """Read a collected run directory (see the module docstring for its files)."""
    run_dir = Path(run_dir)
    run = read_json(run_dir / "run.json") or {}
    texts = {p.stem: p.read_text(errors="replace").splitlines() for p in sorted((run_dir / "logs").glob("*.log"))}
    samples = {p.stem: read_samples(p) for p in sorted((run_dir / "samples").glob("*.jsonl"))}
    bench = [b for p in sorted((run_dir / "bench").glob("*.json")) if (b := read_json(p)) is not None]
    ckpt = run_dir / "checkpoints.txt"
    return from_texts(run, texts, samples, run_dir=run_dir, bench=bench, bleu=read_json(run_dir / "bleu.json"),
                      checkpoints=parse_checkpoints(ckpt.read_text()) if ckpt.exists() else None,
                      corpus=read_json(run_dir / "corpus.json"))


def from_texts(run: dict, texts: dict[str, list[str]], samples: dict[str, list[dict]], *, run_dir: Path = Path(),
               bench: list[dict] | None = None, bleu: dict | None = None, checkpoints: list[Checkpoint] | None = None,
               corpus: dict | None = None) -> RunData:
    """A run from its log lines and samples in memory: what `load` reads from files, and what
    `fab watch` reads live from the hosts (the same analysis for both)."""
    from train.report import members

    hosts = list(run.get("hosts") or texts)
    logs = {host: parse_log(lines) for host, lines in texts.items()}
    rank0 = hosts[0] if hosts else None
    lines = texts.get(rank0, []) if rank0 else []
    # rank 0 moved to another host when its host was lost (Run.members): each rank 0's log in turn
    ranks0 = [h for h in members.rank0_hosts(run.get("members")) if h in texts]
    merged = len(ranks0) > 1 and rank0 in ranks0
    if merged:
        lines = [line for h in ranks0 for line in texts[h]]
    log_times, starts, params = [], [], None
    for line in lines:
        if match := _TIME.match(line):
            log_times.append(log_time(match.group(1)))
            if _START.search(line):
                starts.append(log_times[-1])
        params = params or logged_params(line)
    log = parse_log(lines) if merged else (logs.get(rank0) if rank0 else None)
    data = RunData(
        run_dir=Path(run_dir), run=run, hosts=hosts, options=resolve_options(run), log=log or Log(), logs=logs,
        log_times=log_times, starts=starts, params=params, samples=samples, bench=list(bench or []),
        bleu=bleu, checkpoints=checkpoints, corpus=corpus,
        tails={h: next((x for x in reversed(t) if x.strip()), "") for h, t in texts.items()},
    )
    data.time_shift_s = time_shift(data)
    data.rank0_logs = ranks0 if merged else ([rank0] if rank0 else [])
    return data


def time_shift(data: RunData) -> float:
    """0 when the log and the samples overlap; else the quarter-hours that make them overlap."""
    times = [s["t"] for ss in data.samples.values() for s in ss]
    if not times or not data.log_times:
        return 0.0
    lo, hi = min(data.log_times), max(data.log_times)
    if lo <= max(times) and min(times) <= hi:
        return 0.0
    shift = round((min(times) - lo) / 900) * 900
    if lo + shift <= max(times) and min(times) <= hi + shift:
        return float(shift)
    return 0.0
