"""The real `fab`, as a user runs it: every task refuses a bad option value in one line naming the
option, exit 2, before it reaches a host (a resume that cannot take the options asked too); a host
that cannot be reached, or that accepts TCP and says nothing, fails every task that asks it (exit 1)
in one line naming it, never with a traceback; options are long only. The inventory's hosts are
loopback ports nothing listens on, or where nothing ever answers: nothing outside this machine is tried.

The whole table runs through fab's own program in this process (`fab` is `fabric.main.program.run()`),
one row of each task through the `fab` executable (a process start costs ~0.5 s of CPU)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

import fabric.main
import pytest

from train.recipe.record import REPORTS, Run

TOP = Path(__file__).resolve().parents[2]
FAB = str(Path(sys.executable).parent / "fab")

# (task and its options, the option the one line must name)
BAD = [
    (["info", "--hosts", "gamma"], "--hosts"),
    (["info", "--hosts", "alpha,alpha"], "--hosts"),
    (["prepare-data", "--vocab-size", "abc"], "--vocab-size"),
    (["prepare-data", "--lines", "0"], "--lines"),
    (["prepare-data", "--name", "../up"], "--name"),
    (["prepare-data", "--source", "/no/such/corpus"], "--source"),
    (["prepare-data", "--wmt16", "--source", "."], "--source"),
    (["train", "--update-freq", "x"], "--update-freq"),
    (["train", "--checkpoints-to", "sftp://backup:hunter2@store/ckpts"], "--checkpoints-to"),  # a secret in the URL
    (["train", "--checkpoints-to", "runs/relative"], "--checkpoints-to"),
    (["train", "--checkpoints-every", "0"], "--checkpoints-every"),
    (["train", "--update-freq", "-1"], "--update-freq"),
    (["train", "--precision", "fp64"], "--precision"),
    (["train", "--precision", "fp16"], "--precision"),  # the inventory's hosts have no GPU
    (["train", "--port", "abc"], "--port"),
    (["train", "--port", "70000"], "--port"),
    (["train", "--port", "8080"], "--port: expected a whole number from 29500 to 29507"),  # outside the firewall's
    (["train", "--comm", "gossip"], "--comm"),
    (["train", "--comm", "local-sgd:x"], "--comm"),
    (["train", "--set", "lr"], "--set"),
    (["train", "--new", "--set", "max_updates=5"], "--set"),
    (["train", "--new", "--set", "max_update=many"], "--set"),
    (["train", "--backup", "sometimes"], "--backup"),
    (["train", "--preset", "huge"], "--preset"),
    (["train", "--dataset", "a b"], "--dataset"),
    (["train", "--run", "no-such-run"], "--run"),
    (["train", "--rejoin", "--new"], "--rejoin"),
    (["train", "--bogus"], "--bogus"),
    (["train", "--update-freq"], "--update-freq"),  # no value
    (["status", "--run", "no such run"], "--run"),
    (["status", "--json", "--run", "no such run"], "--run"),
    (["watch", "--every", "abc"], "--every"),
    (["watch", "--every", "0"], "--every"),
    (["watch", "--link-mbps", "fast"], "--link-mbps"),
    (["tensorboard", "--port", "http"], "--port"),
    (["logs", "--lines", "x"], "--lines"),
    (["logs", "--follow", "--lines", "-3"], "--lines"),
    (["stop", "--run", "../etc"], "--run"),
    (["evaluate", "--checkpoint", "../checkpoint_best.pt"], "--checkpoint"),
    (["evaluate", "--run", "no such run"], "--run"),
    (["bench-net", "--threshold", "high"], "--threshold"),
    (["bench-net", "--min-size", "1X"], "--min-size"),
    (["bench-net", "--min-size", "1G", "--max-size", "1M"], "--min-size"),
    (["bench-net", "--iters", "many"], "--iters"),
    (["bench-net", "--budget-s", "-1"], "--budget-s"),
    (["bench-net", "--iperf-seconds", "x"], "--iperf-seconds"),
    (["bench-net", "--port", "0"], "--port"),
    (["bench-step", "--rates", "10mbit,fast"], "--rates"),
    (["bench-step", "--updates", "x"], "--updates"),
    (["bench-step", "--cycles", "0"], "--cycles"),
    (["bench-step", "--skip", "-1"], "--skip"),
    (["bench-step", "--comm", "sync,gossip"], "--comm"),
    (["bench-step", "--set", "encoder_embed_dim=wide"], "--set"),
    (["bench-step", "--precision", "bf16"], "--precision"),
    (["predict", "--link", "fast"], "--link"),
    (["predict", "--compute-s", "x"], "--compute-s"),
    (["predict", "--update-freq", "0"], "--update-freq"),
    (["predict", "--max-update", "x"], "--max-update"),
    (["predict", "--overlap", "2"], "--overlap"),
    (["predict", "--comm", "gossip"], "--comm"),
    (["predict", "--precision", "fp8"], "--precision"),
    (["report", "--link-mbps", "-5"], "--link-mbps"),
    (["report", "--run", "no such run"], "--run"),
    (["bench-quality", "--comm", "sync,auto"], "--comm"),
    (["bench-quality", "--comm", "update-freq:1"], "--comm"),
    (["bench-quality", "--updates", "0"], "--updates"),
    (["bench-quality", "--timeout", "soon"], "--timeout"),
    (["bench-quality", "--set", "max_update=5"], "--set"),
    (["version", "--json"], "--json"),
]


def free_ports(n: int) -> list[int]:
    """Loopback ports nothing listens on (bound, then let go)."""
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


@pytest.fixture(scope="module")
def inventory(tmp_path_factory) -> Path:
    """Two CPU hosts on loopback ports that refuse at once (distinct ports: Fabric tells connections
    apart by address and port)."""
    return inventory_at(tmp_path_factory.mktemp("inventory") / "hosts.yml", *free_ports(2))


@pytest.fixture(scope="module")
def silent_inventory(tmp_path_factory) -> Path:
    """The same two hosts on loopback ports that accept TCP and never say a word, as a VM whose sshd is
    still starting: listening sockets no one accepts on (the kernel completes the handshake)."""
    socks = [socket.socket() for _ in range(2)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
        s.listen(64)
    yield inventory_at(tmp_path_factory.mktemp("silent") / "hosts.yml", *(s.getsockname()[1] for s in socks))
    for s in socks:
        s.close()


def inventory_at(path: Path, a: int, b: int) -> Path:
    path.write_text(f"""all:
  vars:
    ansible_user: nobody
  children:
    cluster:
      hosts:
        alpha: {{ansible_host: 127.0.0.1, ansible_port: {a}, gpus: 0}}
        beta: {{ansible_host: 127.0.0.1, ansible_port: {b}, gpus: 0}}
