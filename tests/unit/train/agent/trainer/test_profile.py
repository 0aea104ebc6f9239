"""train/agent/trainer/profile.py: what a profiled window of updates says about where the time went."""

from dataclasses import dataclass

import pytest

from train.agent.trainer import profile


@dataclass
class Event:  # the fields of torch.profiler's FunctionEventAvg that the summary reads
    key: str
    count: int
    cpu_time_total: float = 0.0  # µs, over the window
    self_device_time_total: float = 0.0
    device_type: str = "DeviceType.CPU"


def test_a_window_is_first_count_and_directory(tmp_path):
    assert profile.Window.parse(f"300:20:{tmp_path}") == profile.Window(300, 20, tmp_path)
    with pytest.raises(SystemExit, match="expected FIRST:COUNT:DIR"):
        profile.Window.parse("300")
    with pytest.raises(SystemExit, match="must be positive"):
        profile.Window.parse(f"0:20:{tmp_path}")


def test_the_gpu_busy_share_counts_kernels_not_the_named_ranges_that_launched_them():
    timeline = profile.Timeline(enters=[0.0, 0.1], exits=[0.09, 0.2])  # two updates, 10 ms between
    events = [
        Event("forward", 2, cpu_time_total=80_000),
        Event("forward", 2, self_device_time_total=90_000, device_type="DeviceType.CUDA"),  # the range, on the GPU
        Event("aten::_cudnn_attention_forward", 24, cpu_time_total=60_000),
        Event("sm90_gemm", 400, self_device_time_total=30_000, device_type="DeviceType.CUDA"),
        Event("cudaLaunchKernel", 2400, cpu_time_total=20_000),
        Event("train_step-301", 1, cpu_time_total=90_000),
    ]
    figures = profile.summarize(timeline, events)
    assert figures["wall_s"] == pytest.approx(0.1)
    assert figures["between_s"] == pytest.approx(0.005)
    assert figures["gpu_kernel_s"] == pytest.approx(0.015)  # the gemm alone: 30 ms over 2 updates
    assert figures["gpu_busy_share"] == pytest.approx(0.15)
    assert figures["launches_per_update"] == 1200
    assert [r["op"] for r in figures["top_host"]][:2] == ["forward", "aten::_cudnn_attention_forward"]
    text = profile.render(figures)
    assert "busy 15% of the wall" in text and "sm90_gemm" in text and "train_step-301" not in text


def test_py_spy_stacks_are_shared_out_within_the_main_thread():
    raw = "\n".join([
        "thread (1): MainThread;train (train.py:1);backward (graph.py:869) 60",
        "thread (1): MainThread;train (train.py:1);forward (mha.py:6683) 40",
        "thread (2): Thread-4 (_pin_memory_loop);wait (threading.py:355) 900",
    ])
    summary = profile.stack_summary(raw)
    assert summary["inclusive"][0] == ("train (train.py:1)", 1.0)
    assert summary["self"] == [("backward (graph.py:869)", 0.6), ("forward (mha.py:6683)", 0.4)]
