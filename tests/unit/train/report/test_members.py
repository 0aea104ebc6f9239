"""The run's membership history (Run.members) in the report: the table, the answer and the marks on
the plots, from hand-made members lists (the shape train.run.elastic writes, old and new)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import matplotlib.pyplot as plt
import pytest

from train.report import answers as A
from train.report import members, plots
from train.report.page import build_report
from train.report.series import Interval

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "report"

START = {"hosts": ["v100a", "v100b", "v100c"], "from_update": 0, "why": "start"}
LOST_C = {"hosts": ["v100a", "v100b"], "from_update": 1200, "why": "v100c lost at update 1240 (unreachable)"}
LOST_B = {"hosts": ["v100a"], "from_update": 2000, "why": "v100b lost at update 2050 (killed by SIGKILL)",
          "lost": ["v100b"], "lost_at": 2050, "time": 1795400000.0}
BACK = {"hosts": ["v100a", "v100b", "v100c"], "from_update": 3000, "why": "v100b, v100c rejoined"}
HISTORY = [START, LOST_C, LOST_B, BACK]


def test_spans_say_which_hosts_trained_from_which_update_to_which():
    got = [(s.hosts, s.first, s.last, s.ended) for s in members.spans(HISTORY, last_update=4000)]
    assert got == [
        (["v100a", "v100b", "v100c"], 0, 1240, "v100c lost at 1,240"),
        (["v100a", "v100b"], 1200, 2050, "v100b lost at 2,050"),
        (["v100a"], 2000, 3000, "v100b, v100c rejoined at 3,000"),
        (["v100a", "v100b", "v100c"], 3000, 4000, None),
    ]


def test_changes_parse_the_old_entries_and_read_the_new_fields():
    found = members.changes(HISTORY)
    assert [(c.kind, c.update, c.resumed, c.hosts, c.how) for c in found] == [
        ("lost", 1240, 1200, ["v100c"], "unreachable"),
        ("lost", 2050, 2000, ["v100b"], "killed by SIGKILL"),
        ("joined", 3000, 3000, ["v100b", "v100c"], None),
    ]
    assert found[1].time == 1795400000.0 and found[0].time is None
    assert members.redone(HISTORY) == 40 + 50
    # a loss written before `lost` existed, with a thousands separator and no cause
    odd = [START, {"hosts": ["v100a"], "from_update": "900", "why": "v100b, v100c lost at update 1,000"}]
    assert [(c.label, c.resumed, c.how) for c in members.changes(odd)] == [("v100b, v100c lost at 1,000", 900, None)]
    # an entry that says nothing parseable: the hosts that left are lost at the update it went on from
    bare = [START, {"hosts": ["v100a", "v100b"], "from_update": 50}]
    assert members.changes(bare)[0].label == "v100c lost at 50"


def test_a_run_that_kept_its_hosts_has_nothing_to_say():
    assert members.changes([]) == [] and members.changes(None) == [] and members.changes([START]) == []
    assert members.describe([START], 300) is None
    assert members.spans(None) == []


def test_the_sentence_names_every_span_and_change():
    text = members.describe(HISTORY[:2], 2000)
    assert text == ("v100a, v100b, v100c from update 0 to 1,240; v100a, v100b from update 1,200 to 2,000 "
                    "(1 change: v100c lost at 1,240 (unreachable), went on from 1,200; 40 updates trained again)")


def iv(update, updates, step, end):
    return Interval(update, updates, step, end - updates * step, end, None, None, None)


def test_the_time_of_a_change_is_when_its_update_was_first_reached():
    # updates 0..100 from t=1000 at 1 s/update, lost at 130, resumed from 100 at t=1200
    ivs = [iv(50, 50, 1.0, 1050), iv(100, 50, 1.0, 1100), iv(150, 50, 1.0, 1260)]
    lost = members.Change(130, "v100b lost at 130", "lost", ["v100b"], 100, None, None)
    # no time known: the first interval that covers update 130 (here the one after the restart)
    assert members.time_of_change(lost, ivs) == pytest.approx(1240)
    # tandem acted at t=1180: only the intervals before it count, and the pace carries on from the last
    known = members.Change(130, "v100b lost at 130", "lost", ["v100b"], 100, None, 1180.0)
    assert members.time_of_change(known, ivs) == pytest.approx(1130)
    assert members.time_of_change(known, []) == 1180.0
    assert members.time_of_change(lost, []) is None


def analysis(run_members) -> A.Analysis:
    data = A.from_texts({"run_id": "r", "hosts": ["v100a"], "preset": "tiny", "members": run_members}, {}, {})
    ivs = [iv(u, 10, 0.5, 1000 + u * 0.5) for u in range(10, 210, 10)]
    return A.Analysis(data, ivs, [])


def test_the_plots_mark_each_change_with_a_labelled_line():
    fig, ax = plt.subplots()
    drawn = plots.mark_changes(ax, analysis(HISTORY[:3]))
    assert drawn == [(1240, "v100c lost at 1,240"), (2050, "v100b lost at 2,050")]
    assert [line.get_xdata()[0] for line in ax.get_lines()] == [1240, 2050]
    assert [t.get_text() for t in ax.texts] == ["v100c lost at 1,240", "v100b lost at 2,050"]
    assert len(ax.patches) == 2  # the updates trained again, shaded
    plt.close(fig)
    # on a time axis: minutes since t0 at which the update was reached
    small = [START, {"hosts": ["v100a"], "from_update": 100, "why": "v100b lost at update 120 (unreachable)"}]
    fig, ax = plt.subplots()
    (x, label), = plots.mark_changes(ax, analysis(small), t0=1000)
    assert label == "v100b lost at 120" and x == pytest.approx(60 / 60)  # update 120 at t=1060
    plt.close(fig)
    fig, ax = plt.subplots()
    assert plots.mark_changes(ax, analysis([START])) == [] and not ax.get_lines()
    plt.close(fig)


@pytest.fixture(scope="module")
def changed_report(tmp_path_factory) -> Path:
    """The real 2-host lab run (stopped at update 230) told that v100b was lost at 170 and the run
    went on from 150 on v100a."""
    run_dir = tmp_path_factory.mktemp("members") / "run"
    shutil.copytree(FIXTURES / "run-081616", run_dir)
    run = json.loads((run_dir / "run.json").read_text())
    run["members"] = [{"hosts": ["v100a", "v100b"], "from_update": 0, "why": "start"},
                      {"hosts": ["v100a"], "from_update": 150, "why": "v100b lost at update 170 (unreachable)"}]
    (run_dir / "run.json").write_text(json.dumps(run))
    build_report(run_dir, link_mbps=100)
    return run_dir


def test_the_report_has_the_membership_table_and_answer(changed_report):
    answers = {a["key"]: a for a in json.loads((changed_report / "answers.json").read_text())["answers"]}
    hosts = answers["members"]
    assert hosts["verdict"] == "changed"
    assert hosts["numbers"]["changes"] == ["v100b lost at 170"]
    assert hosts["numbers"]["redone_updates"] == 20
    assert [(s["hosts"], s["from_update"], s["to_update"]) for s in hosts["numbers"]["spans"]] == [
        (["v100a", "v100b"], 0, 170), (["v100a"], 150, 230)]
    page = (changed_report / "index.html").read_text()
    assert "Membership (which hosts trained when)" in page
    assert "<td>v100a, v100b</td><td>0</td><td>170</td><td>start</td><td>v100b lost at 170</td>" in page
    assert "<td>v100a</td><td>150</td><td>230</td>" in page
    assert page.count("Dash-dotted orange lines") == 4  # loss, step time, words/s, timeline


def test_a_run_that_kept_its_hosts_has_no_membership_section(tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(FIXTURES / "run-081616", run_dir)
    build_report(run_dir, link_mbps=100)
    page = (run_dir / "index.html").read_text()
    assert "Membership" not in page and "Dash-dotted" not in page
    keys = [a["key"] for a in json.loads((run_dir / "answers.json").read_text())["answers"]]
    assert "members" not in keys


def test_the_terminal_summary_names_the_changes(changed_report):
    lines = build_report(changed_report, link_mbps=100)[1]
    assert "hosts changed: v100b lost at 170" in lines


def test_a_run_whose_rank_0s_host_was_lost_reads_each_rank_0s_log_in_turn(tmp_path):
    """The real resumed log cut where it restarted: v100a was rank 0 for updates 1–20, v100b (its
    own rank-1 warnings first) after the restart from 20. The report's progress is both."""
    lines = (FIXTURES / "resumed-084104-v100a.log").read_text().splitlines()
    cut = next(i for i, line in enumerate(lines) if i > 30 and "| fairseq_cli.train | {'_name'" in line)
    warning = "2026-11-22 08:41:45 | WARNING | fairseq.trainer | rank 1's own words, not progress"
    texts = {"v100a": lines[:cut], "v100b": [warning, *lines[cut:]]}
    run = {"run_id": "r", "hosts": ["v100b"], "preset": "tiny", "overrides": ["max_update=40"],
           "members": [{"hosts": ["v100a", "v100b"], "from_update": 0, "why": "start"},
                       {"hosts": ["v100b"], "from_update": 20, "why": "v100a lost at update 25 (unreachable)"}]}
    an = A.analyze(A.from_texts(run, texts, {}))
    assert [(iv.update, iv.updates) for iv in an.intervals] == [(10, 10), (20, 10), (30, 10), (40, 10)]
    assert an.get("duration").numbers["restarts"] == 1
    assert "from the first to the last line of v100a's then v100b's log" in an.get("duration").answer
    assert an.get("members").numbers["changes"] == ["v100a lost at 25"]
    # without the lost host's log (not collected): what v100b logged, from the restart on
    alone = A.analyze(A.from_texts(run, {"v100b": texts["v100b"]}, {}))
    assert [iv.update for iv in alone.intervals] == [30, 40]
    # a run that kept rank 0 on its host reads that host's log alone, as before
    kept = {**run, "hosts": ["v100a"], "members": [run["members"][0], {"hosts": ["v100a"], "from_update": 20,
                                                                       "why": "v100b lost at update 25"}]}
    assert [iv.update for iv in A.analyze(A.from_texts(kept, texts, {})).intervals] == [10, 20]


def test_a_line_is_not_drawn_back_across_the_redone_updates():
    points = [(10, 1.0), (20, 1.0), (30, 1.0), (20, 2.0), (30, 2.0), (40, 2.0)]
    assert plots.segments(points) == [points[:3], points[3:]]
    assert plots.segments([]) == []
