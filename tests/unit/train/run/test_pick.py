"""Following a run from anywhere: a checkout that did not start a run (an empty reports/) finds it on the
hosts, `latest` there being the run the hosts started last, and `fab stop` acts on it; a checkout whose
latest is an older run (a teammate started a newer one since) acts on the hosts' newer run and says so.
The hosts' answers are recorded as `fab train` leaves them (its record line and the listing run in a real
shell on a directory standing for /data/tandem/runs); no lab."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import asdict

import pytest

from train.cluster import ClusterError, GroupResult, Host, HostResult
from train.errors import OptionError
from train.hosts import paths
from train.recipe import record
from train.recipe.record import Run
from train.run import launch, pick

HOSTS = [Host(name="v100a", address="10.0.0.11"), Host(name="v100b", address="10.0.0.12")]
OLDER = Run(run_id="run-20261125-090000", hosts=["v100a", "v100b"], preset="tiny", overrides=[], dataset="synthetic")
NEWER = Run(run_id="run-20261126-080102", hosts=["v100b", "v100a"], preset="transformer_vaswani_wmt_en_de_big",
            overrides=["max_update=300000"], dataset="wmt16", precision="fp16", link_mbps=9400.0,
            order=["v100b", "v100a"])


def line(run: Run, started: int, with_record: bool = True) -> str:
    """One line of a host's listing, as `pick.listing()` prints it."""
    return f"{run.run_id}\t{started}\t{json.dumps(asdict(run)) if with_record else ''}\n"


# what each host answered: both know both runs; the newer started last (its spec is newer)
ANSWERS = {"v100a": line(OLDER, 1795600000) + line(NEWER, 1795680062),
           "v100b": line(NEWER, 1795680062) + line(OLDER, 1795600000)}


@pytest.fixture
def second_checkout(tmp_path, monkeypatch):
    """A checkout that started no run: reports/ empty."""
    monkeypatch.setattr(record, "REPORTS", tmp_path / "reports")
    (tmp_path / "reports").mkdir()
    return tmp_path / "reports"


def answered(monkeypatch, answers: dict[str, str | Exception]) -> list[str]:
    """The hosts answer the listing as recorded (an exception: that host did not answer); the commands sent."""
    sent = []

    def run_all(hosts, command, **kwargs):
        sent.append(command)
        return GroupResult((h.name, HostResult(h.name, error=answers[h.name]) if isinstance(answers[h.name], Exception)
                            else HostResult(h.name, stdout=answers[h.name], exited=0)) for h in hosts)

    monkeypatch.setattr(pick, "run_all", run_all)
    return sent


def test_latest_on_a_checkout_without_runs_is_the_run_the_hosts_started_last(second_checkout, monkeypatch):
    answered(monkeypatch, ANSWERS)
    said = []
    run = pick.find(None, HOSTS, said.append)
    assert run == NEWER
    assert said == ["run-20261126-080102 found on the hosts (started from another controller): its record copied "
                    "to reports/run-20261126-080102"]
    assert Run.load(None) == NEWER  # copied, and the latest here now: the next task says nothing more
    sent = answered(monkeypatch, ANSWERS)
    assert pick.find(None, HOSTS, said.append) == NEWER and len(sent) == 1 and len(said) == 1


def test_a_named_run_is_found_on_the_hosts_and_fab_stop_acts_on_it(second_checkout, monkeypatch):
    answered(monkeypatch, ANSWERS)
    run = pick.find("run-20261125-090000", HOSTS, lambda _: None)
    assert run == OLDER and (second_checkout / OLDER.run_id / "run.json").exists()
    # fab stop: the keeper and ranks of that run's directory stopped on its hosts, in rank order
    stopped = []

    def run_all(hosts, command, **kwargs):
        stopped.append(([h.name for h in hosts], command))
        return GroupResult((h.name, HostResult(h.name, stdout="stopped\n", exited=0)) for h in hosts)

    monkeypatch.setattr(launch, "run_all", run_all)
    assert launch.stop(run, run.hosts_of(HOSTS)) == {"v100a": "stopped", "v100b": "stopped"}
    [(names, command)] = stopped
    assert names == ["v100a", "v100b"] and "keeper.loop stop --run /data/tandem/runs/run-20261125-090000" in command


