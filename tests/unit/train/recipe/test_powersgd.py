"""--comm powersgd:R: parsed once, priced from the model's tensors, run through pytorch_ddp with its
host-side hook asked for in the environment, tried by --comm auto after update-freq."""

from __future__ import annotations

import shlex

import pytest

from train.plan import model, predict
from train.recipe import strategies
from train.recipe.params import ParamCount, preset_params, transformer_params
from train.recipe.presets import resolve
from train.recipe.strategies import CommError
from train.run.command import foreground_command, launches, training_command

BASE = transformer_params(32000, 512, 2048, 6, 6)  # Transformer base, shared 32k vocabulary


def _argv(comm: str, preset=None, gpus: int = 0) -> list[str]:
    hosts = [{"address": f"10.0.0.{11 + i}", "gpus": gpus, "nic": "eth1"} for i in range(2)]
    launch = launches("r1", hosts, master_port=29500, data_dir="/d", run_dir="/r", venv="/v", comm=comm,
                      precision="fp16" if gpus else "fp32")[0]
    return shlex.split(training_command(preset or resolve("tiny"), launch))


def test_it_parses_once_and_prints_back():
    assert str(strategies.parse("powersgd")) == "powersgd:4"
    assert strategies.parse("PowerSGD:8").rank == 8
    assert "powersgd[:R]" in strategies.syntax()
    for bad in ("powersgd:0", "powersgd:x"):
        with pytest.raises(CommError, match="--comm powersgd"):
            strategies.parse(bad)


def test_a_matrix_sends_r_times_rows_plus_cols_and_a_vector_goes_dense():
    count = ParamCount([(1000, 64), (64,), (64, 64), (3, 5)])
    # 1000x64: 4 x 1064 = 4,256; the bias 64 dense; 64x64: 4 x 128 = 512 (< 4,096 / 2);
    # 3x5: rank min(3, 5, 4) = 3 -> 24, not 2x smaller than 15: dense
    assert strategies.parse("powersgd:4").elements(count) == 4256 + 64 + 512 + 15
    assert strategies.parse("powersgd:4").payload_bytes(count, "fp32") == 4 * (4256 + 64 + 512 + 15)
    assert strategies.parse("powersgd:4").payload_bytes(count, "fp16") == 2 * (4256 + 64 + 512 + 15)


def test_transformer_base_at_rank_4_sends_a_few_hundredths_of_syncs_bytes():
    """By hand: the shared embedding 32000x512 -> 4 x 32512; per encoder layer 4 attention matrices
    4 x 1024 each, fc1 and fc2 4 x 2560 each; vectors dense: 4 x 512 biases + 2048 + 512 + 2 x 2 x 512
    an encoder layer; a decoder layer has twice the attention and three LayerNorms."""
    encoder = 4 * 4 * 1024 + 2 * 4 * 2560 + 4 * 512 + 2048 + 512 + 4 * 512
    decoder = 8 * 4 * 1024 + 2 * 4 * 2560 + 8 * 512 + 2048 + 512 + 6 * 512
    assert strategies.parse("powersgd:4").elements(BASE) == 4 * 32512 + 6 * encoder + 6 * decoder
    sync = strategies.parse("sync").payload_bytes(BASE, "fp16")
    assert strategies.parse("powersgd:4").payload_bytes(BASE, "fp16") < sync / 50


def test_a_bare_count_cannot_price_it_and_auto_then_skips_it():
    with pytest.raises(CommError, match="tensors"):
        strategies.parse("powersgd:4").elements(60_000_000)
    assert not any(str(r).startswith("powersgd") for r in strategies.ladder("fp16", 60_000_000))
    assert [str(r) for r in strategies.ladder("fp16", BASE)] == ["sync", "update-freq", "powersgd:4", "local-sgd:2"]


def test_the_model_prices_its_bytes_overlapped_and_its_synchronous_start():
    link = model.mbit_to_bytes_per_s(100)
    sync = model.predict(BASE, 2, link, 0.6, precision="fp16")
    power = model.predict(BASE, 2, link, 0.6, precision="fp16", comm="powersgd:4", overlap=0.5,
                          sync_updates={"powersgd": 4000}, max_update=300_000)
    ratio = strategies.parse("powersgd:4").elements(BASE) / BASE
    assert power.comm_s == pytest.approx(sync.comm_s * ratio)
    assert power.hidden_s == pytest.approx(power.comm_s)  # DDP's buckets hide it behind the backward pass
    assert power.sync_updates == 4000 and power.sync_step_s == pytest.approx(0.6 + sync.comm_s - 0.3)


def test_auto_takes_it_where_update_freq_is_not_enough_and_before_local_sgd():
    """The field report's case (Transformer base, 2 hosts x 1 GPU, 100 Mb/s, fp16): local SGD before
    PowerSGD was registered; PowerSGD's rank-4 factors now reach 90% with the gradients still averaged
    every update."""
    two = [predict.Host("v100a", "10.0.0.1"), predict.Host("v100b", "10.0.0.2")]
    v = predict.assess(two, BASE, link_mbps=100.0, link_source="given", compute_s=0.6, compute_source="given",
                       precision="fp16", overlap=0.6, comm="auto")
    assert v.comm == "powersgd:4" and v.prediction.efficiency >= 0.9
    assert [p.comm for p in v.choice.tried] == ["sync", "sync", "sync", "powersgd:4"]
    rows = {o.kind: o for o in v.comparison.options if len(o.hosts) == 2}
    assert rows["powersgd"].caveat == strategies.get("powersgd").caveat and "local-sgd" in rows


