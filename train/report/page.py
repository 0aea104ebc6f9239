"""`fab report`'s last step: a collected run directory → one self-contained HTML page.

    build_report(Path("reports/run-20261122-081616"), link_mbps=1000)
      → reports/run-.../index.html   answers first, then the plots (PNGs inlined as data URIs,
                                       inline CSS, no script, nothing fetched: works offline),
                                       from the Jinja2 template templates/page.html.j2
        reports/run-.../*.png         the same plots as files
        reports/run-.../answers.json  every answer with its numbers
                                   and the few lines `fab report` prints

The inputs are read in `train.report.run_data`; the definitions (step time, "while training", ...) are in
`train.report.series` and `train.report.answers`; the figures in `train.report.plots`. From a shell:
`python -m train.report.page reports/<run> [link_mbps]`.
"""

from __future__ import annotations

import base64
import json
import sys
from datetime import UTC, datetime
from pathlib import Path

import jinja2

from train.cluster import rank_layout, ranks_label
from train.recipe.logformat import format_eta
from train.report import answers as A
from train.report import plots
from train.report.run_data import RunData

# verdict → CSS class of its badge
BADGES = {
    "improving": "good", "plateau": "warn", "worse": "bad",
    "no": "good", "widening": "warn", "overfitting": "bad",
    "full": "good", "underused": "warn", "absent": "", "waiting": "bad",
    "not": "good", "bursts": "warn", "network-bound": "bad",
    "unknown": "", "finished": "good", "reached": "good", "not finished": "warn",
    "changed": "warn", "copied": "good", "no copy": "warn",
}

CHANGES = (" Dash-dotted orange lines: the run's hosts changed (lost or joined) at that update; the shaded "
           "updates were trained again from the checkpoint it went on from.")
CAPTIONS = {
    "loss.png": "Train loss per log interval and validation loss at each validation.",
    "bleu.png": "SacreBLEU of the evaluated checkpoint on the test set.",
    "lr.png": "Learning rate as logged, over the schedule computed from the run's own configuration.",
    "step_time.png": "Seconds per update of each log interval (1 / ups); the dashed line is their mean.",
    "wps.png": "Target words per second over all ranks, per log interval.",
    "gpu.png": "Utilization of every GPU of every host, from NVML samples.",
    "nic.png": "Bytes sent (tx) and received (rx) per second on each host's cluster NIC, in Mbit/s.",
    "timeline.png": "Step time of each log interval (bars over the time they cover) against the busiest "
                    "host's NIC throughput.",
}


TEMPLATES = Path(__file__).with_name("templates")  # page.html.j2 and its page.css
OPTION_KEYS = ["arch", "lr", "lr_scheduler", "warmup_updates", "warmup_init_lr", "max_update", "max_tokens",
               "dropout", "encoder_layers", "decoder_layers", "encoder_embed_dim", "save_interval_updates",
               "log_interval"]


def _data_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def host_ranks(run: dict) -> dict[str, str]:
    """{host: its global ranks ('0', '2-3')} of the run's current hosts: run.json's hosts in rank
    order, each running `ranks_per_host` (1 in a run.json written before hosts ran several)."""
    hosts = list(run.get("hosts") or [])
    per_host = run.get("ranks_per_host") if isinstance(run.get("ranks_per_host"), int) else 1
    return {h: ranks_label(r) for h, r in zip(hosts, rank_layout([per_host] * len(hosts)), strict=True)}


def header_meta(an: A.Analysis) -> list[str]:
    """The line under the title: hosts (with their ranks where they run several), preset, overrides,
    dataset, precision, ranks."""
    d, run = an.data, an.data.run
    ranks = host_ranks(run)
    several = any("-" in r for r in ranks.values())
    named = ", ".join(f"{h} (ranks {ranks[h]})" if several and h in ranks else h for h in d.hosts)
    meta = [f"hosts {named or '?'} (rank 0: {d.rank0 or '?'})", f"preset {run.get('preset', '?')}"]
    if run.get("overrides"):
        meta.append("overrides " + " ".join(run["overrides"]))
    meta += [f"dataset {run.get('dataset', '?')}", f"precision {run.get('precision', '?')}",
             f"update_freq {run.get('update_freq', '?')}"]
    if d.log.devices:
        meta.append(f"{d.log.devices} ranks")
    return meta


def host_rows(an: A.Analysis) -> list[dict]:
    """Per host: its log, its samples, GPUs seen, NIC, how fairseq ended, its log's last line."""
    d = an.data
    rows = []
    ranks = host_ranks(d.run)
    for host in d.hosts:
        log = d.logs.get(host)
        samples = d.samples.get(host, [])
        gpus = "no GPU" if samples and not any(s.get("gpus") for s in samples) else (
            str(max(len(s.get("gpus") or []) for s in samples)) if samples else "?")
        # fairseq logs "done training" on rank 0 only: the other ranks finished when it did, unless they erred
        done = log and (log.finished or (host != d.rank0 and d.log.finished and not log.errors))
        state = "finished" if done else ("error" if log and log.errors else "not finished")
        rows.append({"name": host, "ranks": ranks.get(host, "-"), "log": bool(log), "samples": len(samples),
                     "gpus": gpus,
                     "nic": samples[0].get("nic", "?") if samples else "?", "state": state,
                     "tail": host_doing(d, host, bool(done))})
    return rows


