"""The benchmarks' pure parts: table formatting, busbw and efficiency, iperf3/tc parsing, JSON, verdicts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import link, model, net, predict, step
from train.agent import allreduce
from train.cluster import ClusterError, Host
from train.report.logparse import logged_params, parse_log


def row(size: int, time_ms: float, ranks: int = 2) -> dict:
    algbw = size / (time_ms / 1e3) / 1e9
    return {"size": size, "count": size // 4, "type": "float", "time_ms": time_ms, "algbw": algbw,
            "busbw": algbw * allreduce.bus_factor(ranks), "correct": True}


def test_busbw_is_algbw_times_2_n_minus_1_over_n():
    assert allreduce.bus_factor(2) == 1.0
    assert allreduce.bus_factor(4) == 1.5
    assert allreduce.bus_factor(8) == pytest.approx(1.75)


def test_sweep_sizes_are_powers_of_two_between_the_bounds():
    sizes = allreduce.sizes_between(allreduce.parse_size("1M"), allreduce.parse_size("1G"))
    assert sizes[0] == 2**20 and sizes[-1] == 2**30 and len(sizes) == 11
    assert allreduce.sizes_between(3 * 2**20, 2**23) == [2**21, 2**22, 2**23]
    with pytest.raises(ValueError):
        allreduce.sizes_between(2**20, 2**10)


def test_slow_sizes_get_fewer_iterations_and_no_warmup():
    assert allreduce.plan(5, 1, None, 20) == (5, 1)  # the first size: nothing to estimate from
    assert allreduce.plan(5, 1, 0.1, 20) == (5, 1)
    assert allreduce.plan(5, 1, 8.0, 20) == (2, 0)
    assert allreduce.plan(5, 1, 80.0, 20) == (1, 0)  # 1 GB at 100 Mb/s: one iteration
    assert allreduce.plan(5, 1, 80.0, None) == (5, 1)  # no budget: as asked (the verify role)


def test_efficiency_is_busbw_over_the_measured_link():
    # 256 MiB in 2.25 s on 2 ranks = 119 MB/s busbw; iperf3 measured 957 Mbit/s = 119.6 MB/s
    rows = net.with_efficiency([row(2**28, 2250.0)], link_mbps=957.0)
    assert rows[0]["efficiency"] == pytest.approx(2**28 / 2.25 * 8 / 957e6)
    assert net.with_efficiency([row(2**28, 2250.0)], None)[0]["efficiency"] is None


def test_table_has_nccl_tests_columns_with_units():
    text = net.table(net.with_efficiency([row(2**20, 10.0), row(2**28, 2250.0)], 957.0))
    header, first, second = text.splitlines()
    assert header.split() == ["size(B)", "count", "type", "time(ms)", "algbw(GB/s)", "busbw(GB/s)", "busbw/link"]
    assert first.split()[0] == "1048576" and first.split()[3] == "10.00"
    assert second.split()[-1] == "100%"


def test_threshold_checks_256MB_and_above():
    rows = net.with_efficiency([row(2**20, 100.0), row(2**28, 2250.0), row(2**29, 6000.0)], 957.0)
    ok, reasons = net.verdict(rows, 0.85)
    assert not ok and len(reasons) == 1 and reasons[0].startswith("536870912 B")  # 1 MB is not held against it
    assert net.verdict(rows[:2], 0.85) == (True, [])
    assert net.verdict(rows, None) == (True, [])
    small = net.with_efficiency([row(2**20, 100.0)], 957.0)  # a sweep cut below 256 MB: its largest size
    assert not net.verdict(small, 0.85)[0]


def test_rates_and_tc_commands():
    assert link.rate_bits("100mbit") == 100_000_000
    assert link.rate_bits("1gbit") == 10**9
    assert link.rate_bits("none") is None
    assert link.tbf_burst(10**9) == 625_000 and link.tbf_burst(10**7) == 16_384  # 5 ms, never below 16 kB
    with pytest.raises(ValueError):
        link.rate_bits("fast")
    assert link.cap_command("eth0", "100mbit") == (
        "tc qdisc replace dev eth0 root tbf rate 100000000bit burst 62500b latency 50ms")
    assert link.cap_command("eth0", "none").startswith("tc qdisc del dev eth0 root")
    assert link.parse_caps("qdisc tbf 8001: root refcnt 2 rate 100Mbit burst 64Kb lat 50ms") == "100Mbit"
    assert link.parse_caps("qdisc noqueue 0: root refcnt 2") is None
    assert step.parse_rates("10mbit, none") == ["10mbit", "none"]


def test_report_json_is_written_twice_and_read_back(tmp_path, monkeypatch):
    monkeypatch.setattr(net, "REPORT_DIR", tmp_path)
    path = net.write({"benchmark": "bench-net", "link_mbps": 95.6}, "net")
    assert json.loads(path.read_text())["link_mbps"] == 95.6
    assert net.latest("net") == {"benchmark": "bench-net", "link_mbps": 95.6}
    assert net.latest("step") is None


LOG = """\
2026-11-22 08:00:00 | INFO | fairseq_cli.train | num. shared model params: 298,560 (num. trained: 298,560)
2026-11-22 08:00:01 | INFO | fairseq_cli.train | training on 2 devices (GPUs/TPUs)
""" + "".join(
    f'2026-11-22 08:00:{i + 2:02d} | INFO | train_inner | {{"epoch": 1, "loss": "9.0", "wps": "{w}", '
    f'"ups": "1", "wpb": "2000", "num_updates": "{i + 1}", "wall": "{i}"}}\n'
    for i, w in enumerate([500, 1000, 1500, 4000, 5000, 4000, 4000, 2000])
)


def test_each_rate_takes_the_median_of_its_segments_updates():
    updates = step.per_update(parse_log(LOG.splitlines()).records)
    assert updates[1]["s"] == pytest.approx(4.0)  # 2000 words / 500 wps
    segments = [{"rate": "10mbit", "first": 1, "last": 3, "tx": {"a": 3_000_000, "b": 3_200_000}},
                {"rate": "none", "first": 4, "last": 6, "tx": {"a": 3_000_000, "b": 3_000_000}},
                {"rate": "10mbit", "first": 7, "last": 8, "tx": {"a": 2_000_000, "b": 2_000_000}}]
    ten, none = step.summarize(["10mbit", "none", "10mbit"], segments, updates, {"10mbit": 9.6, "none": 9000.0})
    assert ten["segments"] == 2 and ten["updates_measured"] == 5
    assert ten["s_per_update"] == pytest.approx(4 / 3)  # of 4, 2, 1.33, 0.5, 1.0
    assert ten["cycle_s"] == pytest.approx([2.0, 0.75])  # each repeat alone: of 4, 2, 1.33 and of 0.5, 1.0
    assert ten["tx_per_update"] == pytest.approx((5_000_000 + 5_200_000) / 2 / 5)
    assert none["s_per_update"] == pytest.approx(0.5) and none["link_mbps"] == 9000.0
    assert logged_params(LOG) == 298560


def points() -> list[dict]:
    return [{"rate": "100mbit", "link_mbps": 95.0, "s_per_update": 0.30, "wps": 6000, "tx_per_update": 1.3e6},
            {"rate": "none", "link_mbps": 10000.0, "s_per_update": 0.20, "wps": 9000, "tx_per_update": 1.3e6}]


def test_predictions_use_the_uncapped_run_as_compute_only():
    pts = points()
    c, source, _ = step.with_predictions(pts, params=300_000, ranks=2, hosts=2)
    assert c == pytest.approx(0.20 - 1.2e6 / 1.25e9) and source == "none"
    assert pts[1]["predicted_s"] == pytest.approx(0.20)
    assert pts[0]["predicted_s"] == pytest.approx(c + 1.2e6 / (95e6 / 8))
    assert pts[0]["model_tx_bytes"] == 1.2e6
    text = step.table(pts)
    assert text.splitlines()[0].split()[:5] == ["rate", "link(Mbit/s)", "allreduce(Mbit/s)", "s/update", "predicted"]
    capped, uncapped = text.splitlines()[1].split(), text.splitlines()[2].split()
    assert capped[5] == f"{pts[0]['error']:+.0%}" and uncapped[5] == "(C)"  # C's own rate: no error to show


def test_the_gradients_own_all_reduce_rate_wins_over_iperf3():
    pts = points()
    pts[0]["allreduce_mbps"] = 50.0  # short transfers through the cap: half of iperf3's steady state
    c, _, _ = step.with_predictions(pts, params=300_000, ranks=2, hosts=2)
    assert pts[0]["predicted_s"] == pytest.approx(c + 1.2e6 / (50e6 / 8))


def test_plot_is_a_png(tmp_path):
    pts = points()
    c, _, _ = step.with_predictions(pts, params=300_000, ranks=2, hosts=2)
    report = {"points": pts, "params": 300_000, "ranks": 2, "n_hosts": 2, "compute_s": c, "preset": "tiny"}
    step.plot(report, tmp_path / "step.png")
    assert (tmp_path / "step.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def hosts(expected=1000):
    v = {"network_expected_mbps": expected}
    return [Host("v100a", "10.0.0.1", vars=v), Host("v100b", "10.0.0.2", vars=v)]


def test_a_100mbit_cap_on_a_1gbit_cluster_is_network_bound():
    params = model.transformer_params(1000, 256, 1024, 2, 2)  # the lab's "10x tiny" model
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


@pytest.mark.parametrize("module", ["net", "step", "predict"])
def test_each_benchmark_runs_as_a_plain_module_and_names_a_wrong_host(module):
    top = Path(__file__).resolve().parents[3]
    proc = subprocess.run([sys.executable, "-m", f"benchmarks.{module}", "--inventory", "inventory/hosts.yml",
                           "--hosts", "v100a,v100c"], cwd=top, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "unknown host v100c: the inventory has v100a, v100b" in proc.stderr


def test_bench_step_refuses_half_precision_on_cpu_hosts_before_touching_them():
    cpu = [Host("v100a", "10.0.0.1"), Host("v100b", "10.0.0.2")]  # unreachable: nothing may be tried
    with pytest.raises(ClusterError, match="bf16 needs GPUs; v100a, v100b have none"):
        step.bench_step(cpu, ["none"], precision="bf16")


def test_predict_from_bench_net_takes_the_all_reduce_rate_at_the_gradients_size():
    """A 1.2 MB gradient gets what a 1 MiB all_reduce got, not the 256 MiB plateau or iperf3."""
    report = {"link_mbps": 95.0, "allreduce": {"results": [
        {"size": 2**20, "busbw": 0.0060}, {"size": 16 * 2**20, "busbw": 0.0110},
        {"size": 256 * 2**20, "busbw": 0.0118}]}}
    assert predict.allreduce_rate_at(report, 1.19e6) == (pytest.approx(48.0), 2**20)
    assert predict.allreduce_rate_at(report, 200e6) == (pytest.approx(94.4), 256 * 2**20)
    assert predict.allreduce_rate_at({"link_mbps": 95.0}, 1e6) is None  # no sweep: iperf3 stands in


def overlapped_points(c: float, overlap: float, mbit_rates: list[float], params: int = 4_000_000) -> list[dict]:
    """Step times a DDP that hides `overlap` × C of the all-reduce would show (2 hosts, fp32)."""
    out = []
    for mbit in mbit_rates:
        comm = model.allreduce_bytes_per_rank(model.gradient_bytes(params), 2) / model.mbit_to_bytes_per_s(mbit)
        out.append({"rate": f"{mbit:g}mbit" if mbit < 10_000 else "none", "link_mbps": mbit,
                    "s_per_update": c + max(0.0, comm - overlap * c)})
    return out


def test_pytorch_ddp_overlap_is_fitted_and_each_rate_predicted_from_the_others():
    pts = overlapped_points(0.8, 0.4, [100, 300, 1000, 20_000])
    c, source, overlap = step.with_predictions(pts, params=4_000_000, ranks=2, hosts=2, backend="pytorch_ddp")
    assert source == "none" and overlap == pytest.approx(0.4, abs=0.01) and c == pytest.approx(0.8, rel=0.01)
    for p in pts:
        assert p["error"] == pytest.approx(0, abs=0.02), p
        if p["rate"] != "none":
            assert p["overlap_used"] == pytest.approx(0.4, abs=0.01)  # fitted without this rate


def test_legacy_ddp_keeps_overlap_zero_even_when_a_fit_would_flatter_it():
    pts = overlapped_points(0.8, 0.4, [100, 1000, 20_000])
    _, _, overlap = step.with_predictions(pts, params=4_000_000, ranks=2, hosts=2, backend="legacy_ddp")
    assert overlap == 0.0 and all(p["overlap_used"] == 0.0 for p in pts)
    assert pts[0]["error"] > 0.05  # the same steps read as legacy_ddp: the model (rightly) over-predicts


def test_fit_overlap_prefers_the_smaller_overlap_on_a_tie():
    # every capped point fully hidden or fully exposed the same way: any overlap >= 0.5 fits; 0.5 is kept
    assert model.fit_overlap((0.0, 1.0), [(0.5, 1.0)]) == 0.5
    assert model.fit_overlap((0.0, 1.0), []) == 0.0


def test_the_run_uses_its_presets_ddp_backend_else_tandems_default():
    assert model.ddp_backend({}, cpu=True) == "legacy_ddp"
    assert model.ddp_backend({}, cpu=False) == "pytorch_ddp"
    assert model.ddp_backend({"ddp_backend": "pytorch_ddp"}, cpu=True) == "pytorch_ddp"


def test_one_capped_rate_alone_is_marked_as_fitted_not_checked():
    pts = overlapped_points(0.8, 0.4, [100, 20_000])
    step.with_predictions(pts, params=4_000_000, ranks=2, hosts=2, backend="pytorch_ddp")
    assert pts[0]["fitted_on_itself"] and step.table(pts).splitlines()[1].split()[5] == "(fit)"
