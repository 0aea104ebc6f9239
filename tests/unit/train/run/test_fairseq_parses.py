"""Every command tandem builds, read back by fairseq's own parser: what fairseq understood is what
tandem meant (world size, rank, device, backends, precision). No GPU needed; seconds.

This is the test that would have caught `--bf16` killing every rank: fairseq 0.12 alone reads it
as "bf16 on a TPU" (tpu=True), and distributed_init then asks for torch_xla.
"""

from __future__ import annotations

import shlex

import pytest

from train.agent.trainer import fairseq_train
from train.recipe import presets
from train.run import command

fairseq_options = pytest.importorskip("fairseq.options")

LAYOUTS = {  # name → (hosts, GPUs per host)
    "2 CPU hosts": (2, 0),
    "2 hosts x 2 GPUs": (2, 2),
    "3 hosts x 8 GPUs": (3, 8),
}


def launches_for(hosts: int, gpus: int, precision: str) -> list[command.Launch]:
    spec = [{"address": f"10.0.0.{i + 1}", "gpus": gpus, "nic": "ens5"} for i in range(hosts)]
    return command.launches("r1", spec, master_port=29500, data_dir="/data/tandem/datasets/x",
                            run_dir="/data/tandem/runs/r1", venv="/opt/tandem/venv", precision=precision)


def per_process_argv(launch: command.Launch, preset: presets.Preset, local_rank: int) -> tuple[list[str], bool]:
    """fairseq's arguments for one process, as torchrun would start it, and whether it goes through
    tandem's entry point (train.agent.trainer.fairseq_train) rather than fairseq-train."""
    argv = command.foreground_command(preset, launch)
    if "--no-python" in argv:  # several GPUs: bash -c 'exec TRAINER ARGS --distributed-rank "$RANK" ...'
        inner = argv[argv.index("-c") + 1]
        rank = launch.node_rank * launch.nproc_per_node + local_rank
        words = shlex.split(inner.replace('"$RANK"', str(rank)).replace('"$LOCAL_RANK"', str(local_rank)))
        words = words[1:]  # exec
    else:
        words = argv[argv.index("--nproc_per_node") + 2 :]
        if words[0] == "-m":  # torchrun -m MODULE: its own python runs the module
            words = ["python", *words]
    if words[1:3] == ["-m", "train.agent.trainer.fairseq_train"]:
        return words[3:], True
    assert words[0].endswith("/bin/fairseq-train"), words[:3]
    return words[1:], False


def parse(args: list[str], through_tandem: bool):
    parser = fairseq_options.get_training_parser()
    parsed = fairseq_options.parse_args_and_arch(parser, args)
    return fairseq_train.bf16_on_gpu(parsed) if through_tandem else parsed


CASES = [(p, prec, layout) for p in presets.PRESETS for layout in LAYOUTS for prec in ("fp32", "fp16", "bf16")
         if not (LAYOUTS[layout][1] == 0 and prec != "fp32")]


@pytest.mark.parametrize(("preset_name", "precision", "layout"), CASES)
def test_fairseq_reads_the_command_as_tandem_meant(preset_name, precision, layout):
    hosts, gpus = LAYOUTS[layout]
    preset = presets.resolve(preset_name)
    launches = launches_for(hosts, gpus, precision)
    # the last process of the last host: the one most likely to get its rank or device wrong
    launch = launches[-1]
    local_rank = launch.nproc_per_node - 1
    args, through_tandem = per_process_argv(launch, preset, local_rank)
    parsed = parse(args, through_tandem)

    assert parsed.distributed_world_size == hosts * max(gpus, 1)
    assert parsed.distributed_rank == (hosts - 1) * max(gpus, 1) + local_rank
    assert parsed.distributed_init_method == "env://"
    assert parsed.arch == preset.options["arch"]
    assert parsed.max_tokens == preset.options["max_tokens"]
    assert parsed.tpu is False, "fairseq would ask for torch_xla and every rank die"
    assert (parsed.fp16, parsed.bf16) == (precision == "fp16", precision == "bf16")
    if gpus == 0:
        assert parsed.cpu and parsed.distributed_backend == "gloo" and parsed.ddp_backend == "legacy_ddp"
    else:
        assert not parsed.cpu
        assert parsed.distributed_backend == "nccl"
        assert parsed.ddp_backend == "pytorch_ddp"  # overlaps the all-reduce with the backward pass
        if gpus > 1:
            assert parsed.device_id == local_rank
    assert through_tandem  # every run: tandem's entry point (train/agent/trainer/fairseq_train.py)


def test_fairseq_alone_takes_bf16_for_a_tpu():
    """Why bf16 goes through tandem's entry point: fairseq-train's own reading of --bf16."""
    (launch,) = launches_for(1, 1, "bf16")
    args, _ = per_process_argv(launch, presets.resolve("transformer_wmt_en_de"), 0)
    assert parse(args, through_tandem=False).tpu is True
    assert parse(args, through_tandem=True).tpu is False


@pytest.mark.parametrize(("gpus", "expected"), [([2, 2], "fp16"), ([0, 0], "fp32"), ([2, 0], "fp32"), ([], "fp32")])
def test_gpu_hosts_default_to_fp16_cpu_hosts_to_fp32(gpus, expected):
    assert command.default_precision(gpus) == expected


def test_pytorch_ddp_on_cpu_hosts_goes_through_tandems_entry_point():
    """fairseq alone gives DDP a GPU device id on CPU hosts; the preset's ddp_backend must win over
    tandem's legacy_ddp default, and the run must start through train.agent.trainer.fairseq_train."""
    launch = launches_for(2, 0, "fp32")[-1]
    args, through_tandem = per_process_argv(launch, presets.resolve("tiny", ["ddp_backend=pytorch_ddp"]), 0)
    parsed = parse(args, through_tandem)
    assert through_tandem and parsed.cpu and parsed.ddp_backend == "pytorch_ddp"
    assert args.count("--ddp-backend") == 1


def test_gpu_runs_keep_attention_off_cudnn(monkeypatch):
    """torch prefers cuDNN's attention on Hopper; it rebuilt its plan for every batch shape (~120 ms
    per update on an H100). The entry point every GPU run starts through turns it off, unless asked."""
    import torch

    calls = []
    monkeypatch.setattr(torch.backends.cuda, "enable_cudnn_sdp", calls.append)
    monkeypatch.delenv("TANDEM_CUDNN_ATTENTION", raising=False)
    fairseq_train.attention_without_cudnn()
    assert calls == [False]
    monkeypatch.setenv("TANDEM_CUDNN_ATTENTION", "1")
    fairseq_train.attention_without_cudnn()
    assert calls == [False]
