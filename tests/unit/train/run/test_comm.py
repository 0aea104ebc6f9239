"""--comm: each strategy becomes the fairseq options that do it, and auto picks from the model."""

from __future__ import annotations

import re
import shlex

import pytest

from train.plan import model
from train.recipe import strategies
from train.recipe.params import transformer_params
from train.recipe.presets import resolve
from train.recipe.strategies import CommError
from train.run.command import launches, training_command

TINY = resolve("tiny")
BASE_PARAMS = transformer_params(32000, 512, 2048, 6, 6)  # Transformer base, shared 32k vocabulary


def _argv(comm: str, gpus: int = 0, preset=TINY, n: int = 2) -> list[str]:
    hosts = [{"address": f"10.0.0.{11 + i}", "gpus": gpus, "nic": "eth1"} for i in range(n)]
    launch = launches("r1", hosts, master_port=29500, data_dir="/d", run_dir="/r", venv="/v", comm=comm,
                      precision="fp16" if gpus else "fp32")[0]
    return shlex.split(training_command(preset, launch))


def _value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_strategies_parse_and_print_back():
    assert str(strategies.parse(None)) == "sync"
    assert str(strategies.parse("local-sgd")) == "local-sgd:16"
    assert strategies.parse("LOCAL-SGD:32").period == 32
    for bad in ("gossip", "local-sgd:1", "local-sgd:x", "fp16:4"):
        with pytest.raises(CommError, match="--comm"):
            strategies.parse(bad)


def test_sync_keeps_the_cpu_default_and_fp16_compresses_through_pytorch_ddp():
    assert _value(_argv("sync"), "--ddp-backend") == "legacy_ddp"
    fp16 = _argv("fp16")
    assert _value(fp16, "--ddp-backend") == "pytorch_ddp" and _value(fp16, "--ddp-comm-hook") == "fp16"


def test_fp16_compression_against_a_preset_that_pins_another_backend_is_refused():
    pinned = resolve("tiny", ["ddp_backend=legacy_ddp"])
    with pytest.raises(ValueError, match="ddp_backend=legacy_ddp"):
        _argv("fp16", preset=pinned)


def test_local_sgd_is_fairseqs_bmuf_averaging_every_h_updates():
    argv = _argv("local-sgd:24", n=4)
    assert "--use-bmuf" in argv
    assert _value(argv, "--global-sync-iter") == "24"
    assert _value(argv, "--block-momentum") == "0"  # a plain average: the outer momentum is opt-in
    assert _value(argv, "--warmup-iterations") == "0"
    with_momentum = _argv("local-sgd:24", preset=resolve("tiny", ["block_momentum=0.5"]))
    assert _value(with_momentum, "--block-momentum") == "0.5" and "--use-nbm" in with_momentum


def test_local_sgd_sends_an_hth_of_the_bytes_and_nothing_hides_them():
    link = model.mbit_to_bytes_per_s(100)
    sync = model.predict(BASE_PARAMS, 2, link, 0.6)
    local = model.predict(BASE_PARAMS, 2, link, 0.6, comm="local-sgd:20", overlap=0.5)
    assert local.comm_s == pytest.approx(sync.comm_s / 20)
    assert local.hidden_s == 0
    fp16 = model.predict(BASE_PARAMS, 2, link, 0.6, comm="fp16")
    assert fp16.comm_s == pytest.approx(sync.comm_s / 2)


def test_auto_takes_the_least_invasive_strategy_that_reaches_90_percent():
    link = model.mbit_to_bytes_per_s(10_000)  # a fast link: sync is enough
    assert model.choose(BASE_PARAMS, 2, link, 0.6, overlaps={"sync": 0.5}).comm == "sync"
    # the field report's case: Transformer base, 2 hosts × 1 GPU, 100 Mb/s, fp16 training
    slow = model.choose(BASE_PARAMS, 2, model.mbit_to_bytes_per_s(100), 0.6, overlaps={"sync": 0.6, "fp16": 0.6},
                        precision="fp16")
    assert slow.reached and slow.comm.startswith("local-sgd:")
    h = int(slow.comm.split(":")[1])
    assert slow.prediction.efficiency >= 0.9
    below = model.predict(BASE_PARAMS, 2, model.mbit_to_bytes_per_s(100), 0.6, comm=f"local-sgd:{h - 1}")
    assert below.efficiency < 0.9, "H is the smallest that reaches 90%"
    assert [p.comm for p in slow.tried][:1] == ["sync"]


