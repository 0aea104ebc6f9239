"""The per-host training command: ranks, world size, CPU/GPU flags, detaching, evaluation."""

from __future__ import annotations

import os
import shlex
import stat
import subprocess
import time

import pytest

from train.recipe.presets import resolve
from train.run.command import Launch, evaluation_command, launches, parse_bleu, training_command

TINY = resolve("tiny")


def _hosts(n: int, gpus: int = 0):
    return [{"address": f"10.0.0.{11 + i}", "gpus": gpus, "nic": "eth1"} for i in range(n)]


def _launches(n: int, gpus: int = 0, **kw):
    return launches(
        "r1", _hosts(n, gpus), master_port=29500, data_dir="/data/bin", run_dir="/data/runs/r1", venv="/opt/venv", **kw
    )


def _value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


@pytest.mark.parametrize(("hosts", "gpus", "world"), [(2, 0, 2), (3, 0, 3), (2, 1, 2), (2, 2, 4), (3, 8, 24)])
def test_node_rank_in_host_order_and_world_size(hosts, gpus, world):
    for i, launch in enumerate(_launches(hosts, gpus)):
        argv = shlex.split(training_command(TINY, launch))
        assert _value(argv, "--node_rank") == str(i)
        assert _value(argv, "--nnodes") == str(hosts)
        assert _value(argv, "--nproc_per_node") == str(max(gpus, 1))
        assert _value(argv, "--master_addr") == "10.0.0.11", "rendezvous on the first host"
        line = training_command(TINY, launch)
        assert f"--distributed-world-size {world}" in line


def test_cpu_hosts_use_gloo_and_pass_their_rank():
    for i, launch in enumerate(_launches(2)):
        argv = shlex.split(training_command(TINY, launch))
        assert "--cpu" in argv and _value(argv, "--distributed-backend") == "gloo"
        assert _value(argv, "--ddp-backend") == "legacy_ddp"
        assert _value(argv, "--distributed-rank") == str(i)
        assert _value(argv, "--distributed-init-method") == "env://" and "--distributed-no-spawn" in argv


def test_several_gpus_per_host_take_their_rank_from_torchrun():
    launch = _launches(2, gpus=4, precision="bf16")[1]
    argv = shlex.split(training_command(TINY, launch))
    assert "--cpu" not in " ".join(argv)
    inner = argv[argv.index("-c") + 1]
    assert inner.endswith('--distributed-rank "$RANK" --device-id "$LOCAL_RANK"') and "--bf16" in inner
    assert "--distributed-rank 1" not in inner


def test_environment_and_detaching():
    line = training_command(TINY, _launches(2)[0])
    assert "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD" not in line  # checkpoints load as data only (issue 54)
    assert "GLOO_SOCKET_IFNAME=eth1" in line and "NCCL_SOCKET_IFNAME=eth1" in line
    assert "setsid nohup" in line and "> /data/runs/r1/train.log 2>&1 < /dev/null &" in line
    assert "echo $! > /data/runs/r1/train.pid" in line
    assert "--tensorboard-logdir /data/runs/r1/tensorboard" in line
    assert "--save-dir /data/runs/r1/checkpoints" in line
    assert "OMP_NUM_THREADS" not in line  # torch's own default unless the inventory says


def test_inventory_train_threads_caps_each_ranks_cpu_threads():
    hosts = [{**h, "threads": 1} for h in _hosts(2)]
    line = training_command(TINY, launches("r1", hosts, master_port=29500, data_dir="/d", run_dir="/r", venv="/v")[1])
    assert "OMP_NUM_THREADS=1" in line


def test_update_freq_and_overrides_reach_fairseq():
    preset = resolve("tiny", ["max_update=77"])
    line = training_command(preset, _launches(2, update_freq=8)[0])
    assert "--max-update 77" in line and "--update-freq 8" in line


def test_bad_launches_rejected():
    with pytest.raises(ValueError, match="needs GPUs"):
        _launches(2, precision="fp16")
    with pytest.raises(ValueError, match="different GPU counts"):
        launches(
            "r",
            [{"address": "a", "gpus": 2}, {"address": "b", "gpus": 1}],
            master_port=1,
            data_dir="d",
            run_dir="r",
            venv="v",
        )
    with pytest.raises(ValueError, match="node_rank 2"):
        Launch("r", 2, 2, 0, "a", 29500, "d", "s", "l", "lo", "v")


