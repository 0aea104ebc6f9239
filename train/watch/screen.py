"""What the view shows, from what the hosts said: pure, so the unit tests render recorded readings.

The run's figures and the verdict come from the report's analysis (train.report.answers) fed
with the live log and the samples of the last `window_s` seconds: the same definitions as
`fab report` (NIC throughput = the busier direction; network-bound = the link busy at least half
the time; GPUs fully used at 90%), over a recent window instead of the whole run.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..agent.keeper.generation import change_line
from ..cluster import ranks_label
from ..recipe.logformat import progress
from ..report import answers, series
from .feed import Reading

WINDOW_S = 30.0  # the verdict's window: long enough for several samples, short enough to follow a cap
# The log lines analysed each refresh: parsing is ~40 µs a line, and a long run's 50k lines would
# take seconds of a refresh; the last 2000 hold the recent intervals (the median is over those).
LOG_LINES = 2000


@dataclass(frozen=True)
class Gpu:
    index: int
    util_percent: float | None
    mem_used_mb: float | None
    mem_total_mb: float | None


@dataclass(frozen=True)
class HostRow:
    name: str
    ranks: str  # "0", or "2-3" on a host with two ranks (GPUs, or cpu_ranks)
    state: str  # connecting, running, stopped, unreachable
    gpus: list[Gpu] | None  # None: no GPU on this host (absent, not 0 %)
    tx_mbps: float | None
    rx_mbps: float | None
    cpu_percent: float | None
    why: str | None = None  # why unreachable, and since when

    @property
    def nic_mbps(self) -> float | None:
        """The busier direction, as the report counts it."""
        known = [x for x in (self.tx_mbps, self.rx_mbps) if x is not None]
        return max(known) if known else None


@dataclass(frozen=True)
class RunRow:
    update: int
    max_update: int | None
    loss: float | None
    last_s: float | None  # the last logged interval's s/update
    median_s: float | None  # median over the intervals in the last LOG_LINES lines
    wps: float | None
    eta_s: float | None
    finished: bool
    fill: float | None = None  # target words an update over max_tokens x update_freq x ranks


@dataclass(frozen=True)
class Screen:
    run_id: str
    at: float  # time.time() of this refresh
    link_mbps: float | None
    link_source: str
    hosts: list[HostRow]
    run: RunRow
    verdict: str
    membership: tuple[str, ...] = ()  # the keepers' last membership changes, one line each (oldest first)


def ranks_of(host_index: int, per_host: int) -> str:
    """The global ranks of the host at `host_index` when every host runs `per_host` ranks: '2-3'."""
    per_host = max(per_host, 1)
    return ranks_label(range(host_index * per_host, (host_index + 1) * per_host))


def host_row(reading: Reading, now: float) -> HostRow:
    last = reading.samples[-1] if reading.samples else {}
    mbps = {k: v * 8 / 1e6 if isinstance(v, int | float) else None
            for k in ("tx_Bps", "rx_Bps") for v in [last.get(k)]}
    gpus = None
    if last.get("gpus"):
        gpus = [Gpu(int(g.get("index", i)), g.get("util_percent"), g.get("mem_used_mb"), g.get("mem_total_mb"))
                for i, g in enumerate(last["gpus"])]
    if not reading.reachable and reading.error is None and reading.answered_at is None:
        state, why = "connecting", None
    elif not reading.reachable:
        state = "unreachable"
        silent = f"no answer for {now - reading.answered_at:.0f} s" if reading.answered_at else "no answer yet"
        why = f"{silent} ({reading.error})" if reading.error else silent
    else:
        state, why = ("running" if reading.running else "stopped"), None
    per_host = reading.ranks if reading.ranks is not None else reading.gpus
    return HostRow(reading.name, ranks_of(reading.rank, per_host), state, gpus, mbps["tx_Bps"], mbps["rx_Bps"],
                   last.get("cpu_percent"), why)


def build(run: dict, readings: list[Reading], now: float, link_mbps: float | None = None,
          window_s: float = WINDOW_S) -> Screen:
    """The screen for one refresh. `run` is the run's run.json; `link_mbps` the inventory's
    expected link (a measured one, from `fab train`'s start or bench-net, wins, as in the report)."""
    # the window ends at the newest sample: a finished run (its monitors gone) keeps its last verdict
    newest = min(max((s["t"] for r in readings for s in r.samples), default=now), now)
    recent = {r.name: [s for s in r.samples if s["t"] >= newest - window_s] for r in readings}
    rank0 = readings[0]
    data = answers.from_texts(run, {rank0.name: rank0.log_lines[-LOG_LINES:]}, {n: s for n, s in recent.items() if s})
    ivs = series.intervals(data)
    net = answers.answer_network(data, ivs, link_mbps)
    gpus = answers.answer_gpus(data, ivs)
    step = answers.answer_step_time(data, ivs)
    p = progress(data.log, data.options.get("max_update") or data.log.max_update)
    rate, source = series.link(data, link_mbps)
    run_row = RunRow(p.update, p.max_update, p.loss, ivs[-1].step_s if ivs else None, step.numbers.get("median_s"),
                     p.wps, p.eta_seconds, p.finished, series.run_fill(data))
    hosts = [host_row(r, now) for r in readings]
    return Screen(str(run.get("run_id", "?")), now, rate, source, hosts, run_row,
                  answers.verdict_line(net, gpus) if data.samples else "waiting for samples",
                  membership_lines(readings))


def membership_lines(readings: list[Reading], last: int = 3) -> tuple[str, ...]:
    """The last membership changes any host's keeper recorded (each once), in a line each."""
    seen, entries = set(), []
    for reading in readings:
        for entry in reading.membership:
            key = (entry.get("generation"), tuple(entry.get("hosts") or ()))
            if key not in seen:
                seen.add(key)
                entries.append(entry)
    entries.sort(key=lambda e: (e.get("generation") or 0, e.get("time") or 0))
    if len(entries) < 2:  # the start alone is no change
        return ()
    return tuple(change_line(e) for e in entries[-last:])
