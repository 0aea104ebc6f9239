"""`fab predict` and `fab train`'s network check: the verdict from the figures, where each figure comes from,
and the task's options as the verdict gets them."""

from __future__ import annotations

import json

import pytest

from train.cluster import ClusterError, GroupResult, Host, HostResult
from train.plan import measurements, predict
from train.recipe.params import transformer_params


def hosts(expected=1000):
    v = {"network_expected_mbps": expected}
    return [Host("v100a", "10.0.0.1", vars=v), Host("v100b", "10.0.0.2", vars=v)]


def test_a_100mbit_cap_on_a_1gbit_cluster_is_network_bound():
    params = transformer_params(1000, 256, 1024, 2, 2)  # the lab's "10x tiny" model
    v = predict.assess(hosts(), params, link_mbps=95.0, link_source="iperf3", compute_s=0.6, compute_source="bench")
    assert v.network_bound and v.slow_link
    assert v.prediction.step_s == pytest.approx(0.6 + params * 4 / (95e6 / 8))
    assert v.at_expected is not None and not v.at_expected.network_bound
    assert any("NETWORK-BOUND" in line for line in v.lines)
    fast = predict.assess(hosts(), params, link_mbps=940.0, link_source="iperf3", compute_s=0.6,
                          compute_source="bench")
    assert not fast.network_bound


def test_without_a_compute_figure_a_capped_port_still_counts():
    v = predict.assess(hosts(), 300_000, link_mbps=95.0, link_source="iperf3", compute_s=None,
                       compute_source="unknown")
    assert v.network_bound and v.prediction is None and v.comm_only.comm_s > 0
    ok = predict.assess(hosts(), 300_000, link_mbps=950.0, link_source="iperf3", compute_s=None,
                        compute_source="unknown")
    assert not ok.network_bound
    assert json.loads(json.dumps(v.as_dict(), default=str))["network_bound"] is True


def test_a_small_all_reduce_rate_is_not_mistaken_for_a_capped_port():
    """From bench-net, a 1 MiB all_reduce gets 480 Mbit/s on a healthy 940 Mbit/s port (latency): the model
    uses 480, the capped-port check iperf3's 940."""
    v = predict.assess(hosts(), 300_000, link_mbps=480.0, port_mbps=940.0, link_source="bench-net",
                       compute_s=None, compute_source="unknown")
    assert not v.slow_link and not v.network_bound
    assert v.comm_only.comm_s == pytest.approx(1.2e6 / (480e6 / 8))


def test_predict_from_bench_net_takes_the_all_reduce_rate_at_the_gradients_size():
    """A 1.2 MB gradient gets what a 1 MiB all_reduce got, not the 256 MiB plateau or iperf3."""
    report = {"link_mbps": 95.0, "allreduce": {"results": [
        {"size": 2**20, "busbw": 0.0060}, {"size": 16 * 2**20, "busbw": 0.0110},
        {"size": 256 * 2**20, "busbw": 0.0118}]}}
    assert predict.allreduce_rate_at(report, 1.19e6) == (pytest.approx(48.0), 2**20)
    assert predict.allreduce_rate_at(report, 200e6) == (pytest.approx(94.4), 256 * 2**20)
    assert predict.allreduce_rate_at({"link_mbps": 95.0}, 1e6) is None  # no sweep: iperf3 stands in


def test_a_network_bound_sync_verdict_names_the_comm_that_reaches_90_percent():
    two = [Host("v100a", "10.0.0.1"), Host("v100b", "10.0.0.2")]
    params = transformer_params(32000, 512, 2048, 6, 6)
    v = predict.assess(two, params, link_mbps=100.0, link_source="given", compute_s=0.6, compute_source="given",
                       precision="fp16", overlap=0.6)
    assert v.network_bound and v.comm == "sync"
    assert v.choice and v.choice.comm == "powersgd:4" and v.choice.reached  # before local SGD on the ladder
    bare = predict.assess(two, int(params), link_mbps=100.0, link_source="given", compute_s=0.6,
                          compute_source="given", precision="fp16", overlap=0.6)  # no shapes: no PowerSGD
    assert bare.choice and bare.choice.comm.startswith("local-sgd:") and bare.choice.reached
    assert any(line.startswith(f"{v.choice.flag()} would reach 100%") for line in v.lines), v.lines
    assert any(line.startswith(f"{bare.choice.flag()} would reach 90%") for line in bare.lines), bare.lines
    auto = predict.assess(two, params, link_mbps=100.0, link_source="given", compute_s=0.6,
                          compute_source="given", precision="fp16", overlap=0.6, comm="auto")
    assert auto.comm == v.choice.comm and not auto.network_bound
    assert auto.prediction.efficiency >= 0.9


