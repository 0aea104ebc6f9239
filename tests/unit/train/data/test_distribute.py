"""A dataset on every host: a copy that does not match its manifest, or a host lost after the copy, is named."""

from __future__ import annotations

import subprocess

import pytest

from train.cluster import ClusterError, GroupResult, Host, HostResult
from train.data import distribute

HOSTS = [Host("v100a", "10.0.0.1"), Host("v100b", "10.0.0.2"), Host("v100c", "10.0.0.3")]


def copied(monkeypatch, answers: GroupResult) -> None:
    monkeypatch.setattr(distribute.subprocess, "run",
                        lambda argv, **kw: subprocess.CompletedProcess(argv, 0, "", ""))  # rsync
    monkeypatch.setattr(distribute, "run_all", lambda hosts, command: answers)


def test_every_host_holds_the_same_dataset(monkeypatch, tmp_path):
    copied(monkeypatch, GroupResult((h.name, HostResult(h.name, stdout="ab12  MANIFEST.sha256\n", exited=0))
                                    for h in HOSTS))
    assert distribute.upload(tmp_path, "synthetic", HOSTS) == {"v100a": "ab12", "v100b": "ab12", "v100c": "ab12"}


def test_a_mismatch_and_a_lost_host_are_named(monkeypatch, tmp_path):
    copied(monkeypatch, GroupResult({
        "v100a": HostResult("v100a", stdout="ab12  MANIFEST.sha256\n", exited=0),
        "v100b": HostResult("v100b", error=OSError("No route to host")),
        "v100c": HostResult("v100c", stdout="train.en-de.en.bin: FAILED\n", exited=1)}))
    with pytest.raises(ClusterError) as err:
        distribute.upload(tmp_path, "synthetic", HOSTS)
    assert str(err.value).splitlines() == [
        "dataset not on every host:",
        "  v100b: unreachable after the copy: No route to host",
        "  v100c: the copy in /data/tandem/datasets/synthetic/ does not match its manifest: "
        "train.en-de.en.bin: FAILED"]
