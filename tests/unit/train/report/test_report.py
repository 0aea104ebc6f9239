"""The training report: real lab logs + synthetic sampler files → answers, plots, one HTML page.

Fixtures (tests/fixtures/report/): `run-081616/` is a real 2-host lab run of the tiny preset
(rank 0's and rank 1's logs, stopped by hand at update 230; its checkpoint listing and the
dataset's corpus.json as collected; bleu.json from a sibling run); `resumed-084104-v100a.log`
is a real rank-0 log with a stop and a resume in it. Samples are synthesized around the
log's own timestamps. `h100-base-fp16/` is a real run on one H100 (Transformer base, fp16, 600
updates) with the monitor's own NVML samples (benchmarks/gpu.py; benchmarks/README.md).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from train.recipe.logformat import parse_log
from train.report import answers as A
from train.report import plots, run_data, series
from train.report.page import build_report

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "report"
RUN = FIXTURES / "run-081616"
PLOTS = ["loss.png", "bleu.png", "lr.png", "step_time.png", "wps.png", "gpu.png", "nic.png", "timeline.png"]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def copy_run(dst: Path) -> Path:
    shutil.copytree(RUN, dst)
    return dst


def write_samples(run_dir: Path, mbps_at, gpus=None, period: float = 2.0) -> None:
    """A sampler file per host, every `period` s from before the log's first line to after its
    last; `mbps_at(interval or None)` gives the NIC throughput (tx, rx slightly less)."""
    data = A.load(run_dir)
    ivs = series.intervals(data)
    lo, hi = min(data.log_times), max(data.log_times)
    (run_dir / "samples").mkdir(exist_ok=True)
    for host in data.hosts:
        lines, t = [], lo - 6
        while t < hi + 4:
            iv = next((i for i in ivs if i.start <= t <= i.end), None)
            mbps = mbps_at(iv)
            lines.append(json.dumps({
                "t": t, "host": host, "nic": "eth0", "tx_Bps": mbps * 1e6 / 8, "rx_Bps": mbps * 0.97e6 / 8,
                "cpu_percent": 150.0, "mem_used_mb": 1500.0, "mem_total_mb": 4000.0,
                "gpus": gpus(host) if gpus else None}))
            t += period
        (run_dir / "samples" / f"{host}.jsonl").write_text("\n".join(lines) + "\n")


def capped(iv):
    """≈95 % of a 100 Mbit/s link while training, higher when the step is slower."""
    if iv is None:
        return 2.0
    return 91.0 + 8.0 * (iv.step_s - 0.49) / (1.32 - 0.49)


def logged_inner(path: Path) -> list[dict]:
    """The train_inner JSON objects of a log, read without train.recipe.logformat."""
    out = []
    for line in path.read_text().splitlines():
        if "| train_inner |" in line:
            out.append(json.loads(line.split("| train_inner | ", 1)[1]))
    return out


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    """The fixture run with capped-link samples (no GPUs), built once for the module."""
    run_dir = copy_run(tmp_path_factory.mktemp("report") / "run")
    write_samples(run_dir, capped)
    build_report(run_dir, link_mbps=100)
    return run_dir


def test_every_plot_and_answer_is_on_the_page(report):
    page = (report / "index.html").read_text()
    for name in PLOTS:
        assert (report / name).stat().st_size > 5000, name
        assert f"({name})" in page
    assert page.count('src="data:image/png;base64,') == len(PLOTS)
    assert "http://" not in page and "https://" not in page and "<script" not in page  # works offline
    keys = [a["key"] for a in json.loads((report / "answers.json").read_text())["answers"]]
    assert keys == ["duration", "step_time", "improving", "overfit", "bleu", "gpus", "network", "lr", "corpus",
                    "checkpoints"]
    for question in ("How long did the run take", "average step time", "still improving", "overfit",
                     "GPUs fully used", "network the bottleneck", "learning-rate schedule", "training set",
                     "checkpoint made of"):
        assert question in page
    assert page.index("Answers") < page.index("Plots")


def test_average_step_time_is_the_mean_of_the_logged_ones():
    an = A.analyze(A.load(RUN))
    logged = [1 / float(x["ups"]) for x in logged_inner(RUN / "logs" / "v100a.log")]
    assert len(logged) == 23
    assert an.get("step_time").numbers["mean_s_per_update"] == pytest.approx(sum(logged) / len(logged), rel=1e-12)
    assert f"{sum(logged) / len(logged):.3f} s/update" in an.get("step_time").answer


def test_only_the_gpu_plot_says_nothing_was_measured_on_cpu_hosts(tmp_path, monkeypatch):
    run_dir = copy_run(tmp_path / "run")
    write_samples(run_dir, capped)
    placeholders, draw = [], plots.empty_panel
    monkeypatch.setattr(plots, "empty_panel", lambda ax, message: (placeholders.append(message), draw(ax, message)))
    build_report(run_dir, link_mbps=100)
    assert len(placeholders) == 1 and placeholders[0].startswith("no GPUs"), placeholders


def test_duration_progress_and_last_losses_match_the_log():
    an = A.analyze(A.load(RUN))
    d = an.get("duration").numbers
    assert d["elapsed_s"] == 169  # 08:16:36 → 08:19:25, rank 0's first and last timestamped lines
    assert d["update"] == 230 and d["max_update"] == 100000 and not d["finished"]
    # the last 10 logged intervals: update 130 at wall 82 s to update 230 at wall 168 s
    assert d["eta_s"] == pytest.approx((100000 - 230) * (168 - 82) / (230 - 130))
    assert an.intervals[-1].loss == 2.808
    assert an.get("improving").numbers["last_valid_loss"] == 2.727
    assert an.get("improving").verdict == "improving"
    assert an.get("improving").numbers["slope_per_1000"] < 0
    assert an.get("overfit").verdict == "no"
    assert an.get("overfit").numbers["gap"] == pytest.approx(2.727 - 3.153)


def test_learning_rate_schedule_from_the_config_matches_the_logged_one():
    an = A.analyze(A.load(RUN))
    lr = an.get("lr")
    assert lr.numbers["peak_lr"] == 0.007 and lr.numbers["peak_update"] == 100
    for iv in an.intervals:
        assert series.lr_at(iv.update, an.data.options) == pytest.approx(iv.lr, rel=1e-4)
    assert "inverse_sqrt" in lr.answer and "100 updates" in lr.answer


def test_corpus_checkpoints_and_bleu():
    an = A.analyze(A.load(RUN))
    assert an.get("corpus").numbers == {"dataset": "synthetic", "train_mb": 1.97, "train_lines": 20000,
                                        "vocab_size": 980}
    ck = an.get("checkpoints").numbers
    assert ck["files"] == 8 and ck["checkpoint_bytes"] == 3661243 and ck["params"] == 296448
    assert ck["expected_bytes"] == 296448 * 12
    assert an.get("bleu").numbers["bleu"] == 0.02


def test_checkpoint_listing_format():
    text = "total 8\n-rw-r--r-- 1 root root 3662769 1795335330 checkpoint_best.pt\ndrwxr-xr-x 2 root root 4096 1 sub\n"
    assert run_data.parse_checkpoints(text) == [run_data.Checkpoint("checkpoint_best.pt", 3662769, 1795335330)]


def test_a_capped_link_is_network_bound(report):
    net = A.analyze(A.load(report), link_mbps=100).get("network")
    assert net.verdict == "network-bound"
    assert 0.9 < net.numbers["mean_share"] < 1.0
    assert net.numbers["correlation"] > 0.9 and net.numbers["correlated_intervals"] == 23


def test_a_link_busy_two_thirds_of_the_time_is_network_bound_and_one_in_bursts_is_not(tmp_path):
    """The 10mbit lab run: the link busy 67% of the time is the bottleneck (the network takes most of
    each step, as `fab predict` defines it); a link busy only in short peaks is not."""
    run_dir = copy_run(tmp_path / "run")
    write_samples(run_dir, lambda iv: 67.0 if iv else 1.0)
    assert A.analyze(A.load(run_dir), link_mbps=100).get("network").verdict == "network-bound"
    ticks = iter(range(10**6))
    write_samples(run_dir, lambda iv: (95.0 if next(ticks) % 4 == 0 else 5.0) if iv else 1.0)
    net = A.analyze(A.load(run_dir), link_mbps=100).get("network")
    assert net.verdict == "bursts" and net.numbers["mean_share"] < 0.5 < net.numbers["peak_share"]


def test_an_uncapped_link_is_not(tmp_path):
    run_dir = copy_run(tmp_path / "run")
    write_samples(run_dir, lambda iv: 100.0 if iv else 1.0)  # 1 % of 10 Gbit/s
    (run_dir / "bench").mkdir()
    (run_dir / "bench" / "net-latest.json").write_text(json.dumps({"benchmark": "bench-net", "link_mbps": 10000,
                                                                   "timestamp": "2026-11-22T08:10:00+00:00"}))
    net = A.analyze(A.load(run_dir), link_mbps=100).get("network")  # the measured link wins over the argument
    assert net.numbers["link_mbps"] == 10000 and "measured" in net.numbers["link_source"]
    assert net.verdict == "not" and net.numbers["mean_share"] == pytest.approx(0.01, rel=0.05)


def test_samples_from_a_host_in_another_time_zone_are_lined_up(tmp_path):
    run_dir = copy_run(tmp_path / "run")
    write_samples(run_dir, capped)
    for path in (run_dir / "samples").glob("*.jsonl"):  # the log's clock one hour behind the samples'
        lines = [json.loads(x) for x in path.read_text().splitlines()]
        path.write_text("".join(json.dumps({**x, "t": x["t"] + 3600}) + "\n" for x in lines))
    data = A.load(run_dir)
    assert data.time_shift_s == 3600
    assert A.analyze(data, link_mbps=100).get("network").numbers["correlated_intervals"] == 23


def test_no_link_rate_means_unknown_not_a_guess(tmp_path):
    run_dir = copy_run(tmp_path / "run")
    write_samples(run_dir, capped)
    assert A.analyze(A.load(run_dir)).get("network").verdict == "unknown"


def test_absent_gpus_are_reported_as_absent(report):
    an = A.analyze(A.load(report))
    gpus = an.get("gpus")
    assert gpus.verdict == "absent" and gpus.numbers["absent_hosts"] == ["v100a", "v100b"]
    assert "absent" in gpus.answer and "mean_util_percent" not in gpus.numbers


def test_gpu_utilization_per_gpu(tmp_path):
    run_dir = copy_run(tmp_path / "run")
    write_samples(run_dir, capped, gpus=lambda host: [{"index": 0, "util_percent": 97.0, "mem_used_mb": 9000.0,
                                                       "mem_total_mb": 16000.0},
                                                      {"index": 1, "util_percent": 40.0 if host == "v100b" else 95.0,
                                                       "mem_used_mb": 9000.0, "mem_total_mb": 16000.0}])
    gpus = A.analyze(A.load(run_dir)).get("gpus")
    assert gpus.verdict == "underused"
    assert gpus.numbers["per_gpu"] == {"v100a:0": 97.0, "v100a:1": 95.0, "v100b:0": 97.0, "v100b:1": 40.0}
    assert gpus.numbers["mean_util_percent"] == pytest.approx((97 + 95 + 97 + 40) / 4)


def test_a_resumed_log_counts_each_interval_from_the_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    shutil.copy(FIXTURES / "resumed-084104-v100a.log", run_dir / "logs" / "v100a.log")
    (run_dir / "run.json").write_text(json.dumps({"run_id": "r", "hosts": ["v100a", "v100b"], "preset": "tiny",
                                                  "overrides": ["max_update=40"]}))
    an = A.analyze(A.load(run_dir))
    assert [(iv.update, iv.updates) for iv in an.intervals] == [(10, 10), (20, 10), (30, 10), (40, 10)]
    d = an.get("duration")
    assert d.numbers["restarts"] == 1 and d.verdict == "finished"
    assert d.numbers["running_s"] < d.numbers["elapsed_s"] == 183  # 08:41:40 → 08:44:43, stopped in between
    assert an.get("gpus").verdict == "unknown"  # no samples: says so


def test_overfitting_is_caught():
    def line(kind, update, loss):
        body = {"num_updates": str(update), "loss": str(loss), "ups": "2"} if kind == "train_inner" else \
            {f"{kind}_num_updates": str(update), f"{kind}_loss": str(loss)}
        return f"2026-11-22 08:00:{update // 100:02d} | INFO | {kind} | {json.dumps(body)}"

    lines = []
    for i, u in enumerate(range(100, 700, 100)):
        lines += [line("train_inner", u, 4.0 - 0.3 * i), line("valid", u, 4.0 - 0.2 * i if i < 3 else 3.6 + 0.1 * i)]
    data = run_data.RunData(Path("."), {}, ["a"], {}, parse_log(lines), {}, [], [], None, {}, [], None, None, None)
    assert A.answer_overfit(data).verdict == "overfitting"
    assert A.answer_improving(data).verdict == "worse"


def test_summary_lines(report):
    _, lines = build_report(report, link_mbps=100)
    text = "\n".join(lines)
    assert "updates 230/100000" in text and "average step time 0.718 s/update" in text
    assert "network the bottleneck: yes, network-bound" in text


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install -y chromium)")
def test_the_page_renders_its_plots_in_headless_chromium(report, tmp_path):
    import numpy as np
    from PIL import Image

    shot = tmp_path / "shot.png"
    subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}", "--window-size=1280,4000",
         (report / "index.html").as_uri()],
        check=True, capture_output=True, timeout=90)
    image = np.asarray(Image.open(shot).convert("RGB")).astype(int)
    assert image.shape == (4000, 1280, 3)
    # the plots sit below the answers: their area must be drawn, not blank
    plots = image[900:3000]
    non_white = (plots.min(axis=2) < 235).mean()
    colours = len(np.unique(plots[..., 0] << 16 | plots[..., 1] << 8 | plots[..., 2]))
    assert non_white > 0.03, f"only {non_white:.1%} of the plot area is drawn"
    assert colours > 300, f"only {colours} distinct colours: the plots did not render"

    def near(rgb):  # pixels of one of matplotlib's line colours
        return int((np.abs(plots - np.array(rgb)).max(axis=2) < 30).sum())

    assert near((0x1F, 0x77, 0xB4)) > 500 and near((0xD6, 0x27, 0x28)) > 200  # blue train, red valid lines


def test_a_real_h100_run_reads_as_an_underused_gpu(tmp_path, monkeypatch):
    """The monitor's NVML samples of a real GPU run: the answer and the plot are measured numbers."""
    run_dir = shutil.copytree(FIXTURES / "h100-base-fp16", tmp_path / "run")
    samples = [json.loads(line) for line in (run_dir / "samples" / "gpu0.jsonl").read_text().splitlines()]
    assert all(len(s["gpus"]) == 1 and s["gpus"][0]["mem_total_mb"] > 80_000 for s in samples)
    placeholders, draw = [], plots.empty_panel
    monkeypatch.setattr(plots, "empty_panel", lambda ax, message: (placeholders.append(message), draw(ax, message)))
    build_report(run_dir)
    assert not [p for p in placeholders if "GPU" in p], placeholders  # the GPU plot is drawn from samples
    an = A.analyze(A.load(run_dir))
    gpus = an.get("gpus")
    assert gpus.verdict == "underused"
    assert 5 < gpus.numbers["mean_util_percent"] < 15
    assert 5_000 < gpus.numbers["peak_mem_mb"]["gpu0:0"] < 7_000
    assert an.get("duration").numbers["update"] == 600
    assert an.get("checkpoints").numbers["params"] == 60_104_704