def test_auto_without_a_compute_figure_says_how_to_get_one():
    two = [Host("v100a", "10.0.0.1"), Host("v100b", "10.0.0.2")]
    with pytest.raises(ClusterError, match="fab bench-step --rates none"):
        predict.assess(two, 1_000_000, link_mbps=100.0, link_source="given", compute_s=None,
                       compute_source="unknown", comm="auto")


def test_the_compute_figure_comes_from_a_bench_step_of_the_same_model_on_as_many_hosts(tmp_path, monkeypatch):
    monkeypatch.setattr(measurements, "REPORT_DIR", tmp_path)
    assert predict.compute_from_bench(300_000, 2, 2, "tiny", [])[0] is None
    measurements.write({"preset": "tiny", "overrides": ["max_update=50"], "params": 300_000, "ranks": 2,
                        "n_hosts": 2, "compute_s": 0.21, "timestamp": "2026-11-22T08:00:00"}, "step")
    # how long the run is does not change its step; its model does; its batch scales C per token
    assert predict.compute_from_bench(300_000, 2, 2, "tiny", ["max_update=900"], 2048) == (
        0.21, "fab bench-step of 2026-11-22T08:00:00 at 2,048 tokens a batch x update-freq 1")
    assert predict.compute_from_bench(300_000, 2, 2, "tiny", ["max_tokens=4096"], 4096) == (
        pytest.approx(0.42), "scaled from 2,048 tokens a batch (fab bench-step of 2026-11-22T08:00:00: 0.210 s) "
                             "to 4,096, the same seconds per token")
    assert predict.compute_from_bench(300_000, 2, 2, "tiny", ["encoder_layers=3"], 2048)[0] is None
    assert predict.compute_from_bench(300_000, 3, 3, "tiny", [], 2048)[0] is None


def test_the_overlap_is_the_newest_bench_steps_fit_for_the_backend_on_these_hosts(tmp_path, monkeypatch):
    monkeypatch.setattr(measurements, "REPORT_DIR", tmp_path)
    assert predict.overlap_for("legacy_ddp", hosts())[0] == 0.0
    assert predict.overlap_for("pytorch_ddp", hosts()) == (
        0.0, "pytorch_ddp: not measured on these hosts, 0 assumed (`fab bench-step --set ddp_backend=pytorch_ddp`)")
    measurements.write({"ddp_backend": "pytorch_ddp", "hosts": ["v100b", "v100a"], "overlap": 0.42,
                        "timestamp": "T"}, "step")
    assert predict.overlap_for("pytorch_ddp", hosts()) == (0.42, "pytorch_ddp, fitted by fab bench-step of T")


def test_the_dictionary_size_is_read_from_the_first_host(monkeypatch):
    def run_all(hosts, command):
        name = hosts[0].name
        if name == "v100a":
            return GroupResult({name: HostResult(name, stdout="996\n", exited=0)})
        return GroupResult({name: HostResult(name, stderr="No such file or directory", exited=1)})

    monkeypatch.setattr(predict, "run_all", run_all)
    a, b = hosts()
    assert predict.dataset_vocab(a, "synthetic") == 1000  # + fairseq's 4 special symbols
    with pytest.raises(ClusterError, match=r"v100b: no dictionary at /data/tandem/datasets/wmt16/dict.en.txt: "
                                           r"run `fab prepare-data`"):
        predict.dataset_vocab(b, "wmt16")


def test_fab_predict_takes_fab_trains_precision_and_splits_set_between_overrides(monkeypatch):
    asked = {}

    def predict_for(hosts, preset, overrides, dataset, link_source, **kwargs):
        asked.update(preset=preset, overrides=overrides, link=link_source, **kwargs)
        return "the verdict"

    def run_all(hosts, command, **_):  # a fake nvidia-smi: two 80 GB H100s a host
        assert command.startswith("nvidia-smi --query-gpu=memory.total")
        return GroupResult({h.name: HostResult(h.name, stdout="81559\n81559\n", exited=0) for h in hosts})

    monkeypatch.setattr(predict, "predict_for", predict_for)
    monkeypatch.setattr(predict, "run_all", run_all)
    gpus = [Host("a", "10.0.0.1", gpus=2), Host("b", "10.0.0.2", gpus=2)]
    assert predict.for_options(gpus, set_text="adam_betas=(0.9, 0.98),lr=0.001", link_source=100,
                               compute_s="1.8", update_freq="2", max_update="300000") == "the verdict"
    assert asked["overrides"] == ["adam_betas=(0.9, 0.98)", "lr=0.001"] and asked["link"] == "100"
    assert asked["precision"] == "fp16"  # GPU hosts: as fab train, not fp32
    assert (asked["compute_s"], asked["batch"].update_freq, asked["max_update"]) == (1.8, 2, 300000)
    assert asked["overlap"] is None and asked["comm"] == "sync"
    predict.for_options(hosts(), precision="bf16")
    assert asked["precision"] == "bf16" and asked["overrides"] == []
    predict.for_options(hosts())
    assert asked["precision"] == "fp32"  # CPU hosts
