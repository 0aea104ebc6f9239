"""`fab report`'s last step: a collected run directory → one self-contained HTML page.

    build_report(Path("reports/run-20261122-081616"), link_mbps=1000)
      → reports/run-.../index.html   answers first, then the plots (PNGs inlined as data URIs,
                                       inline CSS, no script, nothing fetched: works offline)
        reports/run-.../*.png         the same plots as files
        reports/run-.../answers.json  every answer with its numbers
                                   and the few lines `fab report` prints

The inputs and the definitions (step time, "while training", ...) are in `train.report.answers`;
the figures in `train.report.plots`. From a shell: `python -m train.report.page reports/<run> [link_mbps]`.
"""

from __future__ import annotations

import base64
import html
import json
import sys
from datetime import UTC, datetime
from pathlib import Path

from train.report import answers as A
from train.report import plots
from train.report.logparse import format_eta

CSS = """
body { font-family: -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; margin: 0; color: #222;
       background: #fafafa; }
header { background: #233; color: #fff; padding: 18px 32px; }
header h1 { margin: 0 0 6px 0; font-size: 24px; }
header .meta { font-size: 14px; opacity: 0.85; }
main { padding: 16px 32px 40px 32px; max-width: 1500px; }
h2 { font-size: 19px; border-bottom: 2px solid #ddd; padding-bottom: 4px; margin-top: 28px; }
table { border-collapse: collapse; width: 100%; background: #fff; }
th, td { text-align: left; vertical-align: top; padding: 8px 10px; border-bottom: 1px solid #e4e4e4;
         font-size: 14px; }
th { background: #f0f0f0; }
td.q { width: 22%; font-weight: 600; }
td.v { width: 9%; }
.badge { display: inline-block; padding: 2px 8px; border-radius: 10px; font-size: 12px; font-weight: 600;
         color: #fff; background: #888; white-space: nowrap; }
.good { background: #2e7d32; } .bad { background: #c62828; } .warn { background: #ef6c00; }
.grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(540px, 1fr)); gap: 16px; }
figure { margin: 0; background: #fff; border: 1px solid #e4e4e4; padding: 8px; }
figure img { width: 100%; height: auto; display: block; }
figcaption { font-size: 13px; color: #555; padding-top: 4px; }
code { background: #f0f0f0; padding: 1px 4px; border-radius: 3px; font-size: 13px; }
.small { font-size: 13px; color: #555; }
"""

# verdict → CSS class of its badge
BADGES = {
    "improving": "good", "plateau": "warn", "worse": "bad",
    "no": "good", "widening": "warn", "overfitting": "bad",
    "full": "good", "underused": "warn", "absent": "",
    "not": "good", "bursts": "warn", "network-bound": "bad",
    "unknown": "", "finished": "good", "reached": "good", "not finished": "warn",
}

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


def _data_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def _esc(text: object) -> str:
    return html.escape(str(text))


def render_html(an: A.Analysis, figures: dict[str, str], out_dir: Path) -> str:
    d = an.data
    run = d.run
    run_id = run.get("run_id") or d.run_dir.name
    meta = [f"hosts {', '.join(d.hosts) or '?'} (rank 0: {d.rank0 or '?'})", f"preset {run.get('preset', '?')}"]
    if run.get("overrides"):
        meta.append("overrides " + " ".join(run["overrides"]))
    meta += [f"dataset {run.get('dataset', '?')}", f"precision {run.get('precision', '?')}",
             f"update_freq {run.get('update_freq', '?')}"]
    if d.log.devices:
        meta.append(f"{d.log.devices} ranks")
    rows = []
    for a in an.answers:
        badge = ""
        if a.verdict:
            badge = f'<span class="badge {BADGES.get(a.verdict, "")}">{_esc(a.verdict)}</span>'
        rows.append(f'<tr><td class="q">{_esc(a.question)}</td><td class="v">{badge}</td>'
                    f"<td>{_esc(a.answer)}</td></tr>")
    figs = []
    for name, title in figures.items():
        figs.append(f'<figure><img src="{_data_uri(out_dir / name)}" alt="{_esc(title)}">'
                    f"<figcaption><b>{_esc(title)}</b> — {_esc(CAPTIONS.get(name, ''))} "
                    f'<span class="small">({_esc(name)})</span></figcaption></figure>')
    extra = []
    if d.checkpoints:
        extra.append("<h2>Checkpoint directory (rank 0)</h2><table><tr><th>file</th><th>size</th></tr>" + "".join(
            f"<tr><td><code>{_esc(c.name)}</code></td><td>{c.size / 1e6:,.2f} MB</td></tr>" for c in d.checkpoints)
            + "</table>")
    host_rows = []
    for host in d.hosts:
        log = d.logs.get(host)
        samples = d.samples.get(host, [])
        gpus = "no GPU" if samples and not any(s.get("gpus") for s in samples) else (
            str(max(len(s.get("gpus") or []) for s in samples)) if samples else "?")
        state = "finished" if log and log.finished else ("error" if log and log.errors else "not finished")
        host_rows.append(f"<tr><td>{_esc(host)}</td><td>{'yes' if log else 'no'}</td><td>{len(samples)}</td>"
                         f"<td>{_esc(gpus)}</td><td>{_esc(samples[0].get('nic', '?') if samples else '?')}</td>"
                         f"<td>{state}</td><td><code>{_esc(d.tails.get(host, '')[:200])}</code></td></tr>")
    extra.append("<h2>Hosts</h2><table><tr><th>host</th><th>log</th><th>samples</th><th>GPUs</th><th>NIC</th>"
                 "<th>fairseq</th><th>last line of its log</th></tr>" + "".join(host_rows) + "</table>")
    opts = d.options
    if opts:
        keys = ["arch", "lr", "lr_scheduler", "warmup_updates", "warmup_init_lr", "max_update", "max_tokens",
                "dropout", "encoder_layers", "decoder_layers", "encoder_embed_dim", "save_interval_updates",
                "log_interval"]
        extra.append("<h2>Configuration (resolved preset)</h2><p>" + ", ".join(
            f"<code>{_esc(k)}={_esc(opts[k])}</code>" for k in keys if k in opts) + "</p>")
    made = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>tandem report — {_esc(run_id)}</title>
<style>{CSS}</style></head>
<body>
<header><h1>Training report: {_esc(run_id)}</h1>
<div class="meta">{_esc(' · '.join(meta))}</div></header>
<main>
<h2>Answers</h2>
<table><tr><th>question</th><th>verdict</th><th>answer, with its numbers</th></tr>
{''.join(rows)}
</table>
<h2>Plots</h2>
<div class="grid">
{''.join(figs)}
</div>
{''.join(extra)}
<p class="small">Made by tandem (train/report/page.py) {made}. Numbers: answers.json beside this page.</p>
</main></body></html>
"""


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