def test_the_command_runs_it_through_pytorch_ddp_with_its_hook_asked_for():
    argv = _argv("powersgd:4")
    assert argv[argv.index("--ddp-backend") + 1] == "pytorch_ddp"  # a CPU host's default is legacy_ddp
    assert "TANDEM_POWERSGD=4:100" in argv  # tiny's warmup_updates: its synchronous start
    assert "--ddp-comm-hook" not in argv and not any("powersgd" in a for a in argv if a.startswith("--"))
    later = _argv("powersgd:2", preset=resolve("tiny", ["powersgd_start_updates=7"]))
    assert "TANDEM_POWERSGD=2:7" in later and not any("start_updates" in a for a in later if a.startswith("--"))
    assert "TANDEM_POWERSGD=2:2" in _argv("powersgd:2", preset=resolve("tiny", ["powersgd_start_updates=0"]))
    assert not any(a.startswith("TANDEM_POWERSGD") for a in _argv("sync", preset=resolve(
        "tiny", ["powersgd_start_updates=7"])))
    with pytest.raises(ValueError, match="ddp_backend=legacy_ddp"):
        _argv("powersgd:4", preset=resolve("tiny", ["ddp_backend=legacy_ddp"]))


def test_fairseq_parses_its_command():
    pytest.importorskip("fairseq")
    from fairseq import options

    hosts = [{"address": f"10.0.0.{11 + i}", "gpus": 0, "nic": "eth1"} for i in range(2)]
    launch = launches("r1", hosts, master_port=29500, data_dir="/d", run_dir="/r", venv="/v", comm="powersgd:4")[0]
    argv = foreground_command(resolve("tiny"), launch)
    args = options.parse_args_and_arch(options.get_training_parser(),
                                       argv[argv.index("train.agent.trainer.fairseq_train") + 1:])
    assert args.ddp_backend == "pytorch_ddp" and args.ddp_comm_hook == "none"


def test_it_states_the_memory_its_error_feedback_keeps():
    assert strategies.parse("powersgd:4").extra_bytes_per_param({}) == 4
    lines = predict.slow_link_lines(int(BASE), 2, 100, dict(resolve("transformer_wmt_en_de").options), "powersgd:4")
    assert "powersgd:4 needs 0.24 GB more memory per GPU than sync" in lines[-1]


THIRTEEN_TIMES_TINY = ["encoder_embed_dim=256", "decoder_embed_dim=256", "encoder_ffn_embed_dim=1024",
                       "decoder_ffn_embed_dim=1024"]


@pytest.mark.parametrize("overrides, measured", [
    # fab bench-step --rates 10mbit,100mbit,none --comm powersgd:4 on the lab, 2026-11-26 (benchmarks/README.md,
    # "PowerSGD"): per rate the iperf3 and all_reduce Mbit/s under the cap, s/update, NIC bytes sent per update
    ([], {"10mbit": (8.5, 10.54, 0.330, 129_820), "100mbit": (95.1, 137.1, 0.251, 138_620),
          "none": (9093.0, 246.6, 0.239, 128_859)}),
    (THIRTEEN_TIMES_TINY, {"10mbit": (9.4, 7.54, 1.140, 480_406), "100mbit": (95.0, 101.5, 0.800, 453_303),
                           "none": (13202.6, 721.8, 0.787, 448_407)}),
])
def test_bench_step_on_the_lab_is_predicted_within_15_percent(overrides, measured):
    """The byte model is what the hosts' NICs sent (R x (rows + cols) a matrix, vectors dense: within 15%,
    TCP/IP headers and tbf's resent drops above it), and bench-step's prediction from it (pytorch_ddp,
    overlap fitted to the other capped rate) is the measured step within +-15% at both capped rates."""
    from benchmarks import step

    params = preset_params(resolve("tiny", overrides).options, 1008)  # the synthetic corpus' dictionary
    points = [{"rate": rate, "link_mbps": link, "allreduce_mbps": allreduce, "s_per_update": s}
              for rate, (link, allreduce, s, _) in measured.items()]
    step.with_predictions(points, params, ranks=2, hosts=2, backend="pytorch_ddp", comm="powersgd:4")
    for p in points:
        sent = measured[p["rate"]][3]
        assert 1.0 <= sent / p["model_tx_bytes"] < 1.15, p["rate"]
        assert abs(p["error"]) <= 0.15, (p["rate"], p["predicted_s"], p["s_per_update"])
    # a tenth of sync's bytes for tiny, a thirty-fifth for the 13x model: the cap costs it little
    assert points[0]["model_tx_bytes"] < strategies.parse("sync").payload_bytes(params, "fp32") / 9
