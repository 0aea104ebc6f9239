"""tandem's GPU step switches on the launcher's side (train/run/command.py FAST_STEP_SWITCHES): each
on GPU hosts as `--set NAME=true|false` says, else its default (measured ones on, the others off
until a GPU measures them), none on CPU hosts, and none ever reaches fairseq's arguments."""

from __future__ import annotations

import pytest

from train.recipe import presets
from train.run.command import Launch, environment, fairseq_train_args, switches_cpu_hosts_ignore

SWITCHES = {"fused_adam": ("TANDEM_FUSED_ADAM", True), "flat_master_copy": ("TANDEM_FLAT_MASTER_COPY", True),
            "fused_loss": ("TANDEM_FUSED_LOSS", False), "compile_layers": ("TANDEM_COMPILE_LAYERS", False)}
BIG = "transformer_vaswani_wmt_en_de_big"


def launch(gpus: int) -> Launch:
    return Launch("r", 0, 2, gpus, "10.0.0.1", 29500, "/data/bin", "/run/ckpt", "/run/train.log", "eth0",
                  "/opt/venv", precision="fp16" if gpus else "fp32")


@pytest.mark.parametrize("option", SWITCHES)
def test_each_switch_on_gpu_hosts_as_set_else_its_default_and_never_on_cpu_hosts(option):
    variable, default = SWITCHES[option]
    assert (variable in environment(launch(8), presets.resolve(BIG))) is default
    for value in (True, False):
        preset = presets.resolve(BIG, [f"{option}={str(value).lower()}"])
        assert (variable in environment(launch(8), preset)) is value
        assert option not in " ".join(fairseq_train_args(preset, launch(8))).replace("-", "_")
    assert variable not in environment(launch(0), presets.resolve("tiny", [f"{option}=true"]))


def test_cpu_hosts_say_they_train_without_a_switch_asked_for():
    asked = ["compile_layers=true", "fused_loss=true"]
    said = switches_cpu_hosts_ignore(asked, presets.resolve("tiny", asked).options, ["v100a", "v100b"])
    assert said == "fused_loss=true, compile_layers=true: GPU kernels; the CPU hosts v100a, v100b train without them"
    assert switches_cpu_hosts_ignore(["fused_loss=false"], presets.resolve("tiny", ["fused_loss=false"]).options,
                                     ["v100a"]) is None


def test_memory_efficient_fp16_is_fairseqs_own_switch():
    """`--set memory_efficient_fp16=true`: fairseq's optimizer without the fp32 master copy (1.9 GiB
    less for big on an H100, 1% slower: benchmarks/README.md)."""
    args = fairseq_train_args(presets.resolve(BIG, ["memory_efficient_fp16=true"]), launch(1))
    assert "--memory-efficient-fp16" in args and "--fp16" in args
    assert "--memory-efficient-fp16" not in fairseq_train_args(presets.resolve(BIG), launch(1))


@pytest.mark.parametrize("option", ["compile_layers", "fused_loss"])
def test_compiled_code_is_kept_on_the_data_volume_across_restarts(option):
    """torch.compile's default cache is under /tmp, gone after a VM's reboot: the first update then
    compiles again for minutes. The hosts keep it beside the runs, on the data volume."""
    from train.hosts import paths
    from train.run.command import training_command

    preset = presets.resolve(BIG, [f"{option}=true"])
    env = environment(launch(8), preset)
    assert env["TORCHINDUCTOR_CACHE_DIR"] == "/data/tandem/cache/inductor" == f"{paths.CACHE_ROOT}/inductor"
    assert env["TRITON_CACHE_DIR"] == "/data/tandem/cache/triton"
    assert "TORCHINDUCTOR_CACHE_DIR=/data/tandem/cache/inductor" in training_command(preset, launch(8))
    assert "TORCHINDUCTOR_CACHE_DIR" not in environment(launch(8), presets.resolve(BIG))  # nothing compiles
    assert "TORCHINDUCTOR_CACHE_DIR" not in environment(launch(0), presets.resolve("tiny", [f"{option}=true"]))
