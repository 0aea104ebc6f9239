"""`fab watch` rendered from recorded runs at 80x24: golden text (TANDEM_UPDATE_GOLDEN=1 rewrites it)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from rich.console import Console
from watch_replay import at, cpu_run, gpu_run, unreachable

from train.watch import render, screen
from train.watch.screen import Gpu, HostRow

GOLDEN = Path(__file__).parent / "golden"


pytestmark = pytest.mark.usefixtures("utc")  # conftest: the log times read as UTC


def text_of(shown: screen.Screen, width: int = 80, height: int = 24) -> str:
    console = Console(width=width, height=height, record=True, color_system=None, force_terminal=False)
    console.print(render.render(shown, width, height))
    return "\n".join(line.rstrip() for line in console.export_text().splitlines()) + "\n"


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / f"{name}.txt"
    if os.environ.get("TANDEM_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert text == path.read_text(), f"{name} changed:\n{text}"
    lines = text.splitlines()
    assert len(lines) <= 24 and all(len(line) <= 80 for line in lines), text


def test_two_cpu_hosts_on_a_10mbit_link_are_network_bound():
    now = at("2026-11-23 02:13:30")
    run, readings = cpu_run(now)
    shown = screen.build(run, readings, now)
    text = text_of(shown)
    check_golden("cpu-2-hosts-10mbit", text)
    assert "v100a 0     running  no GPU" in text and "v100b 1     running  no GPU" in text
    assert "update 30/60 (50%)" in text and "s/update 1.32 last · 1.32 median" in text
    assert shown.verdict.startswith("network-bound: NIC at")


def test_a_host_that_stopped_answering_is_shown_unreachable():
    now = at("2026-11-23 02:13:30")
    run, readings = cpu_run(now)
    readings[1] = unreachable(readings[1], 6, "no answer within 3 s")
    text = text_of(screen.build(run, readings, now))
    check_golden("cpu-2-hosts-one-unreachable", text)
    assert "v100b 1     unreachable: no answer for 6 s (no answer within 3 s)" in text
    assert "v100a 0     running" in text


def test_four_gpu_hosts_one_unreachable():
    now = 1795390065.714 + 100  # inside the H100 run's training
    run, readings = gpu_run(now, 4)
    readings[3] = unreachable(readings[3], 4, "SSHException: No existing session")
    shown = screen.build(run, readings, now, link_mbps=1000)
    text = text_of(shown)
    check_golden("gpu-4-hosts-one-unreachable", text)
    assert text.count(" running  0 ") == 3 and "gpu3 3     unreachable" in text
    assert "not network-bound" in shown.verdict and "GPUs" in shown.verdict


def many_gpus(name: str, rank: int, count: int) -> HostRow:
    gpus = [Gpu(i, 50.0 + i, 10_000.0, 16_000.0) for i in range(count)]
    return HostRow(name, screen.ranks_of(rank, count), "running", gpus, 900.0, 880.0, 40.0)


def test_eight_gpus_on_four_hosts_fold_into_a_line_per_host():
    run, readings = cpu_run(at("2026-11-23 02:13:30"))
    shown = screen.build(run, readings, at("2026-11-23 02:13:30"), link_mbps=1000)
    shown = screen.Screen(shown.run_id, shown.at, 1000.0, "test", [many_gpus(f"h{i}", i, 8) for i in range(4)],
                          shown.run, shown.verdict)
    small = text_of(shown).splitlines()
    assert len(small) <= 24 and sum("8× " in line for line in small) == 4, small
    assert "h1   8-15  running  8× " in "\n".join(small)
    tall = text_of(shown, 120, 50).splitlines()  # room enough: a line per GPU
    assert sum(" 7 " in line for line in tall) == 4 and all(len(line) <= 120 for line in tall)


def test_the_nic_bar_turns_red_above_80_percent_of_the_link():
    row = HostRow("a", "0", "running", None, 85.0, 10.0, 5.0)
    cool = HostRow("b", "1", "running", None, 50.0, 10.0, 5.0)
    run, readings = cpu_run(at("2026-11-23 02:13:30"))
    base = screen.build(run, readings, at("2026-11-23 02:13:30"))
    shown = screen.Screen("r", base.at, 100.0, "test", [row, cool], base.run, base.verdict)
    console = Console(width=80, height=24, record=True, color_system="standard", force_terminal=True)
    console.print(render.render(shown))
    lines = console.export_text(styles=True).splitlines()
    assert "\x1b[31m" in next(line for line in lines if line.startswith("a ")), lines
    assert "\x1b[31m" not in next(line for line in lines if line.startswith("b "))


def test_the_compact_line_under_the_progress_bar():
    now = at("2026-11-23 02:13:30")
    run, readings = cpu_run(now)
    readings[1] = unreachable(readings[1], 6, "no answer within 3 s")
    shown = screen.build(run, readings, now)
    a, b = (render.compact_line(row, shown).plain for row in shown.hosts)
    assert a.startswith("  v100a no GPU · NIC ") and "% of link" in a and a.endswith(" s/update")
    assert b == "  v100b unreachable: no answer for 6 s (no answer within 3 s)"


def test_the_verdict_is_the_reports():
    """The same answers as `fab report` over the window: network-bound by the same definition."""
    from train.report import answers, series

    now = at("2026-11-23 02:13:30")
    run, readings = cpu_run(now)
    shown = screen.build(run, readings, now)
    recent = {r.name: [s for s in r.samples if s["t"] >= now - screen.WINDOW_S] for r in readings}
    data = answers.from_texts(run, {"v100a": readings[0].log_lines}, recent)
    net = answers.answer_network(data, series.intervals(data), None)
    assert net.verdict == "network-bound"
    assert f"NIC at {net.numbers['mean_share']:.0%} of the 9.5 Mbit/s link" in shown.verdict


def test_the_host_lines_sit_under_the_progress_bar():
    from types import SimpleNamespace

    from rich.progress import BarColumn, TextColumn

    from train.watch.compact import ProgressWithHosts

    now = at("2026-11-23 02:13:30")
    run, readings = cpu_run(now)
    shown = screen.build(run, readings, now)
    lines = SimpleNamespace(lines=[render.compact_line(row, shown) for row in shown.hosts])
    console = Console(width=100, record=True, color_system=None, force_terminal=False)
    with ProgressWithHosts(lines, TextColumn("run"), BarColumn(), console=console) as bar:
        bar.add_task("train", total=60, completed=30)
    out = console.export_text().splitlines()
    assert out[0].startswith("run ") and out[1].startswith("  v100a no GPU · NIC ") and "v100b" in out[2], out


def test_a_finished_run_keeps_the_verdict_of_its_last_samples():
    end = at("2026-11-23 02:14:30")
    run, readings = cpu_run(end)
    for r in readings:
        r.running = False
    later = screen.build(run, readings, end + 600)  # ten minutes after the monitors stopped
    assert later.verdict.startswith("network-bound: NIC at"), later.verdict
    assert [h.state for h in later.hosts] == ["stopped", "stopped"]


def test_two_cpu_hosts_of_two_ranks_show_which_ranks_run_where():
    """2 hosts x 2 ranks (cpu_ranks: 2): `fab watch` says 0-1 and 2-3, and the line under `fab train`'s bar
    names them, with the run's s/update on rank 0's host."""
    now = at("2026-11-23 02:13:30")
    run, readings = cpu_run(now)
    for r in readings:
        r.ranks = 2
    shown = screen.build(run, readings, now, link_mbps=1000)
    assert [h.ranks for h in shown.hosts] == ["0-1", "2-3"]
    text = text_of(shown)
    assert "v100a 0-1   running" in text and "v100b 2-3   running" in text, text
    lines = [render.compact_line(row, shown).plain for row in shown.hosts]
    assert lines[0].startswith("  v100a ranks 0-1 · no GPU") and "s/update" in lines[0], lines
    assert lines[1].startswith("  v100b ranks 2-3 · no GPU") and "s/update" not in lines[1], lines
    one = screen.build(run, cpu_run(now)[1], now, link_mbps=1000)  # one rank a host: the lines as they were
    assert [h.ranks for h in one.hosts] == ["0", "1"]
    assert render.compact_line(one.hosts[1], one).plain.startswith("  v100b no GPU")
