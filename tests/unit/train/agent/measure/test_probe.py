"""What `fab train`'s preflight, roles/train_env and roles/verify ask every host: train.agent.measure.probe."""

from __future__ import annotations

import hashlib
import json
import socket
import subprocess
import sys

from train.agent.measure import probe


def ask(*args: str) -> tuple[int, dict, str]:
    proc = subprocess.run([sys.executable, "-m", "train.agent.measure.probe", *map(str, args)],
                          capture_output=True, text=True, timeout=120)
    return proc.returncode, json.loads(proc.stdout.splitlines()[-1]), proc.stderr


def test_versions_of_this_environment():
    code, answer, _ = ask()
    import fairseq
    import torch

    assert code == 0
    assert answer["torch"] == torch.__version__ and answer["fairseq"] == fairseq.__version__
    assert answer["python"] == sys.version.split()[0] and answer["cuda_devices"] == torch.cuda.device_count()
    assert "data" not in answer and "port_free" not in answer  # only what was asked


def test_a_run_preflight_sees_the_dataset_the_port_and_a_running_rank(tmp_path, spawn):
    data = tmp_path / "synthetic"
    data.mkdir()
    (data / "MANIFEST.sha256").write_text("abc  train.en-de.en.bin\n")
    run = tmp_path / "run-1"
    holder = socket.socket()
    holder.bind(("0.0.0.0", 0))
    holder.listen()
    rank = spawn([sys.executable, "-c", "import time; time.sleep(60)", "--save-dir", f"{run}/checkpoints"])
    try:
        code, answer, _ = ask("--data", data, "--port", holder.getsockname()[1], "--run", run)
    finally:
        holder.close()
    assert code == 0
    assert answer["data"] == hashlib.sha256(b"abc  train.en-de.en.bin\n").hexdigest()
    assert answer["port_free"] is False and "in use" in answer["port_error"]
    assert answer["running"] == rank.pid
    assert answer["free_gb"] > 0


def test_no_dataset_and_a_free_port(tmp_path):
    answer = probe.probe(data=str(tmp_path / "missing"), port=0, run=str(tmp_path / "run"))
    assert answer["data"] is None and answer["port_free"] is True and answer["running"] is None


def test_a_venv_without_fairseq_is_named_with_exit_1(tmp_path):
    """A host whose environment is broken: the import error comes back, on stdout and stderr."""
    (tmp_path / "fairseq.py").write_text("raise ImportError('no module named fairseq.models (test)')\n")
    proc = subprocess.run([sys.executable, "-m", "train.agent.measure.probe"], capture_output=True, text=True,
                          timeout=120,
                          env={"PYTHONPATH": f"{tmp_path}:{'.'}", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 1
    assert "no module named fairseq.models (test)" in json.loads(proc.stdout)["import_error"]
    assert "torch/fairseq do not import" in proc.stderr


def test_versions_differ_names_the_host_and_both_versions():
    same = {"python": "3.11.2", "torch": "2.13.0", "cuda": None, "fairseq": "0.12.3.1", "numpy": "2.4.6"}
    assert probe.versions_differ({"a": same, "b": dict(same)}) == []
    assert probe.versions_differ({"a": same, "b": {**same, "fairseq": "0.12.0"}, "c": {**same, "torch": "2.12.0"}}) == [
        "b: fairseq 0.12.0 but a has 0.12.3.1", "c: torch 2.12.0 but a has 2.13.0"]


def test_cached_versions_are_answered_without_importing_torch_until_a_package_changes(tmp_path, monkeypatch):
    cache = tmp_path / "versions.json"
    first = probe.cached_versions(str(cache))
    assert json.loads(cache.read_text())["versions"] == first
    monkeypatch.setattr(probe, "versions", lambda: {"python": "imported again"})
    assert probe.cached_versions(str(cache)) == first  # same packages: from the file
    from train.agent.measure import pins

    monkeypatch.setattr(pins, "installed", lambda: {"torch": "2.0.0"})  # a package changed
    assert probe.cached_versions(str(cache)) == {"python": "imported again"}


def installed_agent(root) -> None:
    """The agent as roles/train_env's rsync installs it: train/__init__.py and train/agent/*.py."""
    import shutil
    from pathlib import Path

    top = Path(probe.__file__).resolve().parents[2]
    (root / "train").mkdir(parents=True)
    shutil.copy(top / "__init__.py", root / "train" / "__init__.py")
    for source in (top / "agent").rglob("*.py"):  # the agent's folders, as roles/train_env copies them
        (root / "train" / source.relative_to(top)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source, root / "train" / source.relative_to(top))


def test_a_host_whose_agent_is_another_version_is_named_before_launch(tmp_path):
    """A controller updated (git pull) without re-provisioning: the hosts still run the agent
    provisioning copied, which silently ignores what it does not know. The probe says which
    agent it is; `fab train`'s preflight names the host that has another one, and the fix."""
    from train.cluster import Host
    from train.recipe import record
    from train.run import preflight

    installed_agent(tmp_path)
    env = {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}
    same = subprocess.run([sys.executable, "-m", "train.agent.measure.probe"], capture_output=True, text=True,
                          timeout=120, env=env, cwd=tmp_path)
    assert json.loads(same.stdout)["agent"] == preflight.controller_agent()  # the copy is this checkout's agent
    state = tmp_path / "train" / "agent" / "keeper" / "state.py"
    state.write_text(state.read_text() + "\n# an older agent\n")
    older = json.loads(subprocess.run([sys.executable, "-m", "train.agent.measure.probe"], capture_output=True,
                                      text=True,
                                      timeout=120, env=env, cwd=tmp_path).stdout)["agent"]
    assert older != preflight.controller_agent()

    run = record.Run(run_id="run-x", hosts=["v100a", "v100b", "v100c"], preset="tiny", overrides=[],
                     dataset="synthetic")
    hosts = [Host("v100a", "10.0.0.1"), Host("v100b", "10.0.0.2"), Host("v100c", "10.0.0.3")]
    answer = {"python": "3.11.7", "torch": "2.13.0+cpu", "fairseq": "0.12.3.1", "numpy": "2.4.6", "data": "d",
              "free_gb": 3.0, "port_free": True, "running": None}
    ours = preflight.controller_agent()
    answers = {"v100a": {**answer, "agent": ours}, "v100b": {**answer, "agent": older}, "v100c": answer}
    assert preflight.check(run, hosts, answers, pins_wanted={}) == [
        f"v100b: tandem's host-side agent (train/agent) there is version {older[:12]}, not this controller's "
        f"{preflight.controller_agent()[:12]}: re-run provision.yml (--tags train_env) to install it",
        f"v100c: tandem's host-side agent (train/agent) there is one older than this check, not this controller's "
        f"{preflight.controller_agent()[:12]}: re-run provision.yml (--tags train_env) to install it"]
