"""fairseq-train with two of fairseq 0.12's device assumptions fixed (tandem starts such runs with it).

    python -m train.agent.fairseq_train DATA ...      (the same arguments as fairseq-train)

- `--bf16` means bfloat16 on the GPU, not on a TPU (below);
- `--ddp-backend pytorch_ddp` works on CPU hosts: fairseq hands DistributedDataParallel
  `device_ids=[device_id]`, which torch refuses for a CPU module, so CPU runs could only use
  legacy_ddp, whose all-reduce never overlaps the backward pass. The lab measures that overlap
  (benchmarks.step) with this.

fairseq 0.12 ties `--bf16` to TPUs: `options.add_defaults` sets `tpu=True`, and
`distributed_init` then imports torch_xla, which a GPU host lacks, so every rank dies at start.
The rest of fairseq already does bf16 on a GPU: the trainer casts the model to bfloat16 and
FP16Optimizer keeps fp32 master weights, with no loss scaling for bf16. This entry point parses
the arguments as fairseq-train does and clears `tpu` again when CUDA is the device; everything
else is fairseq-train itself.
"""

from __future__ import annotations


def bf16_on_gpu(args):
    """`args` (fairseq's parsed namespace) with bf16 kept on the GPU instead of a TPU."""
    if getattr(args, "bf16", False) and not getattr(args, "cpu", False):
        args.tpu = False
    return args


def patch_parser() -> None:
    """Make fairseq's own `parse_args_and_arch` return bf16-on-GPU arguments."""
    from fairseq import options

    parse = options.parse_args_and_arch
    if getattr(parse, "_tandem_bf16", False):
        return

    def parse_args_and_arch(*args, **kwargs):
        return bf16_on_gpu(parse(*args, **kwargs))

    parse_args_and_arch._tandem_bf16 = True  # type: ignore[attr-defined]
    options.parse_args_and_arch = parse_args_and_arch


def ddp_on_cpu() -> None:
    """Give fairseq a DistributedDataParallel that leaves device_ids unset for a CPU module."""
    import torch
    from fairseq.models import distributed_fairseq_model as dfm

    if getattr(dfm.DistributedDataParallel, "_tandem_cpu", False):
        return

    class DistributedDataParallel(torch.nn.parallel.DistributedDataParallel):
        _tandem_cpu = True

        def __init__(self, module, *args, device_ids=None, output_device=None, **kwargs):
            on_cpu = all(p.device.type == "cpu" for p in module.parameters())
            super().__init__(module, *args, device_ids=None if on_cpu else device_ids,
                             output_device=None if on_cpu else output_device, **kwargs)

    dfm.DistributedDataParallel = DistributedDataParallel


def main() -> None:
    # fairseq_cli.train sets up fairseq's log format when imported: before anything else logs.
    from fairseq_cli.train import cli_main

    patch_parser()
    ddp_on_cpu()
    cli_main()


if __name__ == "__main__":
    main()
