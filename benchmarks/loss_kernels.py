"""fairseq's label-smoothed loss against tandem's from the logits (train/agent/fused_loss.py), side
by side on one device: time of a forward and backward, and the memory each holds beyond its logits.

    python -m benchmarks.loss_kernels [--rows 26985] [--vocab 32768] [--repeat 5]

On a GPU (fp16 logits, tandem's passes compiled) the time is CUDA-synchronized and the memory is
torch's peak allocation; on a CPU (fp32 logits, passes unfused: what a CPU host would run, though
CPU hosts never get the switch) the memory is the process's peak resident size, each side in a
process of its own. The defaults are Transformer big's rows at one H100's batch (max_tokens
26,985) and a 32k vocabulary.
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


def tandems(logits, target, smoothing):
    from train.agent import fused_loss

    return fused_loss.label_smoothed_loss(logits, target, smoothing, PAD, compiled=logits.is_cuda)


def measure(side: str, rows: int, vocab: int, repeat: int) -> dict:
    import torch

    cuda = torch.cuda.is_available()
    device, dtype = ("cuda", torch.float16) if cuda else ("cpu", torch.float32)
    gen = torch.Generator(device=device).manual_seed(0)
    logits = torch.randn(rows, vocab, generator=gen, device=device, dtype=dtype).requires_grad_()
    target = torch.randint(2, vocab, (rows,), generator=gen, device=device)
    target[::9] = PAD  # ~11% padding, as fairseq's batches of sentences of similar length
    loss_of = fairseqs if side == "fairseq" else tandems
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
            "peak_beyond_logits_gib": round(held / 2**30, 2), "loss": losses[-1]}


def in_own_process(side: str, rows: int, vocab: int, repeat: int) -> dict:
    """Each side in a fresh process: a CPU's peak resident size is the process's whole life."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(measure, (side, rows, vocab, repeat))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=26_985)
    parser.add_argument("--vocab", type=int, default=32_768)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    results = [in_own_process(side, args.rows, args.vocab, args.repeat) for side in ("fairseq", "tandem")]
    for r in results:
        print(json.dumps(r))
    theirs, ours = results
    print(f"{ours['device']}, {args.rows:,} rows x {args.vocab:,}: fairseq {theirs['ms']} ms and "
          f"{theirs['peak_beyond_logits_gib']} GiB, tandem {ours['ms']} ms and {ours['peak_beyond_logits_gib']} GiB "
          f"({theirs['ms'] / ours['ms']:.2f}x faster); loss {theirs['loss']:.6g} against {ours['loss']:.6g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
