"""What the hosts say, read live: one persistent SSH connection per host, new bytes only.

Every poll asks all hosts at once, in one round trip each, for whether the run's processes are
alive and for what was appended to samples.jsonl (every host) and train.log (rank 0: only it logs
the statistics) since the last poll. A host that has not answered within `timeout_s` is marked
unreachable at once, so the view goes on with the others; its request is left to finish (a slow
link is not a dead host) for GIVE_UP_S, then its connection is closed and a new one tried.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field

from ..cluster import Host, connect

FIRST_READ_BYTES = 600_000  # a long run's log is read from its end (≈2000 statistics lines), not its start
KEEP_SAMPLES = 600  # 20 min at the monitor's 2 s
KEEP_LOG_LINES = 50_000  # rank 0 logs a statistics line every log_interval updates
CONNECT_S = 10.0  # SSH connect and handshake; a host never reached yet is "connecting" meanwhile
GIVE_UP_S = 20.0  # a request this old is abandoned (its connection closed) and the host reconnected
SECTION = "@@tandem-watch"
TIMELINE = "keeper/timeline.jsonl"  # every membership change the host's keeper recorded


@dataclass
class Reading:
    """What one host said so far: the view's input, and what the unit tests record."""

    name: str
    rank: int
    gpus: int  # promised by the inventory
    reachable: bool = False
    running: bool | None = None  # None: not asked yet
    samples: list[dict] = field(default_factory=list)
    log_lines: list[str] = field(default_factory=list)  # rank 0 only
    error: str | None = None
    answered_at: float | None = None  # time.time() of the last answer
    ranks: int | None = None  # ranks on this host (train.cluster.Host.ranks); None: one per GPU, at least one
    membership: list[dict] = field(default_factory=list)  # its keeper's record (train.agent.keeper.loop), oldest first


def read_command(run_dir: str, offsets: dict[str, int], with_log: bool) -> str:
    """One shell line: running or not, then each file's size, start offset and new bytes."""
    q = shlex.quote
    save_dir = f"{run_dir.rstrip('/')}/checkpoints"
    # `[-]-save-dir` matches the run's processes but not this shell, whose command line holds the pattern
    parts = [f"if pgrep -f -- {q('[-]-save-dir ' + save_dir)} >/dev/null; then echo {SECTION} running; "
             f"else echo {SECTION} stopped; fi"]
    for name in ("samples.jsonl", "train.log", TIMELINE) if with_log else ("samples.jsonl", TIMELINE):
        path, offset = q(f"{run_dir}/{name}"), offsets.get(name, 0)
        parts.append(
            f"s=$(stat -c %s {path} 2>/dev/null || echo 0); o={offset}; "
            f"if [ $o -eq 0 ] && [ $s -gt {FIRST_READ_BYTES} ]; then o=$((s - {FIRST_READ_BYTES})); fi; "
            f"if [ $o -gt $s ]; then o=0; fi; "  # the file was replaced: read it again
            f"echo {SECTION} {name} $s $o; "
            f"if [ $s -gt $o ]; then tail -c +$((o + 1)) {path} | head -c $((s - o)); fi; printf '\\n'")
    return "; ".join(parts)


def parse_answer(text: str) -> tuple[bool, dict[str, tuple[int, str]]]:
    """read_command's output → (running, {file: (offset read from, new text)})."""
    running, files = False, {}
    chunks = text.split(SECTION + " ")
    for chunk in chunks[1:]:
        head, _, body = chunk.partition("\n")
        fields = head.split()
        if fields[:1] == ["running"]:
            running = True
        elif len(fields) == 3:
            files[fields[0]] = (int(fields[2]), body[:-1] if body.endswith("\n") else body)
    return running, files