""")
    return path


def fab(inventory: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "FABRIC_INVENTORY": str(inventory), "COLUMNS": "200"}
    return subprocess.run([FAB, *args], cwd=TOP, capture_output=True, text=True, timeout=timeout, env=env)


def in_parallel(inventory: Path, commands: list[list[str]], run=None) -> list[subprocess.CompletedProcess]:
    with ThreadPoolExecutor(max_workers=min(16, (os.cpu_count() or 2) * 2)) as pool:
        return list(pool.map(lambda args: (run or fab)(inventory, *args), commands))


# `fab` itself (fabric.main.program, as the executable runs it) with SSH's connect timeout at 2 s instead
# of 10 (train.cluster's, and fab watch's own): a host that accepts TCP and says nothing costs 2 s
QUICK_FAB = ("import sys, fabric.main, train.cluster, train.watch.feed; "
             "train.cluster.CONNECT_S = train.watch.feed.CONNECT_S = 2.0; sys.argv[0] = 'fab'; "
             "fabric.main.program.run()")


def quick_fab(inventory: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "FABRIC_INVENTORY": str(inventory), "COLUMNS": "400"}
    return subprocess.run([sys.executable, "-c", QUICK_FAB, *args], cwd=TOP, capture_output=True, text=True,
                          timeout=60, env=env)


def wrong_answer(args: list[str], option: str, code: int | None, out: str, err: str) -> str | None:
    """Why fab's answer to a bad value is not one line naming the option on stderr, exit 2; None if it is."""
    said = [line for line in (out + err).strip().splitlines() if not line.startswith("[WARNING]: ")]
    if code != 2 or len(said) != 1 or option not in said[0] or out.strip() or "Traceback" in err:
        return f"fab {' '.join(args)}: exit {code}, said {said[-3:]}"
    return None


