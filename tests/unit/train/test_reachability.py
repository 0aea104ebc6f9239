"""One reachability verdict per host (train/reachability.py): a host nothing answers at is said as unreachable,
naming it, its address and port, the OS error and the fix, before any task says what it would have found
missing there (issue 56: a dictionary, a driver, a NIC, root, a run)."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import paramiko
import pytest

from train import reachability
from train.cluster import ClusterError, GroupResult, Host, HostResult
from train.plan import link, predict
from train.recipe import record
from train.run import launch, session

TOP = Path(__file__).resolve().parents[3]
FAB = str(Path(os.environ.get("VIRTUAL_ENV", TOP / ".venv")) / "bin" / "fab")
REFUSED = paramiko.ssh_exception.NoValidConnectionsError({("127.0.0.1", 22): ConnectionRefusedError(111, "refused")})


def free_port() -> int:
    """A loopback port nothing listens on (bound, then let go)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def down(name: str = "v100b", **kw) -> Host:
    return Host(name, "127.0.0.1", user="nobody", port=free_port(), **kw)


def unreachable_said(text: str, host: Host) -> bool:
    return f"{host.name}: nothing answers SSH at nobody@127.0.0.1 port {host.port} (" in text and \
        "Unable to connect" in text and "security group lets SSH in" in text


def test_a_host_nothing_answers_at_is_named_with_address_port_os_error_and_fix():
    host = down()
    with pytest.raises(ClusterError) as said:
        reachability.require_answering([host])
    assert str(said.value).startswith("unreachable, nothing done there:\n  v100b: ")
    assert unreachable_said(str(said.value), host), said.value


def silent(hosts: list[Host]) -> GroupResult:
    """Results shaped as run_all returns them for hosts it could not reach."""
    return GroupResult((h.name, HostResult(h.name, error=REFUSED)) for h in hosts)


def test_predict_says_unreachable_not_no_dictionary(monkeypatch):
    host = Host("v100a", "127.0.0.1", user="nobody")
    monkeypatch.setattr(predict, "run_all", lambda hosts, command, **_: silent(hosts))
    with pytest.raises(ClusterError, match="v100a: nothing answers SSH at nobody@127.0.0.1 port 22") as said:
        predict.dataset_vocab(host, "wmt16")
    assert "dictionary" not in str(said.value)
    gone = GroupResult([("v100a", HostResult("v100a", stderr="sh: 1: cannot open /data/x: No such file", exited=2))])
    monkeypatch.setattr(predict, "run_all", lambda hosts, command, **_: gone)
    with pytest.raises(ClusterError, match="no dictionary at .*run `fab prepare-data`"):
        predict.dataset_vocab(host, "wmt16")  # a host that answered without the file: that file is missing


def test_the_gpus_memory_of_a_silent_host_is_no_driver_problem():
    hosts = [Host("v100a", "127.0.0.1", user="nobody", gpus=1)]
    with pytest.raises(ClusterError, match="v100a: nothing answers SSH") as said:
        predict.gpu_memory_of(silent(hosts), hosts)
    assert "driver" not in str(said.value)


def test_bench_steps_sudo_check_says_unreachable_not_root(monkeypatch):
    hosts = [Host("v100a", "127.0.0.1", user="debian")]
    monkeypatch.setattr(link, "run_each", lambda hosts, commands: silent(hosts))
    with pytest.raises(ClusterError, match="v100a: nothing answers SSH at debian@127.0.0.1") as said:
        link.require_sudo(hosts)
    assert "root" not in str(said.value)


def test_rejoin_with_every_host_down_says_unreachable_not_lost_no_host(monkeypatch):
    a, b = down("v100a"), down("v100b")
    run = record.Run(run_id="run-x", hosts=["v100a", "v100b"], preset="tiny", overrides=[], dataset="synthetic")
    monkeypatch.setattr(record.Run, "load", classmethod(lambda cls, run_id: run))
    monkeypatch.setattr(launch, "states", lambda *a: pytest.fail("the run's state asked of silent hosts"))
    with pytest.raises(ClusterError) as said:
        session.rejoin_hosts([a, b], None)
    assert "lost no host" not in str(said.value)
    assert unreachable_said(str(said.value), a) and unreachable_said(str(said.value), b), said.value


def inventory(tmp_path: Path) -> tuple[Path, list[Host]]:
    """Two GPU hosts on loopback ports nothing listens on, without cluster_nic (fab init could not ask them)."""
    hosts = [down("alpha"), down("beta")]
    path = tmp_path / "hosts.yml"
    path.write_text("all:\n  vars:\n    ansible_user: nobody\n  children:\n    cluster:\n      hosts:\n"
                    + "".join(f"        {h.name}: {{ansible_host: 127.0.0.1, ansible_port: {h.port}, gpus: 1}}\n"
                              for h in hosts))
    return path, hosts


@pytest.mark.parametrize(("args", "not_said"), [
    (["predict", "--dataset", "wmt16", "--precision", "fp32"], "dictionary"),
    (["bench-net"], "cluster_nic"),
    (["bench-step", "--rates", "none", "--precision", "fp32"], "root"),
])
def test_each_task_that_needs_hosts_says_unreachable_first(tmp_path, args, not_said):
    path, hosts = inventory(tmp_path)
    env = {**os.environ, "FABRIC_INVENTORY": str(path), "COLUMNS": "400"}
    proc = subprocess.run([FAB, *args], cwd=TOP, capture_output=True, text=True, timeout=60, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "Traceback" not in out and not_said not in out, out
    assert all(unreachable_said(out, h) for h in hosts), out
