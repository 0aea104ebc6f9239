"""Bounded loss: each preset's checkpoint interval against ~10 minutes, and `fab train`'s start line."""

from __future__ import annotations

import pytest

from train.run import interval
from train.run.interval import BOUND_S, REFERENCE, StepFigure
from train.run.presets import PRESETS

BENCH = {
    "benchmark": "bench-step", "timestamp": "2026-11-23T05:51:26+00:00", "preset": "tiny", "overrides": [],
    "n_hosts": 2, "ranks": 2, "precision": "fp32", "comm": "sync", "compute_s": 0.165,
    "points": [{"rate": "100mbit", "s_per_update": 0.271}, {"rate": "none", "s_per_update": 0.17}],
}
RUN = {"preset": "tiny", "overrides": [], "precision": "fp32", "comm": "sync", "n_hosts": 2, "ranks": 2}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_loses_at_most_ten_minutes_on_its_hardware(name):
    every = PRESETS[name]["save_interval_updates"]
    ref = REFERENCE[name]
    assert every > 0
    assert interval.interval_s(every, ref.s_per_update) <= BOUND_S, (name, every, ref)
    assert interval.fits(every, ref.s_per_update)
    # and not needlessly often: a checkpoint costs a save of every parameter and Adam's moments
    assert interval.interval_s(every, ref.s_per_update) >= 20, name


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
