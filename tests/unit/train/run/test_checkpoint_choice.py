"""`fab train` chooses a run's checkpoint interval in minutes of its own step: the fairseq command
saves every ~10 minutes of a measured (bench-step) or predicted (the preset's reference) update, and
a user's --set save_interval_updates wins."""

from __future__ import annotations

import json

import pytest

from train.cluster import Host
from train.plan import measurements
from train.recipe.record import Run
from train.run import interval
from train.run.launch import host_commands

HOSTS = [Host("v100a", "10.10.0.1"), Host("v100b", "10.10.0.2")]


@pytest.fixture
def bench_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(measurements, "REPORT_DIR", tmp_path)  # no bench-step of this checkout's reports
    return tmp_path


def base_run(*overrides: str, update_freq: int = 4) -> Run:
    return Run(run_id="r", hosts=[h.name for h in HOSTS], preset="transformer_wmt_en_de", overrides=list(overrides),
               dataset="wmt16", precision="fp32", max_tokens=4096, update_freq=update_freq)


def saves_every(run: Run) -> int:
    argv = host_commands(run, HOSTS)["v100a"].split()
    return int(argv[argv.index("--save-interval-updates") + 1])


def test_a_measured_0_3_s_step_saves_every_2000_updates(bench_dir):
    (bench_dir / "step-latest.json").write_text(json.dumps({
        "benchmark": "bench-step", "timestamp": "2026-11-27T10:00:00+00:00", "preset": "transformer_wmt_en_de",
        "overrides": [], "n_hosts": 2, "ranks": 2, "precision": "fp32", "comm": "sync", "max_tokens": 4096,
        "update_freq": 4, "compute_s": 0.07, "points": [{"rate": "none", "s_per_update": 0.3}]}))
    run = base_run()
    saves = interval.choose(run, HOSTS, read_log=False)
    assert saves_every(run) == 2000
    assert saves.phrase() == ("checkpoint every 2,000 updates (≈ 10 min at 0.30 s/update, "
                              "fab bench-step of 2026-11-27T10:00:00+00:00)")
    # the same bench on a run of twice the update-freq: its compute part twice, 0.58 s → 1,000
    slower = base_run(update_freq=8)
    saves = interval.choose(slower, HOSTS, read_log=False)
    assert saves.figure.s_per_update == pytest.approx(0.3 + 4 * 0.07)
    assert saves_every(slower) == 1000 and "scaled from 4,096 x 4 to 4,096 x update-freq 8" in saves.phrase()


def test_unmeasured_the_reference_predicts_the_step(bench_dir):
    run = base_run(update_freq=16)  # 4,096 x 16 = 65,536 tokens a rank: twice the reference's 32,768
    saves = interval.choose(run, HOSTS, read_log=False)
    assert saves.figure.s_per_update == pytest.approx(0.35)
    assert saves_every(run) == 1000
    assert saves.phrase() == ("checkpoint every 1,000 updates (≈ 6 min at 0.35 s/update, predicted: an H100's step "
                              "x2 for the network, scaled to 65,536 tokens a rank; `fab bench-step --rates none` "
                              "measures it)")
    # fewer tokens a rank than the reference's least step: launch-bound, no faster than 0.122 s
    small = base_run(update_freq=1)
    assert interval.choose(small, HOSTS, read_log=False).figure.s_per_update == pytest.approx(0.122)
    assert saves_every(small) == 2000


def test_the_users_interval_wins(bench_dir):
    run = base_run("save_interval_updates=30000")
    saves = interval.choose(run, HOSTS, read_log=False)
    assert saves_every(run) == 30000
    assert saves.phrase().startswith("checkpoint every 30,000 updates as set (≈ 1 h 01 min at 0.12 s/update")
    assert "save_interval_updates=2000" in saves.warning()  # over the bound: the interval that keeps it


def test_a_resumed_run_chooses_again_from_scratch(bench_dir):
    run = base_run()
    run.save_interval_updates = 100  # chosen at its start on other hardware
    interval.choose(run, HOSTS, read_log=False)
    assert saves_every(run) == 2000


def big_run(link_mbps: float | None) -> Run:
    return Run(run_id="r", hosts=[h.name for h in HOSTS], preset="transformer_vaswani_wmt_en_de_big", overrides=[],
               dataset="wmt16", precision="fp16", max_tokens=26985, update_freq=17, link_mbps=link_mbps,
               gpu_name="NVIDIA H100 80GB HBM3")


def test_a_slow_link_stretches_the_interval_so_copies_to_the_peers_stay_a_fifth_of_it(bench_dir):
    """Big's 2.5 GB checkpoint crosses a 100 Mbit/s link to the other host in ~200 s: saving every 10
    minutes would keep the link copying a third of the time, beside the all-reduce."""
    fast = big_run(10_000)
    fast_saves = interval.choose(fast, HOSTS, read_log=False)
    assert fast_saves.replication_s is None and "reach the other hosts" not in fast_saves.phrase()
    assert fast_saves.every * fast_saves.figure.s_per_update <= interval.BOUND_S * 1.1

    slow = big_run(100)
    saves = interval.choose(slow, HOSTS, read_log=False)
    copy_s = saves.replication_s * interval.REPLICATION_SHARE
    assert 190 < copy_s < 215
    assert slow.save_interval_updates == saves.every  # what the hosts' commands carry
    assert saves.every * saves.figure.s_per_update >= 0.5 * saves.replication_s  # a round number at most 2x under
    assert saves.every > fast_saves.every
    assert "longer than 10 min: each checkpoint takes 3 min" in saves.phrase() and saves.warning() is None
