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


def test_a_network_bound_sync_verdict_names_the_comm_that_reaches_90_percent():
    from benchmarks import model, predict
    from train.cluster import Host

    hosts = [Host("v100a", "10.0.0.1"), Host("v100b", "10.0.0.2")]
    params = model.transformer_params(32000, 512, 2048, 6, 6)
    v = predict.assess(hosts, params, link_mbps=100.0, link_source="given", compute_s=0.6, compute_source="given",
                       precision="fp16", overlap=0.6)
    assert v.network_bound and v.comm == "sync"
    assert v.choice and v.choice.comm.startswith("local-sgd:") and v.choice.reached
    assert any(line.startswith(f"{v.choice.flag()} would reach 90%") for line in v.lines), v.lines
    auto = predict.assess(hosts, params, link_mbps=100.0, link_source="given", compute_s=0.6,
                          compute_source="given", precision="fp16", overlap=0.6, comm="auto")
    assert auto.comm == v.choice.comm and not auto.network_bound
    assert auto.prediction.efficiency >= 0.9


def test_auto_without_a_compute_figure_says_how_to_get_one():
    import pytest

    from benchmarks import predict
    from train.cluster import ClusterError, Host

    hosts = [Host("v100a", "10.0.0.1"), Host("v100b", "10.0.0.2")]
    with pytest.raises(ClusterError, match="fab bench-step --rates none"):
        predict.assess(hosts, 1_000_000, link_mbps=100.0, link_source="given", compute_s=None,
                       compute_source="unknown", comm="auto")


def test_bench_step_auto_measures_what_fab_train_would_pick_at_each_capped_rate(monkeypatch):
    """`fab bench-step --comm auto`: the predict model's pick at each capped rate (not the uncapped
    one), one job per distinct pick; a pick bench-step cannot run (--update-freq) is named."""
    import fabfile
    from benchmarks import model
    from benchmarks import predict as bench_predict
    from train.cluster import ClusterError

    picks = {"10": ("local-sgd:136", 1), "100": ("local-sgd:15", 1), "1000": ("local-sgd:15", 1)}
    asked = []

    def predict_for(hosts, preset, overrides, dataset, link, **kwargs):
        asked.append(link)
        comm, k = picks[link]
        prediction = model.predict(3_938_304, 2, 1e9, 0.8, comm=comm, update_freq=k)
        return SimpleNamespace(choice=model.Choice(prediction, [prediction], True, 0.9))

    monkeypatch.setattr(bench_predict, "predict_for", predict_for)
    rates = ["10mbit", "100mbit", "1gbit", "none"]
    assert fabfile._auto_per_rate([], rates, "tiny", [], "synthetic", "fp32") == ["local-sgd:136", "local-sgd:15"]
    assert asked == ["10", "100", "1000"]
    picks["100"] = ("sync", 4)
    with pytest.raises(ClusterError, match=r"--comm auto at 100mbit picks --comm sync --update-freq 4: bench-step "
                                           r"measures --comm strategies only"):
        fabfile._auto_per_rate([], rates, "tiny", [], "synthetic", "fp32")
