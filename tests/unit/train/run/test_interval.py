"""Bounded loss: each preset's checkpoint interval against ~10 minutes, and `fab train`'s start line."""

from __future__ import annotations

import pytest

from train.recipe.presets import PRESETS
from train.run import interval
from train.run.interval import BOUND_S, REFERENCE, StepFigure

BENCH = {
    "benchmark": "bench-step", "timestamp": "2026-11-23T05:51:26+00:00", "preset": "tiny", "overrides": [],
    "n_hosts": 2, "ranks": 2, "precision": "fp32", "comm": "sync", "compute_s": 0.165,
    "points": [{"rate": "100mbit", "s_per_update": 0.271}, {"rate": "none", "s_per_update": 0.17}],
}
RUN = {"preset": "tiny", "overrides": [], "precision": "fp32", "comm": "sync", "n_hosts": 2, "ranks": 2}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_loses_at_most_its_bound_on_its_hardware(name):
    ref = REFERENCE[name]
    every = PRESETS[name]["save_interval_updates"]
    # the preset's value is what fab train derives on the hardware it is meant for
    assert interval.derived_interval(name, interval.predicted_step(name)) == every
    assert 0 < interval.interval_s(every, ref.s_per_update) <= BOUND_S, (name, every, ref)
    # and not needlessly often: a checkpoint costs a save of every parameter and Adam's moments
    assert interval.interval_s(every, ref.s_per_update) >= 20, name


def test_a_measured_step_of_0_3_s_checkpoints_every_2000_updates():
    figure = StepFigure(0.3, "fab bench-step of 2026-11-23T05:51:26+00:00")
    every = interval.derived_interval("transformer_wmt_en_de", figure)
    assert every == 2000  # 10 min: 0.3 s → 2,000; 5,000 would be 25 min
    assert interval.start_phrase(every, figure) == (
        "checkpoint every 2,000 updates (≈ 10 min at 0.30 s/update, fab bench-step of 2026-11-23T05:51:26+00:00)")


def test_without_a_measurement_the_reference_predicts_the_step_for_the_runs_batch():
    ref = REFERENCE["transformer_vaswani_wmt_en_de_big"]
    # big's recipe on 2 V100s: 229,376 tokens a rank; an H100 is 989.4/125 = 7.9x a V100's peak
    figure = interval.predicted_step("transformer_vaswani_wmt_en_de_big", 229376, "Tesla V100-SXM2-16GB")
    assert figure.s_per_update == pytest.approx(ref.s_per_update * 229376 / ref.tokens * 989.4 / 125)
    assert figure.source.startswith("predicted: an H100's step")
    assert "Tesla V100-SXM2-16GB" in figure.source and "fab bench-step" in figure.source
    assert interval.derived_interval("transformer_vaswani_wmt_en_de_big", figure) == 20  # 16.8 s: 5.6 min
    # the same recipe on 2 hosts x 8 H100: 28,672 tokens a rank, 0.265 s → 2,000 updates ≈ 9 min
    h100s = interval.predicted_step("transformer_vaswani_wmt_en_de_big", 28672, "NVIDIA H100 80GB HBM3")
    assert h100s.s_per_update == pytest.approx(0.265, abs=0.001)
    assert interval.derived_interval("transformer_vaswani_wmt_en_de_big", h100s) == 2000
    # fewer tokens a rank than a launch-bound step's: no faster than it
    few = interval.predicted_step("transformer_wmt_en_de", 1024)
    assert few.s_per_update == REFERENCE["transformer_wmt_en_de"].least_s
    # the lab's tiny keeps 50 updates (its tests resume past update 50), measured or not
    assert interval.derived_interval("tiny", interval.predicted_step("tiny", 2048)) == 50
    assert interval.derived_interval("tiny", StepFigure(0.14, "fab bench-step of ...")) == 50


def test_the_users_interval_wins_and_is_said_as_set():
    figure = StepFigure(0.3, "this run's log")
    assert interval.derived_interval("transformer_wmt_en_de", figure, given=7000) == 7000
    assert interval.derived_interval("transformer_wmt_en_de", None, given=0) == 0
    assert interval.start_phrase(7000, figure, given=True) == (
        "checkpoint every 7,000 updates as set (≈ 35 min at 0.30 s/update, this run's log)")
    assert interval.derived_interval("transformer_wmt_en_de", None) is None  # nothing to derive from