def test_every_task_refuses_a_bad_value_in_one_line_naming_the_option_with_exit_2(inventory, monkeypatch, capsys):
    monkeypatch.setenv("FABRIC_INVENTORY", str(inventory))
    monkeypatch.chdir(TOP)
    wrong = []
    for args, option in BAD:
        with pytest.raises(SystemExit) as ended:
            fabric.main.program.run(["fab", *args])
        said = capsys.readouterr()
        wrong.append(wrong_answer(args, option, ended.value.code, said.out, said.err))
    assert not any(wrong), "\n".join(w for w in wrong if w)
    assert {args[0] for args, _ in BAD} >= {"info", "prepare-data", "train", "status", "watch", "tensorboard",
                                            "logs", "stop", "evaluate", "bench-net", "bench-step", "predict",
                                            "report", "bench-quality", "version"}


def test_the_fab_executable_refuses_a_bad_value_of_every_task_the_same_way(inventory):
    first = list({args[0]: (args, option) for args, option in reversed(BAD)}.values())  # a row per task
    started = time.monotonic()
    done = in_parallel(inventory, [args for args, _ in first])
    wrong = [wrong_answer(args, option, proc.returncode, proc.stdout, proc.stderr)
             for (args, option), proc in zip(first, done, strict=True)]
    assert not any(wrong), "\n".join(w for w in wrong if w)
    assert len(first) == 15 and time.monotonic() - started < 40


def test_the_line_says_what_the_option_accepts(inventory):
    proc = fab(inventory, "train", "--update-freq", "x")
    assert proc.stderr == "error: --update-freq: expected a whole number >= 1, got 'x'\n"
    proc = fab(inventory, "bench-net", "--threshold", "high")
    assert proc.stderr == "error: --threshold: expected a fraction from 0 to 1, e.g. 0.85, got 'high'\n"


@pytest.fixture
def run_of_unreachable_hosts():
    """A run record of the inventory's hosts (reports/<id>/run.json, removed afterwards; `latest`
    untouched)."""
    run = Run(run_id=f"cli-test-{uuid.uuid4().hex[:8]}", hosts=["alpha", "beta"], preset="tiny", overrides=[],
              dataset="synthetic")
    folder = REPORTS / run.run_id
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps(asdict(run)))
    yield run.run_id
    for path in folder.iterdir():
        path.unlink()
    folder.rmdir()


def test_info_status_and_logs_fail_naming_the_host_they_cannot_reach(inventory, run_of_unreachable_hosts):
    run = run_of_unreachable_hosts
    commands = [["info"], ["status", "--run", run], ["logs", "--run", run], ["logs", "--follow", "--run", run],
                ["--hosts", "beta", "info"]]
    started = time.monotonic()
    done = in_parallel(inventory, commands)
    assert time.monotonic() - started < 30
    for args, proc in zip(commands, done, strict=True):
        out = proc.stdout + proc.stderr
        assert proc.returncode == 1, f"fab {' '.join(args)}: exit {proc.returncode}\n{out}"
        assert "Traceback" not in out
        last = out.strip().splitlines()[-1]
        assert last.startswith("error: unreachable: ") and "beta (" in last, last
    assert "alpha (" not in done[-1].stdout  # --hosts beta: alpha is not asked


def test_a_run_of_neither_this_controller_nor_a_host_that_answers_is_said_in_one_line(inventory):
    """A run this controller did not start is asked of the hosts (train.run.pick): none answering, exit 1
    naming them, nothing made up."""
    commands = [["status", "--run", "no-such-run"], ["status", "--json", "--run", "no-such-run"],
                ["stop", "--run", "no-such-run"], ["report", "--run", "no-such-run"]]
    for args, proc in zip(commands, in_parallel(inventory, commands), strict=True):
        said = [line for line in (proc.stdout + proc.stderr).strip().splitlines() if not line.startswith("[WARNING]")]
        assert proc.returncode == 1 and len(said) == 1, f"fab {' '.join(args)}: {said}"
        assert "--json" not in args or not proc.stdout  # the one line on stderr: no JSON of a run made up
        assert said[0].startswith("error: no run no-such-run on this controller, and no host could be asked for it: "
                                  "unreachable: alpha ("), said[0]
    assert not (REPORTS / "no-such-run").exists()


