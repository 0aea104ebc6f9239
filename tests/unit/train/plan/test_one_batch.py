"""One batch decision: `fab predict` prices, `fab train` checks and `fab bench-step` measures the batch
`fab train` runs on the cluster's GPUs (train.plan.batching.decide), and a compute time measured at
another max_tokens is scaled per token, saying so (train.plan.measurements.compute_at)."""

from __future__ import annotations

import pytest

from train.cluster import GroupResult, Host, HostResult
from train.plan import batching, measurements, predict
from train.recipe.record import Run

BASE, BIG = "transformer_wmt_en_de", "transformer_vaswani_wmt_en_de_big"
H100_MIB, V100_MIB = 81559, 16160  # NVML's and nvidia-smi's memory.total of an H100 80GB HBM3 and a V100 16GB
VOCAB = 31_996  # the WMT16 joint dictionary, fairseq's 4 symbols included


def cluster(gpus: int, link_mbps: float) -> list[Host]:
    v = {"network_expected_mbps": link_mbps}
    return [Host(f"g{i}", f"10.0.0.{i + 1}", gpus=gpus, vars=v) for i in range(2)]


def fake_hosts(monkeypatch, mib: int) -> list[str]:
    """The hosts' answers: nvidia-smi's memory of each GPU, the dictionary's lines (a fake of the GPUs)."""
    asked = []

    def run_all(hosts, command, **_):
        asked.append(command)
        out = "\n".join([str(mib)] * hosts[0].gpus) if command.startswith("nvidia-smi") else f"{VOCAB - 4}\n"
        return GroupResult({h.name: HostResult(h.name, stdout=out, exited=0) for h in hosts})

    monkeypatch.setattr(predict, "run_all", run_all)
    return asked


def trains(hosts: list[Host], preset: str, mib: int) -> Run:
    """What `fab train` does before its network check: the batch for the probed GPUs (session.py)."""
    run = Run("r", [h.name for h in hosts], preset, [], "wmt16", precision="fp16")
    answers = {h.name: {"gpus": [{"name": "GPU", "memory_mib": mib}] * h.gpus} for h in hosts}
    batching.apply(run, hosts, batching.gpu_gib_of(answers, hosts))
    return run


# an old bench-step record (no batch in it: the preset's max_tokens at update-freq 1), as issue 36 found
# it: big's C of 0.074 s at 3,584 tokens on an H100 (benchmarks/README.md), base's 0.12 s at 4,096 on a V100
@pytest.mark.parametrize(("preset", "gpus", "mib", "link", "compute_s", "measured_tokens", "bound"), [
    (BIG, 8, H100_MIB, 25_000, 0.074, 3584, False),  # 2 hosts x 8 H100 at 25 Gb/s
    (BASE, 1, V100_MIB, 100, 0.12, 4096, True),  # 2 hosts x 1 V100 at 100 Mbit/s
])
def test_predict_and_trains_network_check_agree_on_the_same_cluster(tmp_path, monkeypatch, preset, gpus, mib, link,
                                                                     compute_s, measured_tokens, bound):
    monkeypatch.setattr(measurements, "REPORT_DIR", tmp_path)
    asked = fake_hosts(monkeypatch, mib)
    hosts = cluster(gpus, link)
    params = predict.model_params(hosts, preset, [], "wmt16")
    measurements.write({"preset": preset, "overrides": [], "params": params, "ranks": 2 * gpus, "n_hosts": 2,
                        "compute_s": compute_s, "timestamp": "T"}, "step")

    predicted = predict.for_options(hosts, preset=preset, dataset="wmt16", link_source=str(link))
    run = trains(hosts, preset, mib)
    checked = predict.for_run(run, hosts, link_source=str(link))

    assert any(c.startswith("nvidia-smi") for c in asked)  # fab predict asked the GPUs' memory
    same = (run.resolved_preset().options["max_tokens"], run.update_freq)
    assert (predicted.batch.max_tokens, predicted.batch.update_freq) == same
    assert (checked.batch.max_tokens, checked.batch.update_freq) == same
    assert predicted.batch.max_tokens != measured_tokens  # the GPU's batch, not the preset's
    assert checked.compute_s == pytest.approx(predicted.compute_s)
    assert checked.compute_s == pytest.approx(compute_s * same[0] / measured_tokens)  # per token
    assert f"scaled from {measured_tokens:,} tokens" in checked.compute_source
    assert checked.prediction.efficiency == pytest.approx(predicted.prediction.efficiency)
    assert checked.network_bound == predicted.network_bound == bound
    asked_flags = [v.fewer_hosts_faster.flags() if v.fewer_hosts_faster else None for v in (predicted, checked)]
    assert asked_flags[0] == asked_flags[1]
    assert predicted.lines[0] == f"batch: {predicted.batch.line()}"  # the batch priced is said first


