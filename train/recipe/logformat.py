"""Read fairseq's training log (`--log-format json`) into records, and progress from them.

fairseq writes, among other lines:

    2026-11-22 07:52:58 | INFO | train_inner | {"epoch": 2, "update": 1.087, "loss": "7.734",
        ..., "wps": "17524.5", "ups": "2.74", "wpb": "6392.5", "num_updates": "50", ..., "wall": "23"}
    ... | INFO | valid | {"epoch": 2, "valid_loss": "7.371", ..., "valid_num_updates": "50"}
    ... | INFO | train | {"epoch": 2, "train_loss": "6.697", ..., "train_wall": "43"}
    ... | INFO | fairseq_cli.train | training on 2 devices (GPUs/TPUs)

Values are strings; `train`/`valid` lines prefix their keys (`valid_loss`); `wall` (seconds
since the process started) restarts at 0 after a resume. `parse_log` turns lines into
`Record`s with numbers and unprefixed keys; `progress` answers "where is the run": last
update, max update, loss, seconds per update, words per second, ETA.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

_TAGGED = re.compile(
    r"^(?P<time>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) \| (?P<level>[A-Z]+) \| (?P<tag>[\w.]+) \| (?P<body>.*)$"
)
_DEVICES = re.compile(r"training on (\d+) devices")
_MAX_UPDATE = re.compile(r"'max_update': (\d+)")
_DONE = re.compile(r"done training in ([0-9.]+) seconds")
_STOPPING = re.compile(r"Stopping training due to")
_RESUME = re.compile(r"Loaded checkpoint (\S+) \(epoch (\d+) @ (\d+) updates\)")
_SAVED = re.compile(r"Saved checkpoint (\S+) \(epoch (\d+) @ (\d+) updates")  # after checkpoint_last.pt too
STAT_TAGS = ("train_inner", "train", "valid")


def _number(value: object) -> object:
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return value
        return int(number) if number.is_integer() and "." not in value else number
    return value


@dataclass(frozen=True)
class Record:
    """One statistics line: `kind` is train_inner, train or valid; `stats` has numbers
    under unprefixed keys (`loss`, `num_updates`, `wall`, ...)."""

    kind: str
    time: str
    stats: dict[str, object]

    def get(self, key: str, default: float | None = None) -> float | None:
        value = self.stats.get(key, default)
        return float(value) if isinstance(value, int | float) else default

    @property
    def update(self) -> int | None:
        value = self.get("num_updates")
        return int(value) if value is not None else None


@dataclass
class Log:
    """Everything `parse_log` learned from a log."""

    records: list[Record] = field(default_factory=list)
    devices: int | None = None  # "training on N devices": the world size rank 0 saw
    max_update: int | None = None
    resumed_from: list[int] = field(default_factory=list)  # update numbers loaded at each start
    saved: list[int] = field(default_factory=list)  # update numbers of the checkpoints saved (rank 0)
    finished: bool = False
    errors: list[str] = field(default_factory=list)

    def of(self, kind: str) -> list[Record]:
        return [r for r in self.records if r.kind == kind]


def parse_record(line: str) -> Record | None:
    """The Record on `line`, or None if it is not a statistics line."""
    match = _TAGGED.match(line.strip())
    if not match or match["tag"] not in STAT_TAGS:
        return None
    try:
        raw = json.loads(match["body"])
    except ValueError:
        return None
    kind = match["tag"]
    prefix = "" if kind == "train_inner" else kind + "_"
    stats = {}
    for key, value in raw.items():
        if prefix and key.startswith(prefix):
            key = key[len(prefix) :]
        stats[key] = _number(value)
    return Record(kind, match["time"], stats)


def parse_log(lines: Iterable[str]) -> Log:
    """Parse a whole log (an open file, or a list of lines)."""
    log = Log()
    for line in lines:
        record = parse_record(line)
        if record:
            log.records.append(record)
            continue
        if match := _DEVICES.search(line):
            log.devices = int(match.group(1))
        elif match := _MAX_UPDATE.search(line):
            log.max_update = int(match.group(1))
        elif match := _RESUME.search(line):
            log.resumed_from.append(int(match.group(3)))
        elif match := _SAVED.search(line):
            log.saved.append(int(match.group(3)))
        elif _DONE.search(line) or _STOPPING.search(line):
            log.finished = bool(_DONE.search(line)) or log.finished
        elif "Traceback (most recent call last)" in line or "| ERROR |" in line:
            log.errors.append(line.rstrip())
    return log


@dataclass(frozen=True)
class Progress:
    """Where a run stands, from rank 0's log."""

    update: int
    max_update: int | None
    loss: float | None
    valid_loss: float | None
    seconds_per_update: float | None
    wps: float | None
    wpb: float | None
    devices: int | None
    finished: bool
    saved: int | None = None  # the update of the last checkpoint saved (train.run.rejoin waits on it)

    @property
    def eta_seconds(self) -> float | None:
        if self.max_update is None or self.seconds_per_update is None:
            return None
        return max(self.max_update - self.update, 0) * self.seconds_per_update

    @property
    def fraction(self) -> float | None:
        return self.update / self.max_update if self.max_update else None


