"""fairseq's label-smoothed loss against tandem's from the logits (train/agent/trainer/fused_loss.py), side
by side on one device: time of a forward and backward, the memory each holds beyond its logits, and
what one forward and backward costs as torch's profiler sees it: the operations it runs (on a GPU
the kernels it launches) and the bytes it allocates per entry of the logits.

    python -m benchmarks.loss_kernels [--rows 26985] [--vocab 32768] [--repeat 5] [--dtype float16]

On a GPU (fp16 logits, tandem's passes compiled) the time is CUDA-synchronized, the memory is
torch's peak allocation and the launches are CUDA kernels. On a CPU (fp32 logits unless --dtype
says otherwise; CPU hosts never get the switch) the memory is the process's peak resident size, each
side in a process of its own, and the operations are the outermost aten operations and compiled
kernels; tandem runs both ways there: unfused (what its fallback runs, chunk by chunk) and compiled
by inductor into C++ (`tandem-compiled`: the passes GPUs compile, one kernel where the GPU's is one,
without a GPU). The defaults are Transformer big's rows at one H100's batch (max_tokens 26,985) and a
32k vocabulary.

    side            device  dtype          ms  peak(GiB)  ops  allocated(B/entry)
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import resource
import statistics
import time

PAD = 1


def fairseqs(logits, target, smoothing):
    from fairseq import utils
    from fairseq.criterions.label_smoothed_cross_entropy import label_smoothed_nll_loss

    return label_smoothed_nll_loss(utils.log_softmax(logits, dim=-1), target, smoothing, ignore_index=PAD)


def tandems(logits, target, smoothing, compiled=None):
    from train.agent.trainer import fused_loss

    compiled = logits.is_cuda if compiled is None else compiled
    return fused_loss.label_smoothed_loss(logits, target, smoothing, PAD, compiled=compiled)


SIDES = {"fairseq": fairseqs, "tandem": tandems, "tandem-compiled": lambda *a: tandems(*a, compiled=True)}
COMPILED_KERNELS = ("cpp_fused", "triton_", "cpp_CppKernel")  # inductor's kernels, as the profiler names them


def profiled(loss_of, logits, target) -> dict:
    """One forward and backward under torch's profiler: its operations (the outermost aten operations
    and compiled kernels; on a GPU its CUDA kernels) and the bytes it allocates per logit entry."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = logits.is_cuda
    if not cuda:
        import torch._inductor.config

        torch._inductor.config.cpp.enable_kernel_profile = True  # each C++ kernel a profiler event
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities, profile_memory=True) as prof:
        loss, _ = loss_of(logits, target, 0.1)
        loss.backward()
        if cuda:
            torch.cuda.synchronize()
    logits.grad = None
    events = prof.events()

    def op(e) -> bool:
        return e.name.startswith("aten::") or any(k in e.name for k in COMPILED_KERNELS)

    def outermost(e) -> bool:
        parent = e.cpu_parent
        while parent is not None:
            if op(parent):
                return False
            parent = parent.cpu_parent
        return True

    if cuda:
        ops = sum(1 for e in events if e.device_type == torch.autograd.DeviceType.CUDA and not e.is_legacy
                  and "memcpy" not in e.name.lower() and "memset" not in e.name.lower())
        allocated = sum(max(0, e.self_device_memory_usage) for e in events)
    else:
        ops = sum(1 for e in events if op(e) and outermost(e))
        allocated = sum(max(0, e.self_cpu_memory_usage) for e in events)  # each op's own, net of its frees
    return {"ops": ops, "allocated_bytes_per_entry": round(allocated / logits.numel(), 2)}


def measure(side: str, rows: int, vocab: int, repeat: int, dtype_name: str | None = None) -> dict:
    import torch

    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    dtype = getattr(torch, dtype_name) if dtype_name else torch.float16 if cuda else torch.float32
    gen = torch.Generator(device=device).manual_seed(0)
    logits = torch.randn(rows, vocab, generator=gen, device=device, dtype=dtype).requires_grad_()
    target = torch.randint(2, vocab, (rows,), generator=gen, device=device)
    target[::9] = PAD  # ~11% padding, as fairseq's batches of sentences of similar length
    loss_of = SIDES[side]
    times, losses = [], []
    for i in range(repeat + 1):  # the first compiles (GPU) and warms the allocator
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
        started = time.perf_counter()
        loss, _ = loss_of(logits, target, 0.1)
        loss.backward()
        if cuda:
            torch.cuda.synchronize()
        if i:
            times.append(time.perf_counter() - started)
        losses.append(loss.item())
        logits.grad = None
    held = (torch.cuda.max_memory_allocated() - before) if cuda else \
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - 2 * logits.numel() * logits.element_size()
    return {"side": side, "device": torch.cuda.get_device_name() if cuda else "cpu", "dtype": str(dtype),
            "rows": rows, "vocab": vocab, "ms": round(statistics.median(times) * 1000, 2),
            "peak_beyond_logits_gib": round(held / 2**30, 2), "loss": losses[-1],
            **profiled(loss_of, logits, target)}


def in_own_process(side: str, rows: int, vocab: int, repeat: int, dtype: str | None) -> dict:
    """Each side in a fresh process: a CPU's peak resident size is the process's whole life."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(measure, (side, rows, vocab, repeat, dtype))


def main(argv: list[str] | None = None) -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=26_985)
    parser.add_argument("--vocab", type=int, default=32_768)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--dtype", choices=("float32", "float16", "bfloat16"),
                        help="the logits' (default: float16 on a GPU, float32 on a CPU)")
    parser.add_argument("--sides", default=None, help="comma-separated, of " + ", ".join(SIDES)
                        + " (default: fairseq and tandem; on a CPU tandem-compiled too)")
    args = parser.parse_args(argv)
    sides = args.sides.split(",") if args.sides else \
        ["fairseq", "tandem"] + ([] if torch.cuda.is_available() else ["tandem-compiled"])
    results = [in_own_process(side, args.rows, args.vocab, args.repeat, args.dtype) for side in sides]
    for r in results:
        print(json.dumps(r))
    print(f"{'side':<16}{'device':<24}{'dtype':<15}{'ms':>10}{'peak(GiB)':>11}{'ops':>6}{'allocated(B/entry)':>20}")
    for r in results:
        print(f"{r['side']:<16}{r['device'][:23]:<24}{r['dtype']:<15}{r['ms']:>10}{r['peak_beyond_logits_gib']:>11}"
              f"{r['ops']:>6}{r['allocated_bytes_per_entry']:>20}")
    theirs = results[0]
    for ours in results[1:]:
        print(f"{ours['side']}: {theirs['ms'] / ours['ms']:.2f}x {theirs['side']}'s speed, "
              f"loss {ours['loss']:.6g} against {theirs['loss']:.6g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
