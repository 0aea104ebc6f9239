"""`fab train`'s last line, `fab status`'s progress line and the bar say the run's MFU on GPUs: rank 0's
last logged words/s (all ranks) over the run's GPUs at the peak of the GPU the probe named; an unknown
GPU is named, never guessed; a CPU run's lines stay as they were."""

from __future__ import annotations

from rich.console import Console

from train.cluster import Host
from train.recipe import logformat
from train.recipe.record import Run
from train.run.follow import ProgressView
from train.run.launch import HostState
from train.run.status import closing_mfu, describe, mfu_of, run_state_line, summarize

H100 = "NVIDIA H100 80GB HBM3"


def big_run(gpu_name: str | None, hosts: tuple[str, ...] = ("gpu0",)) -> Run:
    return Run(run_id="big-h100", hosts=list(hosts), preset="transformer_vaswani_wmt_en_de_big", overrides=[],
               dataset="wmt16-en-de", precision="fp16", gpu_name=gpu_name)


def gpu_host(name: str, gpus: int = 1) -> Host:
    return Host(name, "10.0.0.1", gpus=gpus)


def progress(wps: float | None, update: int = 24_000, finished: bool = True) -> logformat.Progress:
    return logformat.Progress(update=update, max_update=24_000, loss=3.9, valid_loss=4.1, seconds_per_update=2.42,
                             wps=wps, wpb=458_752.0, devices=1, finished=finished)


def finished(wps: float | None, name: str = "gpu0") -> list[HostState]:
    return [HostState(name, False, True, progress(wps), ["done training"], ranks="0")]


def last_line(run: Run, hosts: list[Host], states: list[HostState]) -> str:
    console = Console(width=200, record=True, color_system=None)
    summarize(states, console, closing_mfu(run, hosts, states))
    return console.export_text().splitlines()[-1]


def test_big_on_one_h100_ends_with_its_words_per_second_and_24_percent_mfu():
    line = last_line(big_run(H100), [gpu_host("gpu0")], finished(189_407.0))
    assert line == "finished, update 24,000/24,000 · 189,407 words/s · MFU 24%"


def test_only_the_runs_members_gpus_count():
    """Two H100 hosts now in the run: the same words/s is half the utilization; a host the inventory
    knows but the keepers left out does not count."""
    hosts = [gpu_host("gpu0"), gpu_host("gpu1"), gpu_host("gpu2")]
    assert closing_mfu(big_run(H100, ("gpu0", "gpu1")), hosts, finished(189_407.0)).endswith("MFU 12%")
    assert closing_mfu(big_run(H100, ("gpu0",)), hosts, finished(189_407.0)).endswith("MFU 24%")


def test_an_unknown_gpu_is_named_on_the_last_line():
    line = last_line(big_run("NVIDIA GeForce RTX 4090"), [gpu_host("gpu0")], finished(189_407.0))
    assert line.endswith("· 189,407 words/s · MFU: peak unknown (NVIDIA GeForce RTX 4090)")


def test_a_cpu_runs_last_line_is_unchanged():
    run = Run(run_id="lab", hosts=["v100a", "v100b"], preset="tiny", overrides=[], dataset="synthetic")
    hosts = [Host("v100a", "10.10.0.1"), Host("v100b", "10.10.0.2")]
    states = finished(9_120.0, "v100a") + [HostState("v100b", False, True, None, [], ranks="1")]
    assert closing_mfu(run, hosts, states) == ""
    assert last_line(run, hosts, states) == "finished, update 24,000/24,000"


def test_no_words_per_second_yet_no_mfu():
    assert closing_mfu(big_run(H100), [gpu_host("gpu0")], finished(None)) == ""
    assert run_state_line(finished(None), "") == "[green]finished[/], update 24,000/24,000"


def test_fab_status_and_the_bar_say_it_beside_words_per_second():
    run, hosts = big_run(H100, ("gpu0", "gpu1")), [gpu_host("gpu0")]
    p = progress(189_407.0, update=1_000, finished=False)
    assert "189,407 wps · MFU 24%" in describe(p, mfu_of(run, hosts, p.wps))
    view = ProgressView(run, hosts, Console(record=True))
    try:
        assert view.mfu(189_407.0) == "MFU 24%"
        view.follow([gpu_host("gpu0"), gpu_host("gpu1")])  # the keepers grew it back to two hosts
        assert view.mfu(189_407.0) == "MFU 12%"
    finally:
        view.hosts_below.close()