def test_the_start_line_says_the_interval_and_its_time():
    figure = StepFigure(0.27, "fab bench-step of 2026-11-23T05:51:26+00:00")
    assert interval.start_phrase(2000, figure) == (
        "checkpoint every 2,000 updates (≈ 9 min at 0.27 s/update, fab bench-step of 2026-11-23T05:51:26+00:00)")
    assert interval.start_phrase(50, StepFigure(0.5, "this run's log")) == (
        "checkpoint every 50 updates (≈ 25 s at 0.50 s/update, this run's log)")
    unmeasured = interval.start_phrase(4000, None)
    assert unmeasured.startswith("checkpoint every 4,000 updates (time unmeasured")
    assert "fab bench-step" in unmeasured
    assert "no periodic checkpoint" in interval.start_phrase(0, figure)


def test_durations_and_steps_read_well():
    assert interval.format_duration(25) == "25 s"
    assert interval.format_duration(540) == "9 min"
    assert interval.format_duration(3900) == "1 h 05 min"
    assert interval.format_step(0.061) == "0.061"
    assert interval.format_step(1.8) == "1.80"
    assert interval.format_step(12.34) == "12.3"


def test_over_the_bound_names_the_interval_that_keeps_it():
    assert interval.over_bound(2000, StepFigure(0.27, "x")) is None  # 9 min
    assert interval.over_bound(2000, None) is None  # unmeasured: nothing to say
    line = interval.over_bound(2000, StepFigure(1.8, "x"))  # the field report's V100s at 1 Gb/s: 1 h
    assert line and "1 h 00 min" in line and "save_interval_updates=200" in line
    assert "≈ 6 min" in line


@pytest.mark.parametrize(("s", "expected"), [(0.27, 2000), (1.8, 200), (0.122, 2000), (0.061, 5000),
                                             (0.5, 1000), (700, 1), (3.0, 200)])
def test_suggested_interval_is_round_and_within_the_bound(s, expected):
    n = interval.suggested_interval(s)
    assert n == expected
    assert n == 1 or n * s <= BOUND_S


def test_a_bench_step_of_the_same_model_gives_its_uncapped_step():
    figure = interval.from_bench(BENCH, **RUN)
    assert figure == StepFigure(0.17, "fab bench-step of 2026-11-23T05:51:26+00:00")


def test_a_bench_step_of_another_model_or_cluster_gives_nothing():
    assert interval.from_bench(None, **RUN) is None
    assert interval.from_bench(BENCH, **{**RUN, "preset": "transformer_wmt_en_de"}) is None
    assert interval.from_bench(BENCH, **{**RUN, "overrides": ["encoder_embed_dim=256"]}) is None
    assert interval.from_bench(BENCH, **{**RUN, "n_hosts": 3, "ranks": 3}) is None
    assert interval.from_bench(BENCH, **{**RUN, "comm": "local-sgd:16"}) is None
    # overrides that do not change a step's cost do not matter
    assert interval.from_bench(BENCH, **{**RUN, "overrides": ["max_update=200", "save_interval_updates=10"]})


def test_update_freq_multiplies_the_compute_part_and_compute_only_is_said():
    figure = interval.from_bench(BENCH, **RUN, update_freq=2)
    assert figure.s_per_update == pytest.approx(0.17 + 0.165)
    assert "update-freq 2" in figure.source
    no_none = {**BENCH, "points": [BENCH["points"][0]]}
    figure = interval.from_bench(no_none, **RUN)
    assert figure.s_per_update == pytest.approx(0.165) and figure.source.startswith("compute only")


def test_the_runs_own_log_gives_its_recent_step():
    lines = [f'2026-11-23 06:00:{i:02d} | INFO | train_inner | {{"epoch": 1, "update": 1.0, "loss": "5.0", '
             f'"ups": "2.0", "wpb": "100", "wps": "200", "num_updates": "{10 * (i + 1)}", "wall": "{5 * (i + 1)}"}}'
             for i in range(5)]
    figure = interval.from_log("\n".join(lines))
    assert figure == StepFigure(0.5, "this run's log")
    assert interval.from_log("") is None
