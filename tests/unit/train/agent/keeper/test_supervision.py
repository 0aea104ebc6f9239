"""The keeper as a systemd unit where systemd is the init (train.agent.keeper.supervision): what systemd is
asked for. No systemd runs here (the lab's hosts have no init system): the lab tests the supervisor
that stands in for it (train.agent.keeper.loop.supervise, tests/unit/train/agent/keeper/test_keeper.py)."""

import os
import subprocess

import pytest

from train.agent.keeper import supervision


def properties(argv: list[str]) -> dict[str, str]:
    return dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "-p")


def test_the_keepers_unit_restarts_on_failure_with_a_start_limit_and_never_takes_the_ranks_with_it():
    argv = supervision.unit_command("/data/tandem/runs/run-20261127-1200")
    said = properties(argv)
    assert argv[:3] == ["systemd-run", "--user", "--unit"] and argv[3] == "tandem-keeper-run-20261127-1200"
    assert said["Restart"] == "on-failure" and said["RestartSec"] == "2"
    assert (said["StartLimitBurst"], said["StartLimitIntervalSec"]) == ("10", "600")
    assert said["KillMode"] == "process"  # a keeper's restart leaves the training ranks running
    assert said["StandardOutput"] == "append:/data/tandem/runs/run-20261127-1200/keeper/keeper.log"
    assert f"{supervision.UNIT_ENV}=tandem-keeper-run-20261127-1200" in argv
    assert argv[-5:] == ["-m", "train.agent.keeper.loop", "run", "--run", "/data/tandem/runs/run-20261127-1200"]


def test_at_boot_root_starts_a_system_unit_as_the_runs_owner():
    argv = supervision.unit_command("/data/tandem/runs/r1", user=(1000, 1000), as_root=True)
    assert "--user" not in argv and argv[argv.index("--uid") + 1] == "1000" and "--gid" in argv


KEY = "0123456789abcdef0123456789abcdef01234567"


def test_the_wandb_key_reaches_the_unit_through_a_0600_file_never_its_command_line(tmp_path, monkeypatch):
    """systemd-run's command line is readable by every user of the host (/proc/PID/cmdline) while it
    runs: the key goes into a file of the runtime directory that systemd reads at each start (issue 54)."""
    runtime = tmp_path / "run-user-1000"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    asked = []
    monkeypatch.setattr(subprocess, "run", lambda argv, **_: asked.append(argv) or subprocess.CompletedProcess(argv, 0))
    assert supervision.start_unit("/data/tandem/runs/r1", keys={"WANDB_API_KEY": KEY}) is None
    line = asked[-1]
    assert all(KEY not in word for word in line)
    key_file = runtime / "tandem-keeper-r1.env"
    assert properties(line)["EnvironmentFile"] == f"-{key_file}"
    assert key_file.stat().st_mode & 0o777 == 0o600
    assert key_file.read_text() == f"WANDB_API_KEY='{KEY}'\n"

    assert supervision.start_unit("/data/tandem/runs/r1", keys=None) is None  # started again without keys
    assert not key_file.exists() and "EnvironmentFile" not in properties(asked[-1])


def test_a_key_file_left_readable_is_made_the_owners_alone(tmp_path):
    path = tmp_path / "k.env"
    path.write_text("old\n")
    path.chmod(0o644)
    supervision.write_key_file(path, {"WANDB_API_KEY": KEY})
    assert path.stat().st_mode & 0o777 == 0o600 and KEY in path.read_text()
    with pytest.raises(ValueError, match="WANDB_API_KEY"):
        supervision.write_key_file(path, {"WANDB_API_KEY": "k'\nLD_PRELOAD=/tmp/x.so"})


def test_the_keys_wait_in_roots_runtime_directory_at_boot_and_in_the_keeper_folder_without_one():
    run = "/data/tandem/runs/r1"
    assert str(supervision.key_file_path(run, as_root=True)) == "/run/tandem/tandem-keeper-r1.env"
    without = supervision.key_file_path(run, as_root=False, environ={"XDG_RUNTIME_DIR": "/nonexistent"})
    assert str(without) == "/data/tandem/runs/r1/keeper/tandem-keeper-r1.env"