def test_a_run_this_controller_holds_by_name_asks_no_host(second_checkout, monkeypatch):
    OLDER.save()
    sent = answered(monkeypatch, ANSWERS)
    assert pick.find(OLDER.run_id, HOSTS, pytest.fail) == OLDER
    assert not sent


def test_a_teammates_newer_run_is_acted_on_and_said_in_one_line(second_checkout, monkeypatch):
    """This checkout followed OLDER once; a teammate started NEWER since: `fab stop` must not stop OLDER."""
    OLDER.save()
    sent = answered(monkeypatch, ANSWERS)
    said = []
    assert pick.find(None, HOSTS, said.append) == NEWER and len(sent) == 1
    assert said == ["reports/latest is run-20261125-090000; the hosts started run-20261126-080102 since: acting on "
                    "run-20261126-080102 (--run run-20261125-090000 for the other; its record copied to "
                    "reports/run-20261126-080102)"]
    assert Run.load(None) == NEWER and Run.load(OLDER.run_id) == OLDER  # the latest here now; the old one kept


def test_this_checkouts_latest_is_acted_on_when_it_is_the_hosts_newest(second_checkout, monkeypatch):
    mine = Run(**{**asdict(NEWER), "members": [{"hosts": ["v100b", "v100a"], "from_update": 0}]})  # followed here
    mine.save()
    sent = answered(monkeypatch, ANSWERS)
    assert pick.find(None, HOSTS, pytest.fail) == mine and len(sent) == 1


def test_no_host_answering_leaves_this_checkouts_latest(second_checkout, monkeypatch):
    OLDER.save()
    answered(monkeypatch, {h.name: ConnectionRefusedError("refused") for h in HOSTS})
    assert pick.find(None, HOSTS, pytest.fail) == OLDER


def test_a_run_started_here_that_the_hosts_do_not_hold_counts_from_when_it_was_made(second_checkout, monkeypatch):
    """Its record did not reach the hosts (or --hosts names others): older than their newest start only if it is."""
    answered(monkeypatch, ANSWERS)
    later = Run(**{**asdict(OLDER), "run_id": "run-20261127-000000", "created": "2026-11-27T00:00:00+00:00"})
    later.save()
    assert pick.find(None, HOSTS, pytest.fail) == later
    before = Run(**{**asdict(OLDER), "run_id": "run-20261101-000000", "created": "2026-11-01T00:00:00+00:00"})
    before.save()
    said = []
    assert pick.find(None, HOSTS, said.append) == NEWER and said[0].startswith("reports/latest is run-20261101-000000;")


def test_one_host_answering_is_enough(second_checkout, monkeypatch):
    answered(monkeypatch, {"v100a": ConnectionRefusedError("refused"), "v100b": ANSWERS["v100b"]})
    assert pick.find(None, HOSTS, lambda _: None).run_id == NEWER.run_id


def test_no_host_answering_says_so_in_one_line(second_checkout, monkeypatch):
    answered(monkeypatch, {h.name: ConnectionRefusedError("refused") for h in HOSTS})
    with pytest.raises(ClusterError) as err:
        pick.find(None, HOSTS, print)
    said = str(err.value)
    assert said.startswith("no run (latest) on this controller, and no host could be asked for it: unreachable: "
                           "v100a (refused); v100b (refused): check that each VM runs")
    assert "\n" not in said


def test_a_run_no_one_knows_is_bad_input_naming_what_the_hosts_know(second_checkout, monkeypatch):
    answered(monkeypatch, {"v100a": ANSWERS["v100a"], "v100b": ConnectionRefusedError("refused")})
    with pytest.raises(OptionError, match=r"^--run: no run run-typo on this controller nor on v100a \(v100b did not "
                                          r"answer\): the hosts know run-20261126-080102, run-20261125-090000$"):
        pick.find("run-typo", HOSTS, print)
    answered(monkeypatch, {"v100a": "", "v100b": ""})
    with pytest.raises(ClusterError, match=r"^no run on this controller nor on v100a, v100b: start one with "):
        pick.find(None, HOSTS, print)


