"""python -m tests.sim [--seeds 0:2000] [--seed N --show] [--replay FILE]: run the fault simulator and
print its figures (schedules, time, each rule checked, each fault drawn); a failure prints its seed,
the shrunk schedule as JSON and the keepers' last lines."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from tests.sim import run as sim


def report(out: sim.Outcome, shrunk: sim.Outcome | None = None) -> None:
    print(f"seed {out.seed}: {out.hosts} hosts, rule {out.violation} broken: {out.detail}")
    s = shrunk or out
    print("shrunk schedule:", json.dumps({"hosts": s.hosts, "seed": s.seed, "schedule": s.schedule}))
    for line in s.events[-15:]:
        print("  world", line)
    for host, lines in s.logs.items():
        for line in lines[-6:]:
            print(f"  {host} {line}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.sim", description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="0:200", help="a range of seeds, FROM:TO")
    p.add_argument("--seed", type=int, help="one seed")
    p.add_argument("--replay", help="a schedule's JSON file (tests/sim/regressions/)")
    p.add_argument("--shrink", action="store_true", help="shrink a failing schedule")
    p.add_argument("--show", action="store_true", help="print the world's events and the keepers' logs")
    args = p.parse_args(argv)
    if args.replay:
        data = json.loads(Path(args.replay).read_text())
        outs = [sim.run(data["hosts"], data["schedule"], data.get("seed", 0), data.get("profile"), data.get("spec"))]
    else:
        lo, hi = (args.seed, args.seed + 1) if args.seed is not None else map(int, args.seeds.split(":"))
        started = time.monotonic()
        outs = []
        for seed in range(lo, hi):
            outs.append(sim.run_seed(seed))
        took = time.monotonic() - started
        fired: dict = {}
        for o in outs:
            for k, v in o.fired.items():
                fired[k] = fired.get(k, 0) + v
        ops: dict = {}
        for o in outs:
            for f in o.schedule:
                ops[f["op"]] = ops.get(f["op"], 0) + 1
        sizes: dict = {}
        for o in outs:
            sizes[o.hosts] = sizes.get(o.hosts, 0) + 1
        print(f"{len(outs)} schedules in {took:.1f} s ({took / max(1, len(outs)) * 1000:.0f} ms each); hosts "
              f"{dict(sorted(sizes.items()))}; {sum(len(o.schedule) for o in outs)} faults: "
              f"{dict(sorted(ops.items()))}")
        print("rules checked: " + ", ".join(f"{k} {v:,}" for k, v in sorted(fired.items())))
    failed = [o for o in outs if o.violation]
    for o in failed[:5]:
        report(o, sim.shrink(o) if args.shrink else None)
    if args.show and outs:
        for line in outs[0].events:
            print("  world", line)
        for host, lines in outs[0].logs.items():
            for line in lines:
                print(f"  {host} {line}")
    by_rule: dict = {}
    for o in failed:
        by_rule.setdefault(o.violation, []).append(o.seed)
    for rule, seeds in sorted(by_rule.items()):
        print(f"{rule}: {len(seeds)} schedules, seeds {seeds[:10]}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