def test_every_rank_of_a_finished_run_is_finished_in_the_hosts_table(tmp_path):
    """fairseq says "done training" on rank 0 only; v100b (rank 1) finished with it."""
    from train.report import page

    run_dir = copy_run(tmp_path / "run")
    for host in ("v100a", "v100b"):  # the fixture run was stopped: make it one that completed
        log = run_dir / "logs" / f"{host}.log"
        text = log.read_text().split("Traceback")[0].rsplit("\n", 1)[0] + "\n"
        if host == "v100a":
            text += "2026-11-22 08:20:00 | INFO | fairseq_cli.train | done training in 180.0 seconds\n"
        log.write_text(text)
    data = A.load(run_dir)
    assert data.log.finished and not data.logs["v100b"].finished and not data.logs["v100b"].errors
    rows = {row["name"]: row["state"] for row in page.host_rows(A.analyze(data, link_mbps=100))}
    assert rows == {"v100a": "finished", "v100b": "finished"}


def test_the_hosts_table_says_what_a_host_after_rank_0_did_not_its_warning_fragment(tmp_path):
    """v100b (rank 1) logs no update: its last line is a PyTorch warning's fragment; the table says it
    trained in step with rank 0, and rank 0's last update."""
    from train.report import page

    run_dir = copy_run(tmp_path / "run")
    log = run_dir / "logs" / "v100b.log"
    log.write_text(log.read_text().split("Traceback")[0] + "  key_padding_mask = _canonical_mask(\n")
    an = A.analyze(A.load(run_dir), link_mbps=100)
    tails = {row["name"]: row["tail"] for row in page.host_rows(an)}
    last = max(r.update for r in an.data.log.records if r.update is not None)
    assert tails["v100b"] == f"in step with rank 0 (its last logged update: {last:,})"
    assert tails["v100a"] == an.data.tails["v100a"][:200]  # rank 0's own last line


