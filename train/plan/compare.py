"""Every way to run the same training on these hosts, side by side: 1 host, 2, ..., N (the first
k of the hosts as given) × each `--comm` tandem would consider (the rungs of `--comm auto`'s one
ladder, train.recipe.strategies.ladder: sync, fp16 compression, a larger --update-freq, local SGD,
...), priced by the cost model (train.plan.model) from the same figures:
the compute-only time per batch and the link measured now.

Every row trains on the same samples as the run asked for (max_update × its batches per update),
so hours and dollars compare: hours = those batches / the row's batches per second. A row with
fewer hosts keeps the run's batch per update with --update-freq (its updates are the same as the
run's, only slower or faster); when the hosts do not divide, the batch shrinks and the row says so.

The verdict names the fastest and the cheapest (when every host has a price) and, when a run
with fewer hosts trains the same updates faster than the one asked for, says so: "one host is
faster than two on this link". `fab train` refuses such a run unless told.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from train.cluster import Host
from train.recipe import strategies
from train.recipe.strategies import update_freq as update_freq_rung

from . import model, price

TARGET = 0.9  # the scaling efficiency the update-freq and local SGD rows are sized for
MAX_UPDATE_FREQ_FACTOR = 16  # the update-freq row grows the batch per update at most this much
MAX_PERIOD = 1000  # local SGD's longest averaging period considered

@dataclass(frozen=True)
class Option:
    """One way to run: these hosts, this strategy, what it costs."""

    hosts: tuple[str, ...]
    kind: str  # a strategy's name (sync, fp16, local-sgd, ...) or update-freq
    prediction: model.Prediction
    batches_per_s: float  # micro-batches of every rank together per second
    tokens_per_s: float | None  # batches × max_tokens: an upper bound (padding and short batches)
    hours: float | None  # for the same samples as the run asked for
    usd_per_hour: float | None
    caveat: str
    same_updates: bool  # trains exactly the run's updates (same batch per update, plain sync)

    @property
    def comm(self) -> str:
        return self.prediction.comm

    @property
    def update_freq(self) -> int:
        return self.prediction.update_freq

    @property
    def dollars(self) -> float | None:
        if self.hours is None or self.usd_per_hour is None:
            return None
        return self.hours * self.usd_per_hour

    def label(self) -> str:
        n = len(self.hosts)
        return f"{n} host{'s' if n > 1 else ''}" + (f", {self.comm}" if n > 1 and self.comm != "sync" else "") \
            + (f", update-freq {self.update_freq}" if self.update_freq > 1 else "")

    def flags(self) -> str:
        """The fab train options that run it."""
        out = f"--hosts {','.join(self.hosts)}"
        if self.comm != "sync":
            out += f" --comm {self.comm}"
        if self.update_freq > 1:
            out += f" --update-freq {self.update_freq}"
        return out

    def speed(self) -> str:
        if self.tokens_per_s is not None:
            return f"{self.tokens_per_s:,.0f} tokens/s"
        return f"{self.batches_per_s:.2f} batches/s"

    def as_dict(self) -> dict:
        return {"hosts": list(self.hosts), "kind": self.kind, "comm": self.comm, "update_freq": self.update_freq,
                "s_per_update": self.prediction.step_s, "batches_per_s": self.batches_per_s,
                "tokens_per_s": self.tokens_per_s, "hours": self.hours, "usd_per_hour": self.usd_per_hour,
                "dollars": self.dollars, "caveat": self.caveat, "same_updates": self.same_updates,
                "flags": self.flags()}


@dataclass(frozen=True)
class Comparison:
    options: list[Option]
    asked: Option  # the run as asked: every host, its --comm and --update-freq
    unpriced: list[str]  # hosts without hourly_usd: dollars left out

    @property
    def fastest(self) -> Option:
        return max(self.options, key=_speed_key)

    @property
    def cheapest(self) -> Option | None:
        """None unless every host has a price: a row left unpriced might be the cheapest."""
        if self.unpriced:
            return None
        priced = [o for o in self.options if o.dollars is not None]
        return min(priced, key=lambda o: (o.dollars, -o.batches_per_s)) if priced else None

    @property
    def fewer_hosts_faster(self) -> Option | None:
        """The fastest run on fewer hosts that trains the run's own updates, when it beats the run as asked."""
        fewer = [o for o in self.options if len(o.hosts) < len(self.asked.hosts) and o.same_updates]
        best = max(fewer, key=_speed_key, default=None)
        return best if best is not None and _speed_key(best)[0] > _speed_key(self.asked)[0] else None

    def verdict(self) -> list[str]:
        def priced(o: Option) -> str:
            return (f", {model.duration(o.hours * 3600)}" if o.hours is not None else "") + \
                (f", {price.dollars(o.dollars)}" if o.dollars is not None else "")

        fast = self.fastest
        lines = [f"fastest: {fast.label()} ({fast.speed()}{priced(fast)}): {fast.flags()}"
                 + ("" if fast.kind == "sync" else f" [{fast.caveat}]")]
        cheap = self.cheapest
        if cheap is not None:
            lines.append(f"cheapest: {cheap.label()} ({price.dollars(cheap.dollars)}): {cheap.flags()}")
        elif self.unpriced:
            lines.append(f"no dollars: no {price.PRICE_VAR} in the inventory for {', '.join(self.unpriced)}")
        if fewer := self.fewer_hosts_faster:
            n, asked = len(fewer.hosts), len(self.asked.hosts)
            lines.append(f"{_count(n)} {'host is' if n == 1 else 'hosts are'} faster than {_count(asked)} on this "
                         f"link: {fewer.speed()} against {self.asked.speed()} ({fewer.flags()})")
        return lines

    def rows(self) -> list[list[str]]:
        out = []
        for o in self.options:
            p = o.prediction
            out.append([o.label(), f"{p.step_s:.3f}", o.speed().split()[0], f"{p.efficiency:.0%}",
                        model.duration(o.hours * 3600) if o.hours is not None else "—",
                        price.dollars(o.dollars), o.caveat])
        return out

    def headers(self) -> list[str]:
        speed = "tokens/s" if self.asked.tokens_per_s is not None else "batches/s"
        return ["hosts, comm", "s/update", speed, "efficiency", "hours", "dollars", "quality caveat"]

    def table(self):
        """A rich Table of every option (the asked run in bold)."""
        from rich.table import Table

        table = Table(title="every way to train the same samples on these hosts", title_justify="left")
        for i, name in enumerate(self.headers()):
            table.add_column(name, justify="right" if 0 < i < 6 else "left")
        for o, row in zip(self.options, self.rows(), strict=False):
            table.add_row(*row, style="bold" if o == self.asked else None)
        return table

    def text(self) -> str:
        """The table as plain text (logs, tests, the README)."""
        rows = [self.headers(), *self.rows()]
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)).rstrip() for r in rows)

    def as_dict(self) -> dict:
        return {"options": [o.as_dict() for o in self.options], "asked": self.asked.as_dict(),
                "fastest": self.fastest.flags(), "cheapest": self.cheapest.flags() if self.cheapest else None,
                "fewer_hosts_faster": self.fewer_hosts_faster.flags() if self.fewer_hosts_faster else None,
                "unpriced": self.unpriced, "verdict": self.verdict()}


