"""bench-step with --comm: local SGD's uneven updates are averaged, strategies compared side by side."""

from __future__ import annotations

import statistics
from types import SimpleNamespace

import pytest

from benchmarks import step


def _updates(seconds: list[float]) -> dict[int, dict[str, float]]:
    return {i + 1: {"s": s, "wps": 1000 / s, "wpb": 1000.0} for i, s in enumerate(seconds)}


def test_local_sgd_counts_the_sync_update_that_a_median_would_hide():
    # H = 4: three local updates, then one that waits for the all-reduce
    updates = _updates([1.0, 1.0, 1.0, 5.0, 1.0, 1.0, 1.0, 5.0])
    segments = [{"rate": "100mbit", "cycle": 0, "first": 1, "last": 8, "tx": {"a": 0}}]
    median = step.summarize(["100mbit"], segments, updates, {"100mbit": 95.0})[0]
    mean = step.summarize(["100mbit"], segments, updates, {"100mbit": 95.0}, statistics.mean)[0]
    assert median["s_per_update"] == 1.0
    assert mean["s_per_update"] == 2.0
    assert mean["wps"] == 500.0  # all the words over all the time


def test_local_sgd_predictions_divide_the_all_reduce_by_h():
    point = {"rate": "100mbit", "link_mbps": 100.0, "allreduce_mbps": 100.0}
    sync = step.comm_s(point, 1_000_000, 2, 2)
    assert step.comm_s(point, 1_000_000, 2, 2, comm="local-sgd:8") == sync / 8
    assert step.comm_s(point, 1_000_000, 2, 2, comm="fp16") == sync / 2


def test_strategies_side_by_side_against_sync_uncapped_and_their_own():
    def report(comm, capped_s, own_s):
        # local SGD's logged words are one rank's: the shares must come from updates/s
        wps = 500.0 if comm != "sync" else 1000.0
        return {"comm": comm, "points": [{"rate": "100mbit", "s_per_update": capped_s, "wps": wps / capped_s},
                                         {"rate": "none", "s_per_update": own_s, "wps": wps / own_s}]}

    table = step.compare([report("sync", 2.5, 1.0), report("local-sgd:14", 1.0 / 0.9, 1.0 / 0.95)])
    row = next(line for line in table.splitlines() if "local-sgd:14" in line and "100mbit" in line)
    assert "90%" in row and "95%" in row  # 0.9 of sync's 1 update/s; 0.9 of its own 0.95


def test_bench_step_auto_measures_what_fab_train_would_pick_at_each_capped_rate(monkeypatch):
    """`fab bench-step --comm auto`: the predict model's pick at each capped rate (not the uncapped
    one), one job per distinct pick; a pick bench-step cannot run (--update-freq) is named."""
    from train.cluster import ClusterError
    from train.plan import model, predict

    picks = {"10": ("local-sgd:136", 1), "100": ("local-sgd:15", 1), "1000": ("local-sgd:15", 1)}
    asked = []
    derived = 1

    def predict_for(hosts, preset, overrides, dataset, link, **kwargs):
        asked.append(link)
        comm, k = picks[link]
        prediction = model.predict(3_938_304, 2, 1e9, 0.8, comm=comm, update_freq=k)
        return SimpleNamespace(choice=model.Choice(prediction, [prediction], True, 0.9),
                               batch=SimpleNamespace(update_freq=derived))  # the batch bench-step runs

    monkeypatch.setattr(predict, "predict_for", predict_for)
    rates = ["10mbit", "100mbit", "1gbit", "none"]
    said = []
    assert step.auto_per_rate([], rates, "tiny", [], "synthetic", "fp32", say=said.append) == [
        "local-sgd:136", "local-sgd:15"]
    assert asked == ["10", "100", "1000"]
    assert said[0].startswith("--comm auto at 10mbit: local-sgd:136 (") and said[0].endswith("% predicted)")
    picks["100"] = ("sync", 4)
    with pytest.raises(ClusterError, match=r"--comm auto at 100mbit picks --comm sync --update-freq 4: bench-step "
                                           r"measures --comm strategies only"):
        step.auto_per_rate([], rates, "tiny", [], "synthetic", "fp32", say=lambda *_: None)
    derived = 4  # the run's own batch is 4 batches an update: sync at it is what bench-step measures
    assert "sync" in step.auto_per_rate([], rates, "tiny", [], "synthetic", "fp32", say=lambda *_: None)