def test_a_bench_step_at_the_runs_own_batch_is_taken_as_measured(tmp_path, monkeypatch):
    monkeypatch.setattr(measurements, "REPORT_DIR", tmp_path)
    fake_hosts(monkeypatch, H100_MIB)
    hosts = cluster(8, 25_000)
    run = trains(hosts, BIG, H100_MIB)
    max_tokens = run.resolved_preset().options["max_tokens"]
    measurements.write({"preset": BIG, "overrides": [], "params": predict.model_params(hosts, BIG, [], "wmt16"),
                        "ranks": 16, "n_hosts": 2, "compute_s": 0.3, "timestamp": "T", "max_tokens": max_tokens,
                        "update_freq": run.update_freq}, "step")
    checked = predict.for_run(run, hosts, link_source="25000")
    assert checked.compute_s == 0.3
    assert checked.compute_source == f"fab bench-step of T at {max_tokens:,} tokens a batch x update-freq " \
                                     f"{run.update_freq}"


def test_the_users_update_freq_in_predict_is_fab_trains(monkeypatch):
    fake_hosts(monkeypatch, V100_MIB)
    hosts = cluster(1, 100)
    run = Run("r", ["g0", "g1"], BASE, [], "wmt16", precision="fp16", update_freq=8, update_freq_given=True)
    batching.apply(run, hosts, {"g0": V100_MIB / 1024, "g1": V100_MIB / 1024})
    b = predict.batch_for(hosts, BASE, [], "wmt16", "fp16", update_freq=8)
    assert (b.max_tokens, b.update_freq) == (run.resolved_preset().options["max_tokens"], 8) == (2048, 8)


def test_cpu_hosts_and_presets_without_a_recipe_price_the_batch_they_run(monkeypatch):
    cpu = [Host(f"c{i}", f"10.0.0.{i + 1}") for i in range(2)]
    monkeypatch.setattr(predict, "run_all", lambda hosts, command: pytest.fail(f"asked a CPU host: {command}"))
    b = predict.batch_for(cpu, BASE, [], "wmt16", "fp32")
    assert (b.max_tokens, b.update_freq, b.tokens_per_update) == (4096, 4, 32768)  # the preset's max_tokens
    tiny = predict.batch_for(cpu, "tiny", [], "synthetic", "fp32")
    assert (tiny.max_tokens, tiny.update_freq, tiny.target) == (2048, 1, None)


def test_c_scales_per_token_and_an_old_record_counts_as_the_presets_batch():
    old = {"preset": BIG, "overrides": [], "compute_s": 0.074, "timestamp": "T"}
    assert measurements.batch_of(old) == (3584, 1)
    c = measurements.compute_at(old, 14_336)
    assert c.scaled and c.seconds == pytest.approx(0.296)
    assert c.source == "scaled from 3,584 tokens a batch (fab bench-step of T: 0.074 s) to 14,336, the same " \
                       "seconds per token"
    new = {**old, "max_tokens": 14_336, "update_freq": 2, "compute_s": 0.25}
    assert measurements.compute_at(new, 14_336) == measurements.Compute(
        0.25, "fab bench-step of T at 14,336 tokens a batch x update-freq 2", 14_336, False)
    assert measurements.compute_at({**old, "compute_s": None}, 3584) is None


def test_the_uncapped_step_at_another_batch_keeps_the_measured_communication():
    """Measured: 2 batches of 0.25 s and 0.1 s of exposed all-reduce = 0.6 s. At 4 batches of half the
    tokens the compute is the same 0.5 s: 0.6 s again; at 4 of the same tokens, 1.1 s."""
    report = {"preset": BIG, "compute_s": 0.25, "timestamp": "T", "max_tokens": 14_336, "update_freq": 2,
              "points": [{"rate": "100mbit", "s_per_update": 9.0}, {"rate": "none", "s_per_update": 0.6}]}
    assert measurements.uncapped_step_at(report, 14_336, 2) == (pytest.approx(0.6), "fab bench-step of T")
    assert measurements.uncapped_step_at(report, 7168, 4)[0] == pytest.approx(0.6)
    step, source = measurements.uncapped_step_at(report, 14_336, 4)
    assert step == pytest.approx(1.1) and source == "fab bench-step of T, scaled from 14,336 x 2 to 14,336 x " \
                                                    "update-freq 4"
    assert measurements.uncapped_step_at({**report, "points": []}, 14_336, 2) is None