def _speed_key(o: Option) -> tuple[float, int]:
    """Faster first: the shorter run for the same samples (local SGD's synchronous start counted),
    else the higher rate; on a tie the fewer hosts."""
    return (-o.hours if o.hours is not None else o.batches_per_s, -len(o.hosts))


def _count(n: int) -> str:
    return {1: "one", 2: "two", 3: "three", 4: "four"}.get(n, str(n))


def period_for(strategy: strategies.Strategy, params: int, ranks: int, link_bytes_per_s: float, compute_s: float,
               hosts: int, precision: str) -> int:
    """The smallest period whose sync every H updates leaves ≥ TARGET of the compute speed (as model.choose)."""
    every_update = model.predict(params, ranks, link_bytes_per_s, compute_s, hosts=hosts, precision=precision,
                                 comm=str(strategy.with_period(2))).comm_s * 2
    return model.period_for(every_update, compute_s, TARGET, MAX_PERIOD)


def local_sgd_period(params: int, ranks: int, link_bytes_per_s: float, compute_s: float, hosts: int,
                     precision: str) -> int:
    """local SGD's H (period_for)."""
    return period_for(strategies.parse("local-sgd"), params, ranks, link_bytes_per_s, compute_s, hosts, precision)


def compare(hosts: Sequence[Host], params: int, *, link_mbps: float, compute_s: float, precision: str = "fp32",
            overlaps: Mapping[str, float] | None = None, comm: str = "sync", update_freq: int = 1,
            max_update: int | None = None, tokens_per_batch: int | None = None,
            sync_updates: int | Mapping[str, int] = 0) -> Comparison:
    """Every subset size × strategy for the run asked (`comm`, `update_freq` on all `hosts`).
    `compute_s`: one rank's compute-only seconds per batch of `tokens_per_batch` (the run's max_tokens as
    train.plan.batching decided it for the GPUs: every row keeps that batch and reaches the update by
    --update-freq, so C holds for every row)."""
    overlaps = dict(overlaps or {})
    per_host = hosts[0].ranks
    link = model.mbit_to_bytes_per_s(link_mbps)
    asked_batches = len(hosts) * per_host * update_freq  # per update, every rank together
    total_batches = max_update * asked_batches if max_update else None

    def option(k: int, kind: str, strategy: str, uf: int, caveat: str, same: bool) -> Option:
        subset = hosts[:k]
        chosen = strategies.parse(strategy)
        p = model.predict(params, k * per_host, link, compute_s, hosts=k, precision=precision, update_freq=uf,
                          overlap=overlaps.get(chosen.name, 0.0) if chosen.overlaps else 0.0,
                          comm=strategy, sync_updates=sync_updates)
        per_update = k * per_host * uf
        rate = per_update / p.step_s
        hours = None
        if total_batches is not None:
            seconds = total_batches / rate
            if p.sync_updates:  # a synchronous start (local SGD's), at its own slower step
                start = min(p.sync_updates, math.ceil(total_batches / per_update))
                seconds += start * (p.sync_step_s - p.step_s)
            hours = seconds / 3600
        return Option(tuple(h.name for h in subset), kind, p, rate,
                      rate * tokens_per_batch if tokens_per_batch else None, hours,
                      price.cluster_hourly_usd(subset), caveat, same)

    options: list[Option] = []
    for k in range(1, len(hosts) + 1):
        keeps = (len(hosts) * update_freq) % k == 0
        base = len(hosts) * update_freq // k if keeps else update_freq  # the run's batch per update, if it divides
        sync_caveat = strategies.get("sync").caveat if k == len(hosts) else (
            "the same updates, on fewer hosts" if keeps else
            f"batch per update {k}/{len(hosts)} of the run's: not the same updates")
        sync = option(k, "sync", "sync", base, sync_caveat, keeps)
        options.append(sync)
        if k == 1:
            continue  # nothing crosses a NIC: every strategy is sync
        for rung in strategies.ladder(precision, params):  # its rungs above sync, each at its own size
            if rung == strategies.UPDATE_FREQ:
                if sync.prediction.efficiency < TARGET:
                    uf = base
                    while uf < base * MAX_UPDATE_FREQ_FACTOR:
                        uf += base
                        if option(k, "sync", "sync", uf, "", False).prediction.efficiency >= TARGET:
                            break
                    options.append(option(k, strategies.UPDATE_FREQ, "sync", uf,
                                          update_freq_rung.CAVEAT.format(factor=uf // base), False))
            elif isinstance(rung, strategies.Strategy) and rung.name != "sync" and (
                    rung.always_compared or sync.prediction.efficiency < TARGET):
                if rung.periodic:
                    rung = rung.with_period(period_for(rung, params, k * per_host, link, compute_s, k, precision))
                options.append(option(k, rung.name, str(rung), base, rung.caveat, False))
    asked_strategy = strategies.parse(comm)
    asked_comm = str(asked_strategy)
    asked = next((o for o in options if len(o.hosts) == len(hosts) and o.comm == asked_comm
                  and o.update_freq == update_freq), None)
    if asked is None:  # a strategy or update-freq of its own: its row too
        kind = asked_strategy.name
        caveat = asked_strategy.caveat if kind == "sync" else f"the run as asked; {asked_strategy.caveat}"
        asked = option(len(hosts), kind, asked_comm, update_freq, caveat, kind == "sync")
        options.append(asked)
    return Comparison(options, asked, price.unpriced(hosts))


def main(argv: list[str] | None = None) -> int:
    """The comparison from figures given by hand (no hosts needed): exit 3 when fewer hosts are faster.

        python -m train.plan.compare --preset transformer_wmt_en_de --hosts 2 --gpus 1 --link-mbit 100 \\
            --compute-s 0.6 --precision fp16 --max-update 300000 --hourly-usd 3.06
    """
    import argparse

    from train.recipe.params import preset_params
    from train.recipe.presets import resolve

    parser = argparse.ArgumentParser(description="Every host subset x --comm, with hours and dollars.")
    parser.add_argument("--preset", required=True, help="a train.recipe.presets preset")
    parser.add_argument("--vocab", type=int, default=32000, help="joint dictionary size")
    parser.add_argument("--hosts", type=int, required=True)
    parser.add_argument("--gpus", type=int, default=1, help="GPUs (ranks) per host")
    parser.add_argument("--link-mbit", type=float, required=True, help="measured host-to-host Mbit/s")
    parser.add_argument("--compute-s", type=float, required=True, help="measured compute-only s per batch")
    parser.add_argument("--precision", choices=sorted(model.BYTES_PER_ELEMENT), default="fp32")
    parser.add_argument("--max-update", type=int)
    parser.add_argument("--hourly-usd", type=float, help="each host's price per hour (none: no dollars)")
    args = parser.parse_args(argv)
    options = resolve(args.preset).options
    hosts = [Host(name=f"host{i + 1}", address=f"host{i + 1}", gpus=args.gpus,
                  vars={price.PRICE_VAR: args.hourly_usd} if args.hourly_usd is not None else {})
             for i in range(args.hosts)]
    c = compare(hosts, preset_params(options, args.vocab), link_mbps=args.link_mbit, compute_s=args.compute_s,
                precision=args.precision, max_update=args.max_update or options.get("max_update"),
                tokens_per_batch=int(options["max_tokens"]) if options.get("max_tokens") else None,
                sync_updates=strategies.starts(options))
    print(c.text())
    print("\n".join(c.verdict()))
    return 3 if c.fewer_hosts_faster else 0


if __name__ == "__main__":
    raise SystemExit(main())
