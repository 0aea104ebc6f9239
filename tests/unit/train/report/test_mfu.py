"""MFU (train.plan.mfu) and the report's "Were the GPUs fully used?" from NVML and MFU together."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from train.plan import mfu
from train.recipe import presets
from train.report import answers as A

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures"
H100 = "NVIDIA H100 80GB HBM3"


def test_mfu_is_the_hand_computation():
    # Transformer base, 32k joint vocabulary: 32,000 x 512 embeddings + 6 encoder layers of 3,152,384
    # + 6 decoder layers of 4,204,032 = 60,522,496 parameters; attention 12 x 512 x 27 x (6 + 2 x 6)
    per_token = 6 * 60_522_496 + 12 * 512 * 27 * 18
    options = presets.resolve("transformer_wmt_en_de").options
    assert mfu.flops_per_token(options, 32000, 27) == per_token == 366_120_960
    # the best measured H100 figure, 294,784 words/s, on one H100 SXM (989.4 TFLOP/s dense)
    assert mfu.mfu(294_784, per_token, 1, H100) == pytest.approx(per_token * 294_784 / 989.4e12)
    assert mfu.mfu(294_784, per_token, 1, H100) == pytest.approx(0.1091, abs=1e-4)
    assert mfu.mfu(2 * 294_784, per_token, 2, H100) == pytest.approx(0.1091, abs=1e-4)  # two GPUs, twice the words


def test_an_unknown_gpu_has_no_peak_never_a_guess():
    assert mfu.peak_tflops("NVIDIA GeForce RTX 4090") is None
    assert mfu.mfu(1e5, 1e9, 1, "NVIDIA GeForce RTX 4090") is None
    assert mfu.mfu_text(None, "NVIDIA GeForce RTX 4090") == "MFU: peak unknown (NVIDIA GeForce RTX 4090)"
    assert mfu.peak_tflops("Tesla V100-SXM2-32GB") == 125.0 and mfu.peak_tflops("NVIDIA A100-SXM4-80GB") == 312.0


def h100_run(tmp_path: Path, util: float | None = None) -> Path:
    """The recorded H100 run (base fp16, 600 updates at 18.1k words/s) with the GPU's name that
    `fab train` now records from the probe; `util`: NVML's utilization rewritten in every sample."""
    run_dir = shutil.copytree(FIXTURES / "report" / "h100-base-fp16", tmp_path / "run")
    run = json.loads((run_dir / "run.json").read_text())
    (run_dir / "run.json").write_text(json.dumps({**run, "gpu_name": H100}))
    if util is not None:
        path = run_dir / "samples" / "gpu0.jsonl"
        samples = [json.loads(line) for line in path.read_text().splitlines()]
        for s in samples:
            for g in s.get("gpus") or []:
                g["util_percent"] = util
        path.write_text("".join(json.dumps(s) + "\n" for s in samples))
    return run_dir


def test_the_recorded_h100_run_is_underused_by_nvml_and_by_mfu(tmp_path):
    gpus = A.analyze(A.load(h100_run(tmp_path))).get("gpus")
    assert gpus.verdict == "underused"
    assert 0.005 < gpus.numbers["mfu"] < 0.009  # ~18k words/s x 0.37 GFLOP per word of 989 TFLOP/s
    assert gpus.answer.startswith("no: mean utilization while training") and f"{H100}'s 989.4 TFLOP/s" in gpus.answer


def test_nvml_busy_while_mfu_is_low_says_the_gpus_wait(tmp_path):
    """The field report's case: NVML at 100% while every step waits on a slow link."""
    an = A.analyze(A.load(h100_run(tmp_path, util=100.0)))
    gpus = an.get("gpus")
    assert gpus.verdict == "waiting"
    assert gpus.answer.startswith("no: NVML says busy (100 % mean") and "the kernels wait" in gpus.answer
    assert "GPUs busy 100% · MFU 1% (waiting)" in A.verdict_line(an.get("network"), gpus)


def test_without_a_gpu_name_the_answer_says_peak_unknown(tmp_path):
    run_dir = h100_run(tmp_path)
    (run_dir / "run.json").write_text(json.dumps({**json.loads((run_dir / "run.json").read_text()), "gpu_name": None}))
    gpus = A.analyze(A.load(run_dir)).get("gpus")
    assert gpus.numbers["mfu"] is None and "MFU: peak unknown" in gpus.answer


def test_a_lab_run_at_10mbit_has_no_gpu_and_no_mfu_and_is_network_bound():
    lab = FIXTURES / "watch" / "cpu-10mbit"
    run = json.loads((lab / "run.json").read_text())
    samples = {h: [json.loads(x) for x in (lab / f"{h}.jsonl").read_text().splitlines()] for h in ("v100a", "v100b")}
    data = A.from_texts(run, {"v100a": (lab / "v100a.log").read_text().splitlines()}, samples)
    an = A.analyze(data, link_mbps=10)
    gpus = an.get("gpus")
    assert gpus.verdict == "absent" and "mfu" not in gpus.numbers
    assert A.verdict_line(an.get("network"), gpus).startswith("network-bound")
