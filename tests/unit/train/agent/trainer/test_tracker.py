"""W&B through fairseq's own `--wandb-project`, its key passed from the controller's environment to the
ranks' in memory only (train.agent.trainer.tracker): what a user logging a days-long run to W&B relies on."""

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from train.agent.keeper import loop
from train.agent.trainer import tracker
from train.cluster import Host
from train.recipe import presets
from train.recipe.record import Run
from train.run import command, keepers

KEY = "0123456789abcdef0123456789abcdef01234567"


def test_wandb_project_is_an_override_that_reaches_fairseqs_own_option():
    preset = presets.resolve("tiny", ["wandb_project=wmt16-big"])
    launch = command.launches("r1", [{"address": "10.0.0.1", "gpus": 0, "nic": "ens5"}], master_port=29500,
                              data_dir="/data/tandem/datasets/x", run_dir="/data/tandem/runs/r1",
                              venv="/opt/tandem/venv", precision="fp32")[0]
    line = command.training_command(preset, launch)
    assert "--wandb-project wmt16-big" in line


def test_the_key_is_in_no_command_and_no_spec_the_hosts_keep(monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", KEY)
    run = Run(run_id="r1", hosts=["v100a", "v100b"], preset="tiny", overrides=["wandb_project=p"],
              dataset="synthetic")
    hosts = [Host("v100a", "10.0.0.1", cluster_address="172.30.0.11"),
             Host("v100b", "10.0.0.2", cluster_address="172.30.0.12")]
    told = json.dumps(keepers.spec(run, hosts))
    assert "--wandb-project p" in told and KEY not in told
    assert tracker.from_environment(os.environ) == {"WANDB_API_KEY": KEY}


def test_only_the_trackers_keys_are_read_from_the_launchs_input():
    given = io.StringIO(json.dumps({"WANDB_API_KEY": KEY, "LD_PRELOAD": "/tmp/x.so"}) + "\n")
    assert tracker.read(given) == {"WANDB_API_KEY": KEY}
    assert tracker.read(io.StringIO("")) == {}


@pytest.mark.parametrize(("environ", "mode"), [
    ({"WANDB_API_KEY": KEY}, None),  # launched by fab train: online
    ({}, "offline"),  # started again at boot, no key: offline, not a failed wandb.init
    ({"WANDB_MODE": "disabled"}, "disabled"),  # the user's own choice stands
])
def test_a_rank_without_a_key_logs_offline_rather_than_failing(environ, mode):
    env = tracker.rank_environment("torchrun ... --wandb-project p", environ)
    assert env.get("WANDB_MODE") == mode
    assert "WANDB_MODE" not in tracker.rank_environment("torchrun ... --max-update 10", {})


def test_the_keepers_supervisor_holds_the_key_in_its_environment_not_on_disk(tmp_path):
    """`keeper launch --keys-on-stdin`, as fab train runs it over SSH: the supervisor's environment has
    the key; no file of the run's directory does."""
    run_dir = tmp_path / "r1"
    (run_dir / "keeper").mkdir(parents=True)
    (run_dir / "keeper" / "spec.json").write_text(json.dumps({"poll_s": 0.2}))
    done = subprocess.run([sys.executable, "-m", "train.agent.keeper.loop", "launch", "--run", str(run_dir),
                           "--keys-on-stdin"], input=json.dumps({"WANDB_API_KEY": KEY}) + "\n",
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    pid = int(done.stdout.strip())
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        assert f"WANDB_API_KEY={KEY}".encode() in environ
    finally:
        (run_dir / "keeper" / "stop").write_text("test\n")
        loop.stop(str(run_dir), wait_s=5)
        deadline = time.monotonic() + 10
        while loop.supervisor_pid(str(run_dir)) and time.monotonic() < deadline:
            time.sleep(0.2)
    for path in run_dir.rglob("*"):
        if path.is_file():
            assert KEY.encode() not in path.read_bytes(), path


def test_fab_train_with_wandb_and_no_key_is_refused_before_anything_connects():
    from train.errors import OptionError
    from train.run import session

    with pytest.raises(OptionError, match="--set: wandb_project needs WANDB_API_KEY"):
        session.wandb_key_given(("wandb_project=p",), {})
    session.wandb_key_given(("wandb_project=p",), {"WANDB_API_KEY": KEY})
    session.wandb_key_given(("wandb_project=p",), {"WANDB_MODE": "offline"})
    session.wandb_key_given(("max_update=10",), {})
