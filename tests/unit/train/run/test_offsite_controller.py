"""The controller's side of copies off the cluster (train.run.offsite): the hosts' checks (the real
`python -m train.agent.offsite.upload check` run here, as on a host) turned into one refusal naming each host,
what failed and the fix; the run's target chosen and told to the keepers without a secret; `fab status`'s
line of the newest copy."""

from __future__ import annotations

import subprocess
import sys

import pytest

from train.cluster import HostResult
from train.errors import OptionError
from train.recipe.record import Run
from train.run import keepers, offsite


def checked_here(url: str, host: str) -> HostResult:
    """The check as a host answers it: its stdout and exit status."""
    done = subprocess.run([sys.executable, "-m", "train.agent.offsite.upload", "check", url, "--host", host],
                          capture_output=True, text=True, timeout=120)
    return HostResult(host, stdout=done.stdout, stderr=done.stderr, exited=done.returncode)


def run_record(**kw) -> Run:
    return Run(run_id="r1", hosts=["v100a", "v100b"], preset="tiny", overrides=[], dataset="synthetic", **kw)


def test_each_host_that_cannot_write_the_target_is_named_with_what_failed_and_the_fix(tmp_path):
    share = tmp_path / "share"
    share.mkdir()
    answers = {"v100a": checked_here(str(share), "v100a"), "v100b": checked_here(str(tmp_path / "gone"), "v100b"),
               "v100c": HostResult("v100c", error=ConnectionRefusedError("[Errno 111] Connection refused"))}
    said = offsite.problems(answers, str(tmp_path / "gone"))
    assert len(said) == 2  # v100a wrote, read back and deleted
    assert said[0].startswith(f"v100b: {tmp_path / 'gone'}: no such directory on v100b")
    assert "mount the share on v100b" in said[0]
    assert said[1].startswith("v100c: unreachable")


def test_a_run_keeps_its_target_tells_the_keepers_and_refuses_an_interval_without_one():
    run = run_record()
    offsite.choose(run, "s3://ckpts/runs/", 15)
    assert (run.checkpoints_to, offsite.told(run)) == ("s3://ckpts/runs", {"url": "s3://ckpts/runs", "every_s": 900})
    offsite.choose(run, None, None)  # a resume without the option: its own
    assert run.checkpoints_to == "s3://ckpts/runs"
    offsite.choose(run, "off", None)
    assert offsite.told(run) is None
    with pytest.raises(OptionError, match="--checkpoints-every: .*--checkpoints-to"):
        offsite.choose(run, None, 10)
    with pytest.raises(OptionError, match="--checkpoints-to: .*password") as refused:
        offsite.choose(run, "sftp://u:hunter2@h/p", None)
    assert "hunter2" not in str(refused.value)


def test_the_keepers_spec_carries_the_url_alone(monkeypatch):
    from train.cluster import Host

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "never-in-a-spec")
    run = run_record(checkpoints_to="s3://ckpts/runs", checkpoints_every_min=30)
    hosts = [Host(name=n, address="127.0.0.1", vars={"tandem_venv": "/opt/tandem/venv"}) for n in run.hosts]
    told = keepers.spec(run, hosts)
    assert told["offsite"] == {"url": "s3://ckpts/runs", "every_s": 1800}
    assert "never-in-a-spec" not in str(told)


class State:
    def __init__(self, name, offsite_said, reachable=True):
        self.name, self.reachable, self.keeper = name, reachable, {"offsite": offsite_said}


def test_status_says_the_newest_copy_its_age_and_where():
    run = run_record(checkpoints_to="s3://ckpts/runs")
    newest = {"kind": "last", "update": 1200, "time": 1000.0, "where": "s3://ckpts/runs/r1/u1200"}
    states = [State("v100a", {"newest": newest, "error": "", "uploading": [1400]}),
              State("v100b", {"newest": None, "error": "", "uploading": []})]
    assert offsite.status_line(run, states, now=1000.0 + 600) == (
        "newest copy off the cluster: update 1,200, 10 min ago, s3://ckpts/runs/r1/u1200; v100a uploading update 1,400")
    assert offsite.status_line(run, states[1:]) == "no copy off the cluster yet"
    assert offsite.status_line(run_record(), states[1:]) is None  # a run without a target: nothing said


def test_status_json_carries_the_newest_copy_its_age_and_where():
    import json

    from train.run.launch import HostState
    from train.run.status import status_json

    run = run_record(checkpoints_to="s3://ckpts/runs")
    newest = {"kind": "last", "update": 1200, "time": 1000.0, "where": "s3://ckpts/runs/r1/u1200"}
    states = [HostState("v100a", True, True, None, [], keeper={"offsite": {"newest": newest, "error": "",
                                                                             "uploading": [1400], "closing": False}}),
              HostState("v100b", True, True, None, [], keeper={"offsite": {"newest": None, "error": "",
                                                                             "uploading": []}})]
    said = json.loads(status_json(run, states))["offsite"]
    assert said["newest"]["update"] == 1200 and said["newest"]["where"] == "s3://ckpts/runs/r1/u1200"
    assert said["newest"]["age_s"] > 0 and said["uploading"] == {"v100a": 1400}
    assert json.loads(status_json(run_record(), states[1:]))["offsite"] is None


def test_fab_stop_says_where_the_newest_copy_is_or_that_the_final_one_still_uploads():
    run = run_record(checkpoints_to="s3://ckpts/runs")
    newest = {"kind": "last", "update": 1200, "time": 1000.0, "where": "s3://ckpts/runs/r1/u1200"}
    done = [State("v100a", {"newest": newest, "error": "", "uploading": [], "closing": False})]
    assert offsite.stop_line(run, done, now=1003.0) == ("newest copy off the cluster: update 1,200, 3 s ago, "
                                                        "s3://ckpts/runs/r1/u1200")
    going = [State("v100a", {"newest": newest, "error": "", "uploading": [1400], "closing": True})]
    assert offsite.stop_line(run, going, now=1003.0) == (
        "newest copy off the cluster: update 1,200, 3 s ago, s3://ckpts/runs/r1/u1200; v100a uploading update "
        "1,400; the final copy is still uploading (the VMs must stay until it is done): `fab status` says when it is")
    assert offsite.after_stop(run_record(), []) is None  # a run without a target asks no host
