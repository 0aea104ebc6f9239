"""Where an update's time goes: a window of fairseq updates under torch.profiler.

    TANDEM_PROFILE=FIRST:COUNT:DIR python -m train.agent.trainer.fairseq_train ...

profiles updates FIRST .. FIRST+COUNT-1 of rank 0 and writes DIR/profile.json and
DIR/profile.txt: wall time per update, the time inside `Trainer.train_step` against the time
between updates (data loading, logging), the GPU's kernel time per update (its busy share),
and the operators that cost the most host and GPU time. A GPU whose kernels fill a small
share of the update waits for the host: the cure is on the host side (launch overhead, syncs,
data loading), not a faster GPU.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Window:
    first: int
    count: int
    out: Path

    @classmethod
    def parse(cls, spec: str) -> Window:
        try:
            first, count, out = spec.split(":", 2)
            window = cls(int(first), int(count), Path(out))
        except ValueError:
            raise SystemExit(f"TANDEM_PROFILE={spec!r}: expected FIRST:COUNT:DIR, e.g. 300:20:/tmp/prof") from None
        if window.first < 1 or window.count < 1:
            raise SystemExit(f"TANDEM_PROFILE={spec!r}: FIRST and COUNT must be positive")
        return window


@dataclass
class Timeline:
    """Enter and exit times of the profiled train_step calls."""

    enters: list[float] = field(default_factory=list)
    exits: list[float] = field(default_factory=list)

    def split(self) -> dict[str, float]:
        """Seconds per update: wall (first enter → last exit, over the updates), inside train_step,
        and between updates."""
        n = len(self.exits)
        wall = (self.exits[-1] - self.enters[0]) / n
        inside = sum(b - a for a, b in zip(self.enters, self.exits, strict=True)) / n
        return {"updates": n, "wall_s": wall, "train_step_s": inside, "between_s": wall - inside}


def on_gpu(event) -> bool:
    """A kernel, copy or memset: an event that ran on the GPU, not an operator that launched it."""
    return "CUDA" in str(getattr(event, "device_type", ""))


def summarize(timeline: Timeline, events, top: int = 12) -> dict:
    """Per-update figures and the top operators and kernels from torch.profiler's key_averages()."""
    figures = timeline.split()
    n = figures["updates"]
    # fairseq labels each update's range train_step-N: one row per update, not an operator
    events = [e for e in events if not e.key.startswith("train_step-")]
    operators = [e for e in events if not on_gpu(e)]
    # a named range (forward, optimizer) shows on the GPU's timeline too, under the same name
    named = {e.key for e in operators}
    kernels = [e for e in events if on_gpu(e) and e.key not in named]

    def device_us(e) -> float:
        return getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)

    figures["gpu_kernel_s"] = sum(device_us(e) for e in kernels) / 1e6 / n
    figures["gpu_busy_share"] = figures["gpu_kernel_s"] / figures["wall_s"] if figures["wall_s"] else 0.0
    figures["top_host"] = [{"op": e.key, "calls_per_update": e.count / n, "host_ms": e.cpu_time_total / 1e3 / n}
                           for e in sorted(operators, key=lambda e: -e.cpu_time_total)[:top]]
    figures["top_gpu"] = [{"op": e.key[:90], "calls_per_update": e.count / n, "gpu_ms": device_us(e) / 1e3 / n}
                          for e in sorted(kernels, key=lambda e: -device_us(e))[:top]]
    figures["launches_per_update"] = sum(e.count for e in operators if e.key in ("cudaLaunchKernel", "cuLaunchKernel",
                                                                                  "cudaLaunchKernelExC")) / n
    return figures


def render(figures: dict) -> str:
    lines = [
        f"{figures['updates']} updates profiled: {figures['wall_s'] * 1e3:.1f} ms/update wall, "
        f"{figures['train_step_s'] * 1e3:.1f} ms in train_step, {figures['between_s'] * 1e3:.1f} ms between updates",
        f"GPU kernels {figures['gpu_kernel_s'] * 1e3:.1f} ms/update: busy {figures['gpu_busy_share']:.0%} of the wall"
        f" time; {figures['launches_per_update']:.0f} kernel launches/update",
        "",
        "host time per update (inclusive):",
        *[f"  {r['host_ms']:9.2f} ms  {r['calls_per_update']:8.1f}×  {r['op']}" for r in figures["top_host"]],
        "GPU time per update (self):" if figures["top_gpu"] else "no GPU kernels (a CPU run)",
        *[f"  {r['gpu_ms']:9.2f} ms  {r['calls_per_update']:8.1f}×  {r['op']}" for r in figures["top_gpu"]],
    ]
    return "\n".join(lines) + "\n"


def install(spec: str) -> None:
    """Wrap fairseq's Trainer.train_step so that rank 0 profiles the window `spec` names."""
    import torch
    from fairseq.trainer import Trainer

    window = Window.parse(spec)
    original = Trainer.train_step
    timeline = Timeline()
    state: dict = {"calls": 0, "profiler": None}

    def train_step(self, samples, *args, **kwargs):
        state["calls"] += 1
        call = state["calls"]
        rank0 = int(os.environ.get("RANK", "0")) == 0
        if rank0 and call == window.first:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(torch.profiler.ProfilerActivity.CUDA)
                torch.cuda.synchronize()
            state["profiler"] = torch.profiler.profile(activities=activities)
            state["profiler"].__enter__()
        profiling = state["profiler"] is not None
        if profiling:
            timeline.enters.append(time.perf_counter())
        result = original(self, samples, *args, **kwargs)
        if profiling:
            if torch.cuda.is_available():
                torch.cuda.synchronize()  # the update's kernels count to it
            timeline.exits.append(time.perf_counter())
        if profiling and call == window.first + window.count - 1:
            state["profiler"].__exit__(None, None, None)
            figures = summarize(timeline, state["profiler"].key_averages())
            state["profiler"] = None
            window.out.mkdir(parents=True, exist_ok=True)
            (window.out / "profile.json").write_text(json.dumps(figures, indent=1))
            (window.out / "profile.txt").write_text(render(figures))
        return result

    Trainer.train_step = train_step


def stack_summary(raw: str, thread: str = "MainThread", top: int = 15) -> dict[str, list[tuple[str, float]]]:
    """py-spy's raw stacks (`--threads`: `thread (ID): NAME;frame;... count` per line) of one thread,
    as the functions with the largest share of its samples: inclusive (anywhere on the stack) and
    self (the leaf)."""
    inclusive: dict[str, int] = {}
    leaf: dict[str, int] = {}
    total = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        if not frames[0].endswith(thread):
            continue
        frames = frames[1:] or ["(no Python frame)"]
        total += int(count)
        for frame in set(frames):
            inclusive[frame] = inclusive.get(frame, 0) + int(count)
        leaf[frames[-1]] = leaf.get(frames[-1], 0) + int(count)

    def share(counts: dict[str, int]) -> list[tuple[str, float]]:
        return [(f, c / total) for f, c in sorted(counts.items(), key=lambda kv: -kv[1])[:top]] if total else []

    return {"inclusive": share(inclusive), "self": share(leaf)}