def test_the_report_says_which_ranks_each_host_ran(tmp_path):
    """A run on 2 hosts x 2 ranks (run.json's ranks_per_host): the header and the hosts table name
    each host's ranks; a run.json from before hosts ran several reads as one rank a host."""
    from train.report import page

    run_dir = copy_run(tmp_path / "run")
    run = json.loads((run_dir / "run.json").read_text())
    assert page.host_ranks(run) == {"v100a": "0", "v100b": "1"}
    (run_dir / "run.json").write_text(json.dumps({**run, "ranks_per_host": 2}))
    an = A.analyze(A.load(run_dir), link_mbps=100)
    assert page.header_meta(an)[0] == "hosts v100a (ranks 0-1), v100b (ranks 2-3) (rank 0: v100a)"
    assert [(row["name"], row["ranks"]) for row in page.host_rows(an)] == [("v100a", "0-1"), ("v100b", "2-3")]


def test_the_step_time_answer_says_the_fill_beside_words_a_second():
    """Words/s count target words: the report says what share of the batches they filled, from the run
    record's max_tokens and update_freq (as fab train derived them) and its ranks."""
    line = ('2026-11-26 14:32:40 | INFO | train_inner | {{"epoch": 1, "update": {u}, "loss": "9.5", '
            '"ups": "2", "wps": "28000", "wpb": "14000", "num_updates": "{u}", "wall": "{u}"}}')
    run = {"run_id": "r", "hosts": ["a", "b"], "preset": "transformer_wmt_en_de", "max_tokens": 4096,
           "update_freq": 2}
    data = A.from_texts(run, {"a": [line.format(u=u) for u in (10, 20, 30)]}, {})
    said = A.answer_step_time(data, series.intervals(data))
    assert said.numbers["fill"] == pytest.approx(14000 / (4096 * 2 * 2))
    assert "28,000 words/s at fill 0.85" in said.answer, said.answer


