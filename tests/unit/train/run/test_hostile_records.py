"""A run record read from a host or a bucket is taken as user input: its run_id and dataset by the CLI's own
name pattern, its run_id equal to its folder's name, else refused in one line naming the host (or the
bucket's URL), what was expected and what was found; every remote path built from a run id is quoted
(issue 54: a host's run.json naming `zz;touch${IFS}PWNED;#` ran that on every host at `fab status`)."""

from __future__ import annotations

import io
import json
import shlex
from dataclasses import asdict

import pytest
from rich.console import Console

from train.cli import options
from train.cluster import ClusterError, GroupResult, Host, HostResult
from train.recipe import record
from train.recipe.record import Run
from train.run import checkpoints, idle, keepers, launch, moved, pick, status

HOSTS = [Host(name="v100a", address="10.0.0.11"), Host(name="v100b", address="10.0.0.12")]
GOOD = Run(run_id="run-20261126-080102", hosts=["v100a", "v100b"], preset="tiny", overrides=[], dataset="synthetic")
INJECTION = "zz;touch${IFS}PWNED;#"
NEW = [Host(name="h100a", address="10.1.0.11", vars={"gpus": 8})]


@pytest.fixture
def reports(tmp_path, monkeypatch):
    monkeypatch.setattr(record, "REPORTS", tmp_path / "reports")
    (tmp_path / "reports").mkdir()
    return tmp_path / "reports"


def listed(folder: str, held: dict) -> dict[str, str]:
    """v100b's listing: one folder with that record (v100a holds nothing)."""
    return {"v100a": "", "v100b": f"{folder}\t1795680062\t{json.dumps(held)}\n"}


def hosts_answer(monkeypatch, answers: dict[str, str]) -> None:
    monkeypatch.setattr(pick, "run_all", lambda hosts, command, **_: GroupResult(
        (h.name, HostResult(h.name, stdout=answers[h.name], exited=0)) for h in hosts))


@pytest.mark.parametrize(("folder", "held", "found"), [
    (INJECTION, {**asdict(GOOD), "run_id": INJECTION}, repr(INJECTION)),
    ("x", {**asdict(GOOD), "run_id": "../../x"}, "'../../x'"),
    (GOOD.run_id, {**asdict(GOOD), "run_id": "run-other"}, "'run-other'"),  # another run's record in this folder
    (GOOD.run_id, {**asdict(GOOD), "dataset": "../../../etc"}, "'../../../etc'"),
    (GOOD.run_id, {**asdict(GOOD), "dataset": "wmt16;reboot"}, "'wmt16;reboot'"),
    (GOOD.run_id, {**asdict(GOOD), "run_id": 7}, "7"),
])
def test_a_hostile_record_on_a_host_is_refused_naming_the_host_and_nothing_is_written(reports, monkeypatch,
                                                                                      folder, held, found):
    hosts_answer(monkeypatch, listed(folder, held))
    with pytest.raises(ClusterError) as refused:
        pick.find(None, HOSTS, print)
    said = str(refused.value)
    assert said.startswith("v100b: ") and "\n" not in said
    assert "expected" in said and f"found {found}" in said
    assert not any(reports.iterdir())  # no record copied, no `latest`
    assert not (reports.parent / "x").exists()


def test_a_record_whose_id_is_not_its_folders_says_both(reports, monkeypatch):
    hosts_answer(monkeypatch, listed(GOOD.run_id, {**asdict(GOOD), "run_id": "run-other"}))
    with pytest.raises(ClusterError, match=r"^v100b: /data/tandem/runs/run-20261126-080102/run.json refused: run_id "
                                           r"expected 'run-20261126-080102' \(its folder's name\), found 'run-other'"):
        pick.find(None, HOSTS, print)


def test_a_good_record_is_still_found(reports, monkeypatch):
    hosts_answer(monkeypatch, listed(GOOD.run_id, asdict(GOOD)))
    assert pick.find(None, HOSTS, lambda _: None) == GOOD


def test_the_record_pattern_is_the_clis():
    assert record.NAME.pattern == options.NAME.pattern


@pytest.mark.parametrize("run_id", ["../../x", INJECTION, "/etc", ""])
def test_a_run_never_saves_outside_reports(reports, run_id):
    with pytest.raises(ClusterError, match="expected a name of letters"):
        Run(**{**asdict(GOOD), "run_id": run_id}).save()
    assert not any(reports.iterdir()) and not (reports.parent / "x").exists()


