"""Bringing a run's files from every host to the controller, for the report.

reports/<run>/ gets logs/<host>.log, samples/<host>.jsonl (from the run's hosts and those it lost,
where reachable), checkpoints.txt (rank 0's checkpoint directory, `ls -l --time-style=+%s`), corpus.json
(the dataset's figures), cost.json (the run's cost so far, the idle cluster's) and offsite.json (the
newest copy off the cluster, with --checkpoints-to), both as the caller had them from the hosts' states
(train.run.status.for_report), and bench/*.json (the latest benchmark results on this controller).
"""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

from ..cluster import Host, get_whole, on_each
from ..recipe.record import REPORTS, Run


def collect(run: Run, hosts: list[Host]) -> dict[str, str]:
    """Fetch every host's files at once; returns {host: problem} for what could not be fetched."""
    local = run.local_dir
    for sub in ("logs", "samples"):
        (local / sub).mkdir(parents=True, exist_ok=True)

    def fetch(host: Host, conn) -> str | None:
        missing = []
        for remote, dest in ((f"{run.remote_dir}/train.log", local / "logs" / f"{host.name}.log"),
                             (f"{run.remote_dir}/samples.jsonl", local / "samples" / f"{host.name}.jsonl")):
            if conn.run(f"test -e {shlex.quote(remote)}", warn=True, hide=True, in_stream=False).ok:
                get_whole(conn, remote, str(dest))
            else:
                missing.append(remote)
        if host.name == run.hosts[0]:
            listing = conn.run(f"ls -l --time-style=+%s {shlex.quote(run.remote_dir + '/checkpoints')}",
                               warn=True, hide=True, in_stream=False)
            (local / "checkpoints.txt").write_text(listing.stdout)
            corpus = f"{run.data_dir}/corpus.json"
            if conn.run(f"test -e {shlex.quote(corpus)}", warn=True, hide=True, in_stream=False).ok:
                get_whole(conn, corpus, str(local / "corpus.json"))
        return f"missing {', '.join(missing)}" if missing else None

    # and the hosts the run lost (Run.members) that the inventory still has: their logs hold the
    # progress of the updates they were rank 0 for
    former = {n for m in run.members for n in m.get("hosts", [])} - set(run.hosts)
    results = on_each(run.hosts_of(hosts) + [h for h in hosts if h.name in former], fetch)
    bench = REPORTS / "bench"
    if bench.is_dir():
        (local / "bench").mkdir(exist_ok=True)
        for path in bench.glob("*.json"):
            shutil.copy2(path, local / "bench" / path.name)
    return {name: result.why if not result.ok else result.value for name, result in results.items()
            if not result.ok or result.value is not None}



def report(run: Run, hosts: list[Host], link_mbps: float | None, console, *, offsite: dict | None,
           cost: dict) -> Path:
    """`fab report`: collect the run from every host, then its page and the answers, printed.
    `link_mbps`: the link when no bench-net result exists (default: the inventory's). `offsite` (None: the
    run copies nothing off the cluster) and `cost`: what the hosts' states said, written as offsite.json
    and cost.json (train.run.status.for_report, which asked them, with the run's membership brought up to
    date)."""
    from .page import build_report

    if offsite is not None:  # the newest copy off the cluster, as of now
        run.local_dir.mkdir(parents=True, exist_ok=True)
        (run.local_dir / "offsite.json").write_text(json.dumps(offsite, indent=1) + "\n")
    with console.status(f"collecting {run.run_id} from {', '.join(run.hosts)}"):
        problems = collect(run, hosts)
    for name, problem in problems.items():
        console.print(f"[yellow]{name}: {problem}[/]")
    (run.local_dir / "cost.json").write_text(json.dumps(cost, indent=1) + "\n")
    expected = link_mbps or hosts[0].var("network_expected_mbps")
    with console.status("plots and answers"):
        page, lines = build_report(run.local_dir, float(expected) if expected else None)
    for line in lines:
        console.print(line)
    console.print(f"[bold]report:[/] {page}")
    return page