def test_the_report_says_the_newest_copy_off_the_cluster_its_age_and_where(tmp_path):
    """`fab report` writes offsite.json from the hosts' keepers (train.run.offsite.summary) beside cost.json."""
    from train.recipe.record import Run
    from train.run import offsite

    class Host:  # a host's answer as train.run.launch.states gives it: its keeper's offsite.json
        name, reachable = "v100a", True
        keeper = {"offsite": {"newest": {"kind": "last", "update": 1200, "time": 1000.0,
                                         "where": "s3://ckpts/runs/run-081616/u1200"},
                              "error": "", "uploading": [1400], "closing": False}}

    run = Run(run_id="run-081616", hosts=["v100a"], preset="tiny", overrides=[], dataset="synthetic",
              checkpoints_to="s3://ckpts/runs")
    run_dir = copy_run(tmp_path / "run")
    (run_dir / "offsite.json").write_text(json.dumps(offsite.summary(run, [Host()], now=1600.0)))
    build_report(run_dir, link_mbps=100)
    said = next(a for a in json.loads((run_dir / "answers.json").read_text())["answers"] if a["key"] == "offsite")
    assert said["answer"].startswith("update 1,200, copied 10m00s before this report, at "
                                     "s3://ckpts/runs/run-081616/u1200 (`fab train --resume-from s3://ckpts/runs`")
    assert said["answer"].endswith("v100a was uploading update 1,400.") and said["verdict"] == "copied"
    assert "Where is the newest checkpoint copy off the cluster?" in (run_dir / "index.html").read_text()