class HostFeed:
    """One host: its connection, how far each file was read, what it said."""

    def __init__(self, host: Host, rank: int, run_dir: str, with_log: bool, timeout_s: float):
        self.host, self.run_dir, self.with_log, self.timeout_s = host, run_dir, with_log, timeout_s
        self.reading = Reading(host.name, rank, host.gpus, ranks=host.ranks)
        self.offsets: dict[str, int] = {}
        self._partial: dict[str, str] = {}
        self._conn = None

    def read(self) -> None:
        if self._conn is None:
            self._conn = connect(self.host, timeout=CONNECT_S)
        result = self._conn.run(read_command(self.run_dir, self.offsets, self.with_log), hide=True, warn=True,
                                in_stream=False)
        running, files = parse_answer(result.stdout)
        for name, (start, text) in files.items():
            self._take(name, start, text)
        self.reading.running = running

    def _take(self, name: str, start: int, text: str) -> None:
        received = text
        if start != self.offsets.get(name, 0):  # read from elsewhere: a long file's tail, a replaced file
            self._partial[name] = ""
            if start > 0:  # began mid-line: drop that line's end
                text = text.partition("\n")[2]
        self.offsets[name] = start + len(received.encode())
        complete, _, self._partial[name] = (self._partial.get(name, "") + text).rpartition("\n")
        lines = complete.splitlines() if complete else []
        if name == "train.log":
            self.reading.log_lines = (self.reading.log_lines + lines)[-KEEP_LOG_LINES:]
        elif name == TIMELINE:
            self.reading.membership += [e for e in (_json(line) for line in lines) if isinstance(e, dict)]
        else:
            self.reading.samples = (self.reading.samples + samples_of(lines))[-KEEP_SAMPLES:]

    def mark(self, why: str) -> None:
        self.reading.reachable, self.reading.error = False, why

    def drop(self, why: str) -> None:
        """Mark unreachable and close the connection (a stuck request fails with it)."""
        self.mark(why)
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):  # already broken: nothing to close
                conn.close()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _json(line: str):
    try:
        return json.loads(line)
    except ValueError:
        return None


def samples_of(lines: list[str]) -> list[dict]:
    out = []
    for line in lines:
        try:
            sample = json.loads(line)
        except ValueError:
            continue
        if isinstance(sample, dict) and isinstance(sample.get("t"), int | float):
            out.append(sample)
    return out


class Feed:
    """All the hosts of a run (rank 0 first), polled together."""

    def __init__(self, run_dir: str, hosts: list[Host], timeout_s: float = 3.0):
        self.timeout_s = timeout_s
        self.hosts = [HostFeed(h, i, run_dir, i == 0, timeout_s) for i, h in enumerate(hosts)]
        self._pool = ThreadPoolExecutor(max_workers=2 * len(hosts))
        self._pending: dict[str, object] = {}
        self._asked: dict[str, float] = {}  # when the pending request was sent (monotonic)

    def poll(self) -> list[Reading]:
        """Ask every host; whoever has not answered within timeout_s is unreachable for this refresh."""
        for hf in self.hosts:
            if hf.host.name not in self._pending:
                self._pending[hf.host.name] = self._pool.submit(hf.read)
                self._asked[hf.host.name] = time.monotonic()
        wait(list(self._pending.values()), timeout=self.timeout_s)
        for hf in self.hosts:
            future = self._pending[hf.host.name]
            if not future.done():
                age = time.monotonic() - self._asked[hf.host.name]
                if hf.reading.answered_at is None and age < CONNECT_S:
                    continue  # still connecting: not yet a host that stopped answering
                if age > GIVE_UP_S:
                    hf.drop(f"no answer for {age:.0f} s, reconnecting")
                else:
                    hf.mark(f"no answer within {self.timeout_s:g} s")
                continue
            del self._pending[hf.host.name]
            if (err := future.exception()) is not None:
                hf.drop(f"{type(err).__name__}: {err}".strip(": ")[:120])
            else:
                hf.reading.reachable, hf.reading.error, hf.reading.answered_at = True, None, time.time()
        return [hf.reading for hf in self.hosts]

    def close(self) -> None:
        for hf in self.hosts:
            hf.drop("closed") if hf.host.name in self._pending else hf.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
