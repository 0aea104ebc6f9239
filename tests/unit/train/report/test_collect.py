"""`fab report`'s collection: what could not be fetched is said per host, and only that."""

from __future__ import annotations

from types import SimpleNamespace

from train.cluster import GroupResult, Host, HostResult
from train.report import collect


def test_each_host_that_could_not_give_its_files_is_named_with_why(monkeypatch, tmp_path):
    hosts = [Host("v100a", "10.0.0.1"), Host("v100b", "10.0.0.2"), Host("v100c", "10.0.0.3")]
    run = SimpleNamespace(local_dir=tmp_path / "r1", members=[], hosts=["v100a", "v100b", "v100c"],
                          hosts_of=lambda hs: hs)
    monkeypatch.setattr(collect, "REPORTS", tmp_path)
    monkeypatch.setattr(collect, "on_each", lambda hs, work: GroupResult({
        "v100a": HostResult("v100a", exited=0, value=None),  # everything fetched
        "v100b": HostResult("v100b", exited=0, value="missing /data/tandem/runs/r1/samples.jsonl"),
        "v100c": HostResult("v100c", error=OSError("No route to host"))}))
    assert collect.collect(run, hosts) == {"v100b": "missing /data/tandem/runs/r1/samples.jsonl",
                                           "v100c": "unreachable (No route to host)"}