def test_status_json_is_json_on_stdout_and_names_the_unreachable_host_on_stderr(inventory, run_of_unreachable_hosts):
    proc = fab(inventory, "status", "--json", "--run", run_of_unreachable_hosts)
    assert proc.returncode == 1
    said = json.loads(proc.stdout)
    assert said["run"] == run_of_unreachable_hosts and said["max_update"] == 300
    assert [(h["host"], h["ranks"], h["state"], h["reachable"]) for h in said["hosts"]] == [
        ("alpha", "0", "unreachable", False), ("beta", "1", "unreachable", False)]
    assert "Unable to connect" in said["hosts"][1]["error"]
    assert proc.stderr.startswith("error: unreachable: alpha (")


def test_options_are_long_only_but_logs_f_and_version_is_tandems(inventory):
    tasks = ("train", "predict", "bench-step", "evaluate", "logs")
    helps = in_parallel(inventory, [["--help", task] for task in tasks])
    for task, proc in zip(tasks, helps, strict=True):
        options = [line.split()[0] for line in proc.stdout.splitlines() if line.startswith("  -")]
        assert options and all(o.startswith("--") for o in options if o != "-f,"), options
        assert ("-f," in options) == (task == "logs")  # -f, --follow: tail -f's
    version = fab(inventory, "version")
    assert version.returncode == 0 and version.stdout.startswith("tandem 0.")


@pytest.mark.parametrize("hosts", ["inventory", "silent_inventory"])
def test_a_host_that_does_not_answer_ssh_fails_each_task_in_one_line_naming_it(hosts, request,
                                                                               run_of_unreachable_hosts):
    """A closed port, and a port that accepts TCP and says nothing (paramiko's banner timeout, whose
    traceback paramiko logs itself): exit 1, one line naming the host with the fix, no traceback; no
    report of nothing, no run state made up."""
    run = run_of_unreachable_hosts
    commands = [["prepare-data"], ["tensorboard", "--run", run, "--port", str(free_ports(1)[0])],
                ["watch", "--once", "--run", run], ["report", "--run", run], ["status", "--run", run]]
    started = time.monotonic()
    done = in_parallel(request.getfixturevalue(hosts), commands, run=quick_fab)
    assert time.monotonic() - started < 40
    said_of = {"inventory": "nothing answers SSH at nobody@127.0.0.1", "silent_inventory": "not as SSH"}[hosts]
    for args, proc in zip(commands, done, strict=True):
        out = proc.stdout + proc.stderr
        assert proc.returncode == 1, f"fab {' '.join(args)}: exit {proc.returncode}\n{out}"
        assert "Traceback" not in out, out
        errors = [line for line in out.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1, out
        if args[0] in ("prepare-data", "tensorboard"):  # rank 0's host alone
            assert errors[0].startswith("error: alpha: ") and said_of in errors[0], errors[0]
            assert "fab init" in errors[0] or "check " in errors[0]
        else:
            assert errors[0].startswith("error: unreachable: alpha (") and "; beta (" in errors[0], errors[0]
            assert "lets SSH in from this machine" in errors[0]
    assert sorted(p.name for p in (REPORTS / run).iterdir()) == ["run.json"]  # no report, no empty folders
    status = done[-1].stdout
    assert "alpha, beta: unreachable from here; the run's state is not known" in status
    assert "before its first update" not in status and "ended early" not in status


def test_a_resume_refused_for_another_preset_or_other_hosts_is_bad_input(inventory, run_of_unreachable_hosts):
    """Asking to resume a run with options it cannot take is a combination of options: exit 2, one
    line naming the option, before any host is reached."""
    run = run_of_unreachable_hosts
    asked = [(["train", "--run", run, "--preset", "transformer_wmt_en_de"], "--preset"),
             (["train", "--run", run, "--dataset", "wmt16"], "--dataset"),
             (["--hosts", "beta", "train", "--run", run], "--hosts")]
    done = in_parallel(inventory, [args for args, _ in asked])
    wrong = [wrong_answer(args, option, proc.returncode, proc.stdout, proc.stderr)
             for (args, option), proc in zip(asked, done, strict=True)]
    assert not any(wrong), "\n".join(w for w in wrong if w)
    assert f"run {run} ran on alpha, beta, not beta" in done[2].stderr


def test_an_inventory_that_is_not_yaml_is_said_with_its_file_and_line(tmp_path):
    path = tmp_path / "hosts.yml"
    path.write_text("all:\n  children:\n    cluster:\n      hosts:\n        alpha:\n"
                    "          ansible_host: 127.0.0.1\n         gpus: 0\n")
    proc = fab(path, "info")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "Traceback" not in out
    assert f"error: inventory {path}, line 7: not valid YAML" in out, out
    assert "lists no hosts" not in out