def test_auto_uses_update_freq_before_local_sgd_when_a_small_k_is_enough():
    # the all-reduce is a little over a tenth of the compute: --update-freq 2 reaches 90%
    link = model.mbit_to_bytes_per_s(100)
    sync = model.predict(BASE_PARAMS, 2, link, 1.0, precision="fp16")
    compute = sync.comm_s * 9 / 1.8
    choice = model.choose(BASE_PARAMS, 2, link, compute, overlaps={}, precision="fp16")
    assert (choice.comm, choice.update_freq) == ("sync", 2)
    assert choice.flag() == "--comm sync --update-freq 2"


def test_the_outer_steps_options_reach_local_sgd_only():
    """fairseq knows --block-momentum only under --use-bmuf: a sync run given it would not start."""
    tuned = resolve("tiny", ["block_momentum=0"])
    assert _value(_argv("local-sgd:8", preset=tuned), "--block-momentum") in ("0", "0.0")
    assert _argv("local-sgd:8", preset=tuned).count("--block-momentum") == 1
    assert "--block-momentum" not in _argv("sync", preset=tuned)


def test_local_sgd_starts_synchronous_until_the_learning_rates_warmup_ends():
    """The ranks average gradients every update for the preset's warmup_updates (tiny: 100), then
    local SGD; `local_sgd_sync_updates` sets another count (0: none) and never reaches fairseq."""
    assert "TANDEM_LOCAL_SGD_SYNC_UPDATES=100" in _argv("local-sgd:16")
    assert not any(a.startswith("TANDEM_LOCAL_SGD_SYNC_UPDATES=") for a in _argv("sync") + _argv("fp16"))
    later = _argv("local-sgd:16", preset=resolve("tiny", ["local_sgd_sync_updates=250"]))
    assert "TANDEM_LOCAL_SGD_SYNC_UPDATES=250" in later and not any("sync_updates" in a.lower() for a in later
                                                                     if a.startswith("--"))
    none = _argv("local-sgd:16", preset=resolve("tiny", ["local_sgd_sync_updates=0"]))
    assert not any(a.startswith("TANDEM_LOCAL_SGD_SYNC_UPDATES=") for a in none)
    assert not any("sync_updates" in a or "sync-updates" in a for a in _argv("sync", preset=resolve(
        "tiny", ["local_sgd_sync_updates=250"])))
    with pytest.raises(CommError, match="local_sgd_sync_updates"):
        _argv("local-sgd:16", preset=resolve("tiny", ["local_sgd_sync_updates=-3"]))


def test_local_sgd_states_the_gpu_memory_it_needs_beyond_sync():
    """BMUF kept three more fp32 copies of the model (+ the flat sync buffer): ~3.4 GB on a GPU for
    Transformer big. A plain average (tandem's default) keeps only the flat buffer."""
    from train.plan.predict import slow_link_lines
    from train.recipe import presets

    big = presets.resolve("transformer_vaswani_wmt_en_de_big").options
    params = 209e6
    local = strategies.parse("local-sgd:16")
    assert local.extra_bytes_per_param(big) * params / 1e9 < 1
    assert local.extra_bytes_per_param({**big, "block_momentum": 0.5}) * params / 1e9 > 3.3
    assert strategies.parse("sync").extra_bytes_per_param(big) == 0
    lines = slow_link_lines(int(params), 16, 10, big, "local-sgd:16")
    assert "0.84 GB more memory per GPU" in lines[-1]
    assert re.search(r"collective timeout .*: \d{4} s for a 836 MB all-reduce over 16 ranks at 10 Mbit/s", lines[0])
