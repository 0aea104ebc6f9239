"""The keeper as a systemd unit where systemd is the init (train.agent.keeper.supervision): what systemd is
asked for. No systemd runs here (the lab's hosts have no init system): the lab tests the supervisor
that stands in for it (train.agent.keeper.loop.supervise, tests/unit/train/agent/keeper/test_keeper.py)."""

from train.agent.keeper import supervision


def properties(argv: list[str]) -> dict[str, str]:
    return dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "-p")


def test_the_keepers_unit_restarts_on_failure_with_a_start_limit_and_never_takes_the_ranks_with_it():
    argv = supervision.unit_command("/data/tandem/runs/run-20261127-1200", keys={"WANDB_API_KEY": "k"})
    said = properties(argv)
    assert argv[:3] == ["systemd-run", "--user", "--unit"] and argv[3] == "tandem-keeper-run-20261127-1200"
    assert said["Restart"] == "on-failure" and said["RestartSec"] == "2"
    assert (said["StartLimitBurst"], said["StartLimitIntervalSec"]) == ("10", "600")
    assert said["KillMode"] == "process"  # a keeper's restart leaves the training ranks running
    assert said["StandardOutput"] == "append:/data/tandem/runs/run-20261127-1200/keeper/keeper.log"
    assert "WANDB_API_KEY=k" in argv and f"{supervision.UNIT_ENV}=tandem-keeper-run-20261127-1200" in argv
    assert argv[-5:] == ["-m", "train.agent.keeper.loop", "run", "--run", "/data/tandem/runs/run-20261127-1200"]


def test_at_boot_root_starts_a_system_unit_as_the_runs_owner():
    argv = supervision.unit_command("/data/tandem/runs/r1", user=(1000, 1000), as_root=True)
    assert "--user" not in argv and argv[argv.index("--uid") + 1] == "1000" and "--gid" in argv