@pytest.mark.parametrize(("copy_run", "held", "found"), [
    ("run-1", {**asdict(GOOD), "run_id": INJECTION}, repr(INJECTION)),
    ("run-1", {**asdict(GOOD), "run_id": "../../x"}, "'../../x'"),
    ("run-1", {**asdict(GOOD), "run_id": "run-2"}, "'run-2'"),
    ("run-1", {**asdict(GOOD), "run_id": "run-1", "dataset": "a b"}, "'a b'"),
])
def test_a_hostile_record_in_a_bucket_copy_is_refused_naming_the_copy(copy_run, held, found):
    copy = {"run": copy_run, "update": 10, "time": 1.0, "where": "s3://b/runs/run-1/u10"}
    with pytest.raises(ClusterError) as refused:
        moved.adopted(held, NEW, copy, "s3://b/runs")
    said = str(refused.value)
    assert said.startswith("s3://b/runs/run-1/u10/run.json refused: ") and f"found {found}" in said and "\n" not in said


def test_a_bucket_copy_naming_a_hostile_run_is_refused_before_any_host_is_asked(monkeypatch):
    monkeypatch.setattr(moved, "runs_held", lambda *_: [{"run": INJECTION, "update": 1, "time": 1.0,
                                                         "where": "s3://b/runs/x/u1", "store": "s3://b/runs"}])
    sent = []
    monkeypatch.setattr(moved, "run_all", lambda hosts, command, **_: sent.append(command))
    with pytest.raises(ClusterError, match=r"^s3://b/runs: the newest copy refused: .*found 'zz;touch"):
        moved.adopt("s3://b/runs", None, NEW, Console(file=io.StringIO()))
    assert not sent


# --- every remote path built from a run id is one shell word, whatever the id (a Run built in code)

ODD = Run(**{**asdict(GOOD), "run_id": "a b;c$(d)", "dataset": "e f;g"})


def words_of(sent: list[str]) -> list[str]:
    return [w for command in sent for w in shlex.split(command)]


def capture(monkeypatch, module) -> list[str]:
    sent = []

    def run_all(hosts, command, **_):
        sent.append(command)
        return GroupResult((h.name, HostResult(h.name, stdout="", exited=0)) for h in hosts)

    monkeypatch.setattr(module, "run_all", run_all)
    return sent


def test_idle_status_and_keepers_quote_the_run_dir(monkeypatch):
    for module, call in ((idle, lambda: idle.log_ages(ODD, HOSTS)),
                         (status, lambda: status.show_logs(ODD, HOSTS, 5, Console(file=io.StringIO()))),
                         (keepers, lambda: keepers.run_token(ODD, HOSTS)),
                         (checkpoints, lambda: checkpoints.held(ODD, HOSTS))):
        sent = capture(monkeypatch, module)
        call()
        assert sent, module.__name__
        assert any(w.startswith(ODD.remote_dir + "/") for w in words_of(sent)), (module.__name__, sent)


class Conn:
    """A Fabric connection that records what it is told to run."""

    def __init__(self, sent: list[str]):
        self.sent = sent

    def run(self, command, **_):
        self.sent.append(command)
        return HostResult("v100a", stdout='{"order": ["v100a"]}', exited=1)

    def put(self, *_):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *_):
        return False


def test_launch_collect_keepers_and_checkpoints_quote_the_run_dir_on_a_connection(monkeypatch, tmp_path):
    from train.report import collect

    sent: list[str] = []
    monkeypatch.setattr(launch, "connect", lambda host: Conn(sent))
    launch.read_log(HOSTS[0], ODD)
    monkeypatch.setattr(keepers, "connect", lambda host: Conn(sent))
    monkeypatch.setattr(keepers, "launch_keepers", lambda *_, **__: [])
    keepers.add(ODD, HOSTS[:1], HOSTS[:1])
    monkeypatch.setattr(checkpoints, "connect", lambda host: Conn(sent))
    checkpoints.fetch_checkpoints(HOSTS[0], f"{ODD.remote_dir}/checkpoints", tmp_path)
    monkeypatch.setattr(record, "REPORTS", tmp_path / "reports")
    monkeypatch.setattr(collect, "on_each", lambda hosts, fetch: GroupResult(
        (h.name, HostResult(h.name, value=fetch(h, Conn(sent)))) for h in hosts))
    collect.collect(ODD, HOSTS)
    words = words_of(sent)
    for path in (f"{ODD.remote_dir}/train.log", f"{ODD.remote_dir}/keeper/spec.json",
                 f"{ODD.remote_dir}/checkpoints/checkpoint_last.pt", f"{ODD.remote_dir}/samples.jsonl",
                 f"{ODD.remote_dir}/checkpoints", f"{ODD.data_dir}/corpus.json"):
        assert path in words, (path, sent)
