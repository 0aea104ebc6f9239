"""`fab watch` says the run's MFU once, at the end of its verdict line (train.report.answers, as
`fab report` says it): on a GPU run the median logged words/s (all ranks) over the run's GPUs at the
peak of the GPU NVML names; an unknown GPU is said, never guessed; a CPU run has none."""

from __future__ import annotations

import json

import pytest
from rich.console import Console
from watch_replay import at, cpu_run, gpu_run

from train.watch import render, screen
from train.watch.feed import Reading

H100 = "NVIDIA H100 80GB HBM3"
BIG = {"run_id": "big-h100", "hosts": ["gpu0"], "preset": "transformer_vaswani_wmt_en_de_big", "overrides": [],
       "dataset": "wmt16-en-de", "precision": "fp16"}


pytestmark = pytest.mark.usefixtures("utc")  # conftest: the log times read as UTC


def inner(stamp: str, updates: int, wps: float) -> str:
    """A fairseq train_inner line (--log-format json) as rank 0 logs it: the big preset on one H100,
    458,752 tokens per update (30,583 x update-freq 15)."""
    stats = {"epoch": 1, "update": 0.1, "loss": "6.912", "nll_loss": "5.611", "ppl": "48.9", "wps": f"{wps:.1f}",
             "ups": "0.41", "wpb": "458752", "bsz": "15320", "num_updates": str(updates), "lr": "0.000489",
             "gnorm": "0.612", "loss_scale": "16", "train_wall": "24", "gb_free": "15.8", "wall": "490"}
    return f"{stamp} | INFO | train_inner | {json.dumps(stats)}"


LOG = ["2026-11-25 04:00:00 | INFO | fairseq_cli.train | training on 1 devices (GPUs/TPUs)",
       inner("2026-11-25 04:04:04", 100, 187_930.4),
       inner("2026-11-25 04:08:06", 200, 189_407.0)]  # the latest: what the view says


def samples(host: str, gpu_name: str | None, util: float = 97.0) -> list[dict]:
    """The monitor's samples (train.agent.measure.monitor) every 2 s up to the last log line."""
    gpu = {"index": 0, "util_percent": util, "mem_used_mb": 65_300.0, "mem_total_mb": 81_559.0}
    if gpu_name:
        gpu["name"] = gpu_name
    end = at("2026-11-25 04:08:06")
    return [{"t": end - 2 * i, "host": host, "nic": "eth0", "tx_Bps": 0.0, "rx_Bps": 0.0, "cpu_percent": 8.0,
             "gpus": [gpu]} for i in range(30, -1, -1)]


def gpu_readings(gpu_name: str | None, hosts: int = 1) -> list[Reading]:
    now = at("2026-11-25 04:08:07")
    return [Reading(f"gpu{i}", i, 1, reachable=True, running=True, samples=samples(f"gpu{i}", gpu_name),
                    log_lines=LOG if i == 0 else [], answered_at=now) for i in range(hosts)]


def text_of(shown: screen.Screen) -> str:
    console = Console(width=80, height=24, record=True, color_system=None, force_terminal=False)
    console.print(render.render(shown, 80, 24))
    return console.export_text()


def verdict_line(text: str) -> str:
    """The verdict line (`⇒ ...`), with what wrapped onto the following lines joined back."""
    lines = text.splitlines()
    at_ = next(i for i, line in enumerate(lines) if line.startswith("⇒"))
    return " ".join(" ".join(lines[at_:]).split())


def test_big_on_one_h100_at_189407_words_per_second_is_24_percent_mfu():
    """The issue's measurement: big fp16 on one H100 80GB HBM3, 189,407 words/s: 24.1% of 989.4 TFLOP/s."""
    shown = screen.build(BIG, gpu_readings(H100), at("2026-11-25 04:08:07"))
    text = text_of(shown)
    assert verdict_line(text).endswith("GPUs busy 97% · MFU 24%")
    assert text.count("MFU") == 1  # one figure on the screen


def test_the_mfu_is_over_all_the_runs_gpus():
    """The same words/s on two hosts of one H100 each: half the utilization."""
    run = {**BIG, "hosts": ["gpu0", "gpu1"]}
    shown = screen.build(run, gpu_readings(H100, hosts=2), at("2026-11-25 04:08:07"))
    assert shown.verdict.endswith("· MFU 12%")


def test_the_probes_gpu_name_serves_when_the_samples_name_none():
    """run.json's gpu_name (the probe at `fab train`'s start) where the monitor's samples predate names."""
    shown = screen.build({**BIG, "gpu_name": H100}, gpu_readings(None), at("2026-11-25 04:08:07"))
    assert shown.verdict.endswith("· MFU 24%")


def test_an_unknown_gpu_is_named_not_guessed():
    shown = screen.build(BIG, gpu_readings("NVIDIA GeForce RTX 4090"), at("2026-11-25 04:08:07"))
    text = text_of(shown)
    assert verdict_line(text).endswith("· MFU: peak unknown (NVIDIA GeForce RTX 4090)")
    assert all(len(line) <= 80 for line in text.splitlines()) and len(text.splitlines()) <= 24


def test_a_gpu_named_nowhere_is_peak_unknown():
    """The recorded H100 base run: samples from before the monitor named GPUs, no probe record."""
    now = 1795390065.714 + 100
    run, readings = gpu_run(now, 1)
    shown = screen.build(run, readings, now)
    assert shown.verdict.endswith("· MFU: peak unknown") and text_of(shown).count("MFU") == 1


def test_a_cpu_run_says_no_mfu():
    """The lab: two CPU hosts. No GPU, no peak: the words/s alone."""
    now = at("2026-11-23 02:13:30")
    run, readings = cpu_run(now)
    shown = screen.build(run, readings, now)
    text = text_of(shown)
    assert shown.run.wps and "words/s" in text and "MFU" not in text