def timestamp(text: str) -> datetime:
    """A log line's `YYYY-MM-DD HH:MM:SS` (the host's local time)."""
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S")


_PARAMS = re.compile(r"num\. (?:shared )?model params: ([\d,]+)")


def logged_params(log_text: str) -> int | None:
    """The model's parameter count as fairseq logs it at start-up."""
    match = _PARAMS.search(log_text)
    return int(match.group(1).replace(",", "")) if match else None


def seconds_per_update(records: list[Record], window: int = 10) -> float | None:
    """Seconds per update over the last `window` train_inner lines of the current segment.

    (wall_last − wall_first) / (update_last − update_first) over those lines: validation and
    checkpoint saves between them count, as they do for the ETA. `wall` is whole seconds, so
    a span of several lines is more precise than one interval. A segment ends where `wall`
    goes backwards (a resume restarted the clock). With fewer than two lines in the current
    segment, 1 / ups of the last line.
    """
    inner = [r for r in records if r.kind == "train_inner" and r.update is not None and r.get("wall") is not None]
    segment: list[Record] = []
    for record in inner:
        if segment and (record.get("wall", 0) < segment[-1].get("wall", 0) or record.update <= segment[-1].update):  # type: ignore[operator]
            segment = []
        segment.append(record)
    span = segment[-(window + 1) :]
    if len(span) >= 2:
        first, last = span[0], span[-1]
        updates = (last.update or 0) - (first.update or 0)
        seconds = last.get("wall", 0) - first.get("wall", 0)  # type: ignore[operator]
        if seconds <= 0:  # after a resume fairseq may log wall 0 throughout: use the line times
            seconds = (timestamp(last.time) - timestamp(first.time)).total_seconds()
        return seconds / updates
    if inner:
        ups = inner[-1].get("ups")
        if ups:
            return 1.0 / ups
    return None


def progress(log: Log, max_update: int | None = None) -> Progress:
    """Progress from a parsed log; `max_update` overrides the one found in the log."""
    inner = log.of("train_inner")
    updates = [r.update for r in log.records if r.update is not None]
    last_inner = inner[-1] if inner else None
    valid = log.of("valid")
    return Progress(
        update=max(updates) if updates else (log.resumed_from[-1] if log.resumed_from else 0),
        max_update=max_update if max_update is not None else log.max_update,
        loss=last_inner.get("loss") if last_inner else None,
        valid_loss=valid[-1].get("loss") if valid else None,
        seconds_per_update=seconds_per_update(log.records),
        wps=last_inner.get("wps") if last_inner else None,
        wpb=last_inner.get("wpb") if last_inner else None,
        devices=log.devices,
        finished=log.finished,
        saved=log.saved[-1] if log.saved else None,
    )


