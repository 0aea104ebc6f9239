"""What a run has cost, and what the cluster costs while it sits idle after it (`fab status`, the
report). tandem never stops or deletes a VM: it says how long the hosts have been idle, what an
hour of that costs (the inventory's `hourly_usd`, train.plan.price) and the command that would stop
paying: the inventory's `stop_command` per host when it gives one, else the providers' usual ones.

- idle: since the newest write to any host's train.log (each host's own clock: its `date` less the
  log's mtime), when no rank is running;
- the run's cost so far: every host it trained on (its members, lost ones too) × the hours from
  the run's creation to now (to the end of the run when it is idle) × their price: restarts, and the
  gaps between them, are billed hours too.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from datetime import UTC, datetime

from ..cluster import Host, run_all
from ..plan import model, price
from ..recipe.record import Run

PROVIDERS_STOP = ("e.g. `aws ec2 stop-instances --instance-ids ID`, `gcloud compute instances stop NAME`, "
                  "`az vm deallocate -g GROUP -n NAME` (a VM shut down from inside still bills on Azure)")


@dataclass(frozen=True)
class Cost:
    hosts: list[str]  # every host the run trained on
    usd_per_hour: float | None  # of the hosts still in the run (what idling costs); None: a price missing
    billed_hours: float  # from the run's creation to its end (or now, while it runs)
    run_usd: float | None  # what the hosts it trained on cost over those hours
    idle_s: float | None  # since the last log write, when no rank runs
    unpriced: list[str]
    stop_hint: str

    def lines(self) -> list[str]:
        out = []
        if self.run_usd is not None:
            out.append(f"cost so far: {price.dollars(self.run_usd)} ({len(self.hosts)} host"
                       f"{'s' if len(self.hosts) > 1 else ''} × {self.billed_hours:.2f} h since the run started, "
                       "restarts and the gaps between them included)")
        else:
            out.append(f"cost so far: unknown, no {price.PRICE_VAR} in the inventory for {', '.join(self.unpriced)} "
                       f"({self.billed_hours:.2f} h since the run started)")
        if self.idle_s is not None:
            cost = f"{price.dollars(self.usd_per_hour)}/h" if self.usd_per_hour is not None else "an unknown price"
            out.append(f"the cluster has been idle {model.duration(self.idle_s)} since the run's last log line, "
                       f"at {cost}; tandem stops no VM: to stop paying, stop them at the provider: {self.stop_hint}")
        return out

    def as_dict(self) -> dict:
        return {"hosts": self.hosts, "usd_per_hour": self.usd_per_hour, "billed_hours": self.billed_hours,
                "run_usd": self.run_usd, "idle_s": self.idle_s, "unpriced": self.unpriced,
                "stop_hint": self.stop_hint}


def trained_on(run: Run) -> list[str]:
    """Every host the run ever trained on, in the order they came."""
    names = [n for m in run.members for n in m.get("hosts", [])] + list(run.hosts)
    return list(dict.fromkeys(names))


def log_ages(run: Run, hosts: list[Host]) -> dict[str, float]:
    """Seconds since each reachable host last wrote the run's train.log (its own clock)."""
    log = shlex.quote(f"{run.remote_dir}/train.log")
    results = run_all(hosts, f"t=$(stat -c %Y {log}) && echo $(( $(date +%s) - t ))", timeout=15)
    return {name: float(r.stdout.strip()) for name, r in results.items() if r.ok and r.stdout.strip().isdigit()}


def stop_hint(hosts: list[Host]) -> str:
    """The inventory's `stop_command` of each host, else the providers' usual commands."""
    given = [f"{h.name}: `{command}`" for h in hosts if (command := h.var("stop_command"))]
    return "; ".join(given) if given else PROVIDERS_STOP


def cost(run: Run, known: list[Host], running: bool, ages: dict[str, float] | None = None,
         now: datetime | None = None) -> Cost:
    """The run's cost so far and, when no rank runs, the idle time. `known`: the inventory's hosts
    (the run's own and those it lost); `ages`: log_ages, measured when None and not running."""
    now = now or datetime.now(UTC)
    by_name = {h.name: h for h in known}
    used = [by_name[n] for n in trained_on(run) if n in by_name]
    current = [by_name[n] for n in run.hosts if n in by_name]
    if not running and ages is None:
        ages = log_ages(run, current)
    idle = min(ages.values()) if not running and ages else None
    started = datetime.fromisoformat(run.created)
    if started.tzinfo is None:
        started = started.replace(tzinfo=UTC)
    hours = max((now - started).total_seconds() - (idle or 0.0), 0.0) / 3600
    missing = price.unpriced(used) + [n for n in trained_on(run) if n not in by_name]
    total = None if missing else sum(price.hourly_usd(h) for h in used) * hours  # type: ignore[misc]
    return Cost(trained_on(run), price.cluster_hourly_usd(current) if current else None, hours, total, idle,
                missing, stop_hint(current))
