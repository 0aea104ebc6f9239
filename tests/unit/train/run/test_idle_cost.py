"""What a run has cost and what the idle cluster costs (`fab status`, the report): hosts × hours ×
the inventory's price, restarts included; never a guessed price; the command that stops paying."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from train.cluster import Host
from train.recipe.record import Run
from train.report import answers
from train.run import idle

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)


def run_of(hosts, members=()) -> Run:
    return Run(run_id="r", hosts=list(hosts), preset="tiny", overrides=[], dataset="synthetic",
               members=list(members), created=(NOW - timedelta(hours=10)).isoformat())


def inventory(price=3.06, **extra) -> list[Host]:
    return [Host(name=n, address=n, vars={"hourly_usd": price, **extra} if price is not None else dict(extra))
            for n in ("v100a", "v100b")]


def test_an_idle_cluster_says_for_how_long_what_it_costs_and_how_to_stop_paying():
    cost = idle.cost(run_of(["v100a", "v100b"]), inventory(), running=False,
                     ages={"v100a": 7200.0, "v100b": 7300.0}, now=NOW)
    assert cost.idle_s == 7200.0  # since the newest write of any host
    assert cost.billed_hours == pytest.approx(8.0)  # created 10 h ago, ended 2 h ago
    assert cost.run_usd == pytest.approx(2 * 8.0 * 3.06)
    assert cost.usd_per_hour == pytest.approx(6.12)
    text = "\n".join(cost.lines())
    assert "cost so far: $48.96 (2 hosts × 8.00 h" in text
    assert "idle 2.0 h" in text and "$6.12/h" in text and "aws ec2 stop-instances" in text


def test_a_running_run_is_billed_to_now_and_is_not_idle():
    cost = idle.cost(run_of(["v100a", "v100b"]), inventory(), running=True, now=NOW)
    assert cost.idle_s is None and cost.billed_hours == pytest.approx(10.0)
    assert not any("idle" in line for line in cost.lines())


def test_a_host_the_run_lost_is_billed_too():
    members = [{"hosts": ["v100a", "v100b"], "from_update": 0}, {"hosts": ["v100a"], "from_update": 500}]
    cost = idle.cost(run_of(["v100a"], members), inventory(price=1.0), running=True, now=NOW)
    assert cost.hosts == ["v100a", "v100b"] and cost.run_usd == pytest.approx(20.0)
    assert cost.usd_per_hour == 1.0  # idling costs only the hosts still in the run


def test_no_price_no_dollars_and_the_inventory_stop_command_wins():
    cost = idle.cost(run_of(["v100a", "v100b"]), inventory(price=None, stop_command="gcloud compute instances stop x"),
                     running=False, ages={"v100a": 60.0}, now=NOW)
    assert cost.run_usd is None and cost.usd_per_hour is None
    text = "\n".join(cost.lines())
    assert "no hourly_usd in the inventory for v100a, v100b" in text
    assert "v100a: `gcloud compute instances stop x`" in text and "aws" not in text


def test_the_report_answers_the_cost_from_what_fab_report_collected(tmp_path):
    cost = idle.cost(run_of(["v100a", "v100b"]), inventory(), running=False, ages={"v100a": 3600.0}, now=NOW)
    (tmp_path / "cost.json").write_text(json.dumps(cost.as_dict()))
    data = answers.from_texts({"run_id": "r", "hosts": ["v100a", "v100b"], "preset": "tiny"}, {}, {},
                              run_dir=tmp_path)
    got = answers.answer_cost(data)
    assert got.answer.startswith("$55.08: 2 host(s) × 9.00 h") and "$6.12/h" in got.answer
    assert answers.answer_cost(answers.from_texts({"run_id": "r", "hosts": [], "preset": "tiny"}, {}, {},
                                                  run_dir=tmp_path / "none")) is None