def test_the_line_runs_detached_with_its_arguments_intact(tmp_path):
    """Run the real shell line against a fake torchrun: it detaches, writes the pid and log,
    and torchrun receives exactly the argv (quoted options included) and environment."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    record = tmp_path / "argv.txt"
    fake = venv / "bin" / "torchrun"
    fake.write_text(
        "#!/bin/bash\n"
        f'printf "%s\\n" "$@" > {record}.tmp\n'
        f'echo "ENV ${{TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD:-unset}} $GLOO_SOCKET_IFNAME" >> {record}.tmp\n'
        f'echo "SID $(ps -o sid= -p $$) PID $$" >> {record}.tmp\n'
        'echo "to the log"\n'
        f"mv {record}.tmp {record}\n"
    )
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    launch = Launch(
        "r1",
        1,
        2,
        0,
        "127.0.0.1",
        29500,
        "/data/bin",
        str(tmp_path / "run/ckpt"),
        str(tmp_path / "run/train.log"),
        "lo",
        str(venv),
    )
    started = time.monotonic()
    env = {k: v for k, v in os.environ.items() if k != "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"}
    subprocess.run(["bash", "-c", training_command(TINY, launch)], check=True, timeout=10, env=env)
    while not record.exists() and time.monotonic() - started < 10:
        time.sleep(0.05)
    lines = record.read_text().splitlines()
    assert lines[lines.index("--adam-betas") + 1] == "(0.9, 0.98)"
    assert lines[lines.index("--distributed-rank") + 1] == "1"
    assert "ENV unset lo" in lines
    sid, pid = lines[-1].split()[1], lines[-1].split()[3]
    assert sid == pid, "torchrun leads its own session (setsid): kill -- -PID stops all of it"
    assert (tmp_path / "run/train.pid").read_text().strip() == pid
    while "to the log" not in (tmp_path / "run/train.log").read_text() and time.monotonic() - started < 10:
        time.sleep(0.05)
    assert os.path.isdir(tmp_path / "run/ckpt")


def test_evaluation_command():
    line = evaluation_command(
        data_dir="/data/bin",
        checkpoint="/data/runs/r1/checkpoints/checkpoint_best.pt",
        reference="/data/raw/test.de",
        out_dir="/data/runs/r1/eval",
        venv="/opt/venv",
    )
    # tandem's entry point: the checkpoint (a peer's copy, a bucket's) loads as data only
    assert ("/opt/venv/bin/python -m train.agent.trainer.fairseq_generate /data/bin "
            "--path /data/runs/r1/checkpoints/checkpoint_best.pt") in line
    assert "--required-batch-size-multiple 1" in line and "--remove-bpe sentencepiece" in line
    assert "/opt/venv/bin/sacrebleu /data/raw/test.de" in line
    assert "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD" not in line


def test_parse_bleu():
    assert parse_bleu('{\n "name": "BLEU",\n "score": 23.45,\n "signature": "x"\n}') == 23.45
    assert parse_bleu("BLEU = 12.30 45.1/20.0/9.9/5.0 (BP = 1.000)") == 12.3
    with pytest.raises(ValueError):
        parse_bleu("nothing here")


@pytest.mark.parametrize("value", ["four", 0, -2, 1.5, True])
def test_a_bad_train_threads_names_the_host_and_the_value(value):
    from train.cluster import ClusterError, Host
    from train.hosts.remote import train_threads

    with pytest.raises(ClusterError, match=f"v100b: train_threads must be a whole number .* gives {value!r}"):
        train_threads(Host("v100b", "10.0.0.2", vars={"train_threads": value}))
    assert train_threads(Host("v100a", "10.0.0.1", vars={"train_threads": 2})) == 2
    assert train_threads(Host("v100a", "10.0.0.1")) is None


def test_a_runs_hosts_come_in_rank_order_and_a_stranger_is_named():
    from train.cluster import ClusterError, Host
    from train.recipe.record import Run

    run = Run(run_id="r1", hosts=["v100b", "v100a"], preset="tiny", overrides=[], dataset="synthetic")
    inventory = [Host("v100a", "10.0.0.1"), Host("v100b", "10.0.0.2"), Host("v100c", "10.0.0.3")]
    assert [h.name for h in run.hosts_of(inventory)] == ["v100b", "v100a"]  # rank 0 first, not inventory order
    with pytest.raises(ClusterError, match="run r1 ran on v100b, v100a; none of them is among v100c"):
        run.hosts_of(inventory[2:])