def host_doing(d: RunData, host: str, done: bool) -> str:
    """A host's last log line, or, for a host after rank 0's that erred in nothing, what it did: it
    logs no update (rank 0 does), so its last line is a PyTorch warning's fragment or `initialized
    host v100b as rank 1`."""
    log = d.logs.get(host)
    if host in d.rank0_logs or host == d.rank0 or not log or log.errors:
        return d.tails.get(host, "")[:200]
    updates = [r.update for r in d.log.records if r.update is not None]
    if done:
        return "finished with rank 0" + (f" at update {max(updates):,}" if updates else "")
    return "in step with rank 0" + (f" (its last logged update: {max(updates):,})" if updates else "")


MARKED = {"loss.png", "step_time.png", "wps.png", "timeline.png"}  # plots.mark_changes draws on these


def member_rows(an: A.Analysis) -> list[dict]:
    """The membership table: hosts, from update, to update, how it began and ended (empty for a
    run that kept its hosts)."""
    hosts = an.get("members")
    if not hosts:
        return []
    return [{"hosts": ", ".join(s["hosts"]), "first": f"{s['from_update']:,}",
             "last": f"{s['to_update']:,}" if s["to_update"] is not None else "?",
             "why": s["why"], "ended": s["ended"] or "the run's last update"} for s in hosts.numbers["spans"]]


def render_html(an: A.Analysis, figures: dict[str, str], out_dir: Path) -> str:
    """The page, from templates/page.html.j2 (every value escaped by Jinja2's autoescape)."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    d = an.data
    return env.get_template("page.html.j2").render(
        run_id=d.run.get("run_id") or d.run_dir.name,
        meta=header_meta(an),
        answers=an.answers,
        badges=BADGES,
        figures=[{"uri": _data_uri(out_dir / name), "title": title, "name": name,
                  "caption": CAPTIONS.get(name, "") + (CHANGES if name in MARKED and an.get("members") else "")}
                 for name, title in figures.items()],
        members=member_rows(an),
        checkpoints=d.checkpoints,
        hosts=host_rows(an),
        options=[(k, d.options[k]) for k in OPTION_KEYS if k in (d.options or {})],
        made=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
    )


def build_report(run_dir: Path, link_mbps: float | None = None) -> tuple[Path, list[str]]:
    """Write run_dir/index.html, the PNGs and answers.json from the collected files; the page's
    path and the terminal summary (one analysis for both).

    `link_mbps`: the inventory's expected link speed, used when no bench-net result was collected.
    """
    run_dir = Path(run_dir)
    an = A.analyze(A.load(run_dir), link_mbps)
    figures = plots.draw_all(an, run_dir)
    (run_dir / "answers.json").write_text(json.dumps(an.to_json(), indent=2, default=str) + "\n")
    page = run_dir / "index.html"
    page.write_text(render_html(an, figures, run_dir), encoding="utf-8")
    return page, summary_lines(an)


def summary_lines(an: A.Analysis) -> list[str]:
    """A few terminal lines: progress, step time, the verdicts that matter."""
    out = []
    dur, step = an.get("duration"), an.get("step_time")
    if dur:
        n = dur.numbers
        out.append(f"updates {n['update']}/{n['max_update'] or '?'} in {format_eta(n['elapsed_s'])}"
                   + (f", ETA {format_eta(n['eta_s'])}" if n.get("eta_s") else ""))
    if hosts := an.get("members"):
        out.append("hosts changed: " + "; ".join(hosts.numbers["changes"]))
    if step and step.numbers.get("mean_s_per_update") is not None:
        out.append(f"average step time {step.numbers['mean_s_per_update']:.3f} s/update")
    for key, label in (("improving", "still improving"), ("overfit", "overfits"), ("bleu", "BLEU"),
                       ("gpus", "GPUs fully used"), ("network", "network the bottleneck")):
        a = an.get(key)
        if a:
            out.append(f"{label}: {a.answer.split(':')[0] if key != 'bleu' else a.numbers['bleu']}"
                       + (f" [{a.verdict}]" if a.verdict else ""))
    return out


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m train.report.page reports/<run_id> [expected_link_mbps]", file=sys.stderr)
        return 2
    page, lines = build_report(Path(argv[0]), float(argv[1]) if len(argv) > 1 else None)
    print(page)
    for line in lines:
        print("  " + line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