def test_a_run_whose_hosts_hold_no_record_says_where_to_follow_it(second_checkout, monkeypatch):
    """A run started by a tandem that left its record only on its controller: only the keepers' spec there."""
    answered(monkeypatch, {h.name: line(OLDER, 1795600000, with_record=False) for h in HOSTS})
    with pytest.raises(ClusterError, match="run-20261125-090000 is on v100a, v100b, without a run record there"):
        pick.find(None, HOSTS, print)


def test_the_newest_copy_of_a_run_speaks_for_it():
    """A run started again later (on one host that came back, say): that start's time and record count."""
    grown = Run(**{**asdict(OLDER), "hosts": ["v100a", "v100b", "v100c"]})
    runs = pick.known_runs({"v100a": line(OLDER, 1795600000) + line(NEWER, 1795680062),
                            "v100c": line(grown, 1795700000) + "garbage\nrun-x\tnot-a-time\t{not json\n"})
    assert [r.run_id for r in runs] == [OLDER.run_id, NEWER.run_id, "run-x"]
    assert runs[0].record == asdict(grown) and runs[0].hosts == ("v100c", "v100a")
    assert runs[2].record is None


def test_what_fab_train_leaves_on_a_host_is_what_the_listing_reads(tmp_path, monkeypatch):
    """record_line and listing in a real shell, on a directory standing for /data/tandem/runs: a run with
    its record and spec, one with the keepers' spec alone, and a directory of neither."""
    monkeypatch.setattr(paths, "RUNS_ROOT", str(tmp_path / "runs"))
    subprocess.run(["sh", "-c", pick.record_line(NEWER)], check=True)
    for run_id in (NEWER.run_id, OLDER.run_id):
        (tmp_path / "runs" / run_id / "keeper").mkdir(parents=True, exist_ok=True)
        (tmp_path / "runs" / run_id / "keeper" / "spec.json").write_text(json.dumps({"run_id": run_id}))
    os.utime(tmp_path / "runs" / OLDER.run_id / "keeper" / "spec.json", (1795600000, 1795600000))
    (tmp_path / "runs" / "lost+found").mkdir()
    listed = subprocess.run(["sh", "-c", pick.listing()], check=True, capture_output=True, text=True).stdout
    runs = pick.known_runs({"v100b": listed})
    assert [(r.run_id, r.record) for r in runs] == [(NEWER.run_id, asdict(NEWER)), (OLDER.run_id, None)]
    assert runs[1].started == 1795600000
    assert not list((tmp_path / "runs" / NEWER.run_id).glob("*.new"))
    monkeypatch.setattr(paths, "RUNS_ROOT", str(tmp_path / "none"))  # a host that never trained
    assert subprocess.run(["sh", "-c", pick.listing()], check=True, capture_output=True, text=True).stdout == ""


def test_fab_train_resumes_the_run_the_hosts_started_last(second_checkout, monkeypatch):
    """`fab train` without --new or --run reads reports/latest: the hosts' newest run becomes it first."""
    OLDER.save()
    answered(monkeypatch, ANSWERS)
    said = []
    pick.resumable(HOSTS, said.append)
    assert Run.load(None) == NEWER and said[0].startswith("reports/latest is run-20261125-090000; the hosts started")
    (second_checkout / "latest").unlink()  # a checkout that never ran: the hosts' run, said so
    pick.resumable(HOSTS, said.append)
    assert Run.load(None) == NEWER and said[1].startswith("run-20261126-080102 found on the hosts")


def test_fab_train_starts_a_run_where_no_one_knows_one(second_checkout, monkeypatch):
    answered(monkeypatch, {"v100a": "", "v100b": ConnectionRefusedError("refused")})
    pick.resumable(HOSTS, pytest.fail)
    assert not pick.here(None)