def format_eta(seconds: float | None) -> str:
    """`1h02m`, `3m20s`, `45s`, or `?`."""
    if seconds is None:
        return "?"
    seconds = int(round(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"


@dataclass(frozen=True)
class RankEnd:
    """How torchrun saw a rank end (its 'Root Cause' block): which rank, how, and when."""

    rank: int | None
    how: str  # "killed by SIGKILL", "exited with code 1"
    time: str  # as torchrun printed it, e.g. 2026-11-23_02:58:01
    peer_gone: bool = False  # the rank said a peer went away first: it fell, it did not fail
    error: str = ""  # the last exception the rank raised (`ValueError: ...`), before torchrun's report

    def blame_order(self) -> tuple:
        """Sort key, culprit first: a rank that lost a peer comes after one that did not, then the
        earliest (torchrun's clock has whole seconds), then a signal (a crash, the OOM killer)
        before an exit code (a survivor's error when its peer's socket closed)."""
        return self.peer_gone, self.time, not self.how.startswith("killed")


# what a rank logs when it ends because another one went away (gloo, NCCL, fairseq's heartbeat)
PEER_GONE = re.compile(r"Connection (?:closed|reset) by peer|Killing job for not making progress|Broken pipe"
                       r"|NCCL communicator was aborted|Watchdog caught collective operation timeout"
                       r"|Socket Timeout|ECONNRESET|remote process exited or there was a network error"
                       r"|tandem watchdog: peer \S+ has not answered", re.I)
# torchrun's report of a failed worker, from its own error line to the end: it repeats what
# the state column says, and its "[0]:" header would pass for the last thing the rank said
TORCHRUN_REPORT = re.compile(r"failed \(exitcode: -?\d+\) local_rank: \d+")


# the line a Python traceback ends with (fairseq's, the rank's own), not torchrun's ChildFailedError
EXCEPTION = re.compile(r"^(?:\[\d+\]:\s*)?((?!torch\.distributed\.elastic)[A-Za-z_][\w.]*(?:Error|Exception)\b:?.*)$")
FROZEN = re.compile(r"tandem watchdog: process \d+ of the run was stopped \(frozen\) for (\d+) s")
PEER_SILENT = re.compile(r"tandem watchdog: peer (\S+) has not answered on the cluster network for (\d+) s")


def rank_end(lines: list[str]) -> RankEnd | None:
    """The last failure torchrun reported in these log lines, None when it reported none."""
    text = "\n".join(lines)
    block = text.rsplit("Root Cause (first observed failure):", 1)
    if len(block) < 2:
        silent = next((m for line in lines[-20:] if (m := PEER_SILENT.search(line))), None)
        if silent:  # the watchdog's SIGTERM: torchrun shuts its workers down without a report
            return RankEnd(None, f"ended by tandem's watchdog: peer {silent.group(1)} silent {silent.group(2)} s",
                           "", peer_gone=True)
        return None
    before, body = block
    rank = re.search(r"^\s*rank\s*:\s*(\d+)", body, re.M)
    code = re.search(r"exitcode\s*:\s*(-?\d+)", body)
    signal = re.search(r"Signal \d+ \((SIG\w+)\)", body)
    when = re.search(r"^\s*time\s*:\s*(\S+)", body, re.M)
    how = f"killed by {signal.group(1)}" if signal else f"exited with code {code.group(1) if code else '?'}"
    last_words = before.splitlines()[-80:]  # what the rank said just before it ended
    frozen = next((m for line in last_words if (m := FROZEN.search(line))), None)
    if frozen:  # train.agent.measure.monitor's watchdog: the SIGKILL was tandem's, the cause a freeze
        how = f"frozen (stopped {frozen.group(1)} s), killed by tandem's watchdog"
    raised = [m.group(1) for line in meaningful(last_words) if (m := EXCEPTION.search(line))]
    return RankEnd(int(rank.group(1)) if rank else None, how, when.group(1) if when else "",
                   peer_gone=any(PEER_GONE.search(line) for line in last_words), error=raised[-1] if raised else "")


# warnings and their indented source lines, and torchrun's ==== / ---- rules
NOISE = re.compile(r"Warning:|warnings\.warn|deprecation_warning|^\s|^[=-]{5,}$")


def meaningful(lines: list[str]) -> list[str]:
    """The lines that say something about the run: without Python's warnings (PyTorch's, hydra's)
    and the indented source lines that follow them, and before torchrun's failure report."""
    report = next((i for i, line in enumerate(lines) if TORCHRUN_REPORT.search(line)), len(lines))
    return [line for line in lines[:report] if line.strip() and not NOISE.search(line)]


def message(line: str) -> str:
    """A log line without fairseq's `date | LEVEL | logger |` prefix: what it says."""
    parts = line.split(" | ")
    return parts[-1].strip() if len(parts) >= 4 else line.strip()
