"""Text from a host (its log lines, a rank's end, its errors) is shown as text: rich markup in it is never
read (a log line with `[/]` crashed `fab status` with rich's MarkupError) and a terminal escape in it never
reaches the terminal (`\\x1b[2J` cleared the user's screen) (issue 54)."""

from __future__ import annotations

import io

from rich.console import Console

from train.cluster import GroupResult, Host, HostResult
from train.recipe import logformat
from train.recipe.record import Run
from train.run import idle, keepers, launch, logtail, offsite, status
from train.run.launch import HostState
from train.watch import render

HOSTILE = "oops [/] [bold]x \x1b[2J\x1b]0;title\x07 done\x1bc"
RUN = Run(run_id="run-1", hosts=["v100a", "v100b"], preset="tiny", overrides=[], dataset="synthetic")
HOSTS = [Host(name="v100a", address="10.0.0.11"), Host(name="v100b", address="10.0.0.12")]


def terminal() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=200, force_terminal=True, color_system=None), out


def died() -> list[HostState]:
    end = logformat.RankEnd(rank=1, how=f"exited with code 1 {HOSTILE}", time="2026-11-23_02:58:01",
                            error=f"ValueError: {HOSTILE}")
    return [HostState("v100a", False, True, None, [f"rank 0 said {HOSTILE}"], ranks="0", ended=end),
            HostState("v100b", False, True, None, [f"rank 1 said {HOSTILE}"], ranks="1",
                      ended=logformat.RankEnd(rank=1, how=f"killed {HOSTILE}", time="2026-11-23_02:58:02"))]


def test_a_status_table_of_hostile_log_lines_prints_them_as_text():
    console, out = terminal()
    status.summarize(died(), console)
    shown = out.getvalue()
    assert "\x1b[2J" not in shown and "\x1b]0" not in shown and "\x07" not in shown and "\x1bc" not in shown
    assert "oops [/] [bold]x" in shown


def test_fab_status_prints_a_dead_ranks_hostile_lines_as_text(monkeypatch):
    states = died()
    monkeypatch.setattr(launch, "states", lambda run, hosts: states)
    monkeypatch.setattr(keepers, "sync", lambda run, states, *a: [])
    monkeypatch.setattr(keepers, "rank_order", lambda run, states: states)
    monkeypatch.setattr(keepers, "timeline", lambda states: [])
    monkeypatch.setattr(keepers, "set_aside_lines", lambda states: [])
    monkeypatch.setattr(offsite, "status_line", lambda run, states: "")
    monkeypatch.setattr(idle, "cost", lambda *a, **k: type("Cost", (), {"lines": lambda self: []})())
    console, out = terminal()
    status.show(RUN, HOSTS, console)
    shown = out.getvalue()
    assert "its last log lines" in shown and "rank 1 said oops [/] [bold]x" in shown
    assert "\x1b[2J" not in shown and "\x07" not in shown and "\x1bc" not in shown
    assert status.status_json(RUN, states)  # the state line read from its markup: no MarkupError


def test_fab_logs_and_following_strip_terminal_escapes(monkeypatch):
    monkeypatch.setattr(status, "run_all", lambda hosts, command, **_: GroupResult(
        (h.name, HostResult(h.name, stdout=f"a line {HOSTILE}\nanother\n", exited=0)) for h in hosts))
    console, out = terminal()
    status.show_logs(RUN, HOSTS, 5, console)
    said = []
    logtail.HostPrefixed("v100a | ", said.append).write(f"a line {HOSTILE}\r\nnext\r\n")
    for shown in (out.getvalue(), *said):
        assert "\x1b[2J" not in shown and "\x07" not in shown and "\x1bc" not in shown
    assert said == ["v100a | a line oops [/] [bold]x  done", "v100a | next"]


def test_fab_watch_shows_a_hosts_error_and_membership_without_its_escapes():
    from train.watch.screen import HostRow, RunRow, Screen

    row = HostRow("v100b", "1", "unreachable", None, None, None, None, f"no answer ({HOSTILE})")
    shown = Screen("run-1", 0.0, None, "?", [row], RunRow(1, 2, None, None, None, None, None, False, None),
                   "waiting", (f"v100b lost: {HOSTILE}", "again"))
    console, out = terminal()
    console.print(render.render(shown, 120, 40))
    console.print(render.compact_line(row, shown))
    text = out.getvalue()
    assert "\x1b[2J" not in text and "\x07" not in text and "\x1bc" not in text and "[/]" in text


def test_a_skipped_network_check_says_the_hosts_error_as_text(monkeypatch):
    from train.cluster import ClusterError
    from train.run import session

    def refused(*_, **__):
        raise ClusterError(f"v100b: iperf3 said {HOSTILE}")

    monkeypatch.setattr(session.predict, "for_run", refused)
    console, out = terminal()
    assert session.network_check(RUN, HOSTS, accept=False, console=console) is None
    shown = out.getvalue()
    assert "network check skipped: v100b: iperf3 said oops [/] [bold]x" in shown
    assert "\x1b[2J" not in shown and "\x07" not in shown and "\x1bc" not in shown
