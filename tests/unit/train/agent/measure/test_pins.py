"""The pinned training environment against a host's packages: one hash, and the drifted ones named."""

from __future__ import annotations

import json
import subprocess
import sys

from train.agent.measure import pins
from train.cluster import Host
from train.recipe import record
from train.run import preflight

PINNED = {"torch": "2.13.0", "sacrebleu": "2.6.0", "numpy": "2.4.6", "fairseq-fixed": "0.12.3.1"}


def test_the_pins_as_installed_match_with_a_local_build_label():
    have = {"torch": "2.13.0+cpu", "sacrebleu": "2.6.0", "numpy": "2.4.6", "fairseq-fixed": "0.12.3.1",
            "absl-py": "2.1.0"}  # a dependency nobody pins does not count
    assert pins.digest(PINNED, have) == pins.digest(PINNED, PINNED)
    assert pins.drift(PINNED, have) == []


def test_every_drifted_package_is_named():
    have = {"torch": "2.13.0+cpu", "sacrebleu": "2.5.0", "numpy": "2.3.1"}
    assert pins.drift(PINNED, have) == ["fairseq-fixed missing (pinned 0.12.3.1)", "numpy 2.3.1 (pinned 2.4.6)",
                                        "sacrebleu 2.5.0 (pinned 2.6.0)"]


def test_requirement_names_are_compared_as_pip_does(tmp_path):
    req = tmp_path / "r.txt"
    req.write_text("# comment\nFairseq_Fixed==0.12.3.1\nscikit-learn==1.9.1  # why\n\n")
    assert pins.read_pins(req) == {"fairseq-fixed": "0.12.3.1", "scikit-learn": "1.9.1"}


def test_the_probe_lists_this_environment_packages():
    proc = subprocess.run([sys.executable, "-m", "train.agent.measure.probe", "--packages"], capture_output=True,
                          text=True, timeout=120)
    packages = json.loads(proc.stdout.splitlines()[-1])["packages"]
    import torch

    assert packages["torch"] == torch.__version__ and "fairseq-fixed" in packages


def test_fab_train_preflight_names_the_host_and_its_drifted_packages():
    run = record.Run(run_id="run-x", hosts=["v100a", "v100b"], preset="tiny", overrides=[], dataset="synthetic")
    hosts = [Host("v100a", "10.0.0.1"), Host("v100b", "10.0.0.2")]
    answer = {"python": "3.11.7", "torch": "2.13.0+cpu", "fairseq": "0.12.3.1", "numpy": "2.4.6", "data": "d",
              "free_gb": 3.0, "port_free": True, "running": None, "agent": preflight.controller_agent()}
    answers = {"v100a": {**answer, "packages": {**PINNED, "torch": "2.13.0+cpu"}},
               "v100b": {**answer, "packages": {**PINNED, "sacrebleu": "2.5.0", "numpy": "2.3.1"}}}
    problems = preflight.check(run, hosts, answers, pins_wanted=PINNED)
    assert problems == ["v100b: packages differ from the pins: numpy 2.3.1 (pinned 2.4.6), sacrebleu 2.5.0 "
                        "(pinned 2.6.0); re-run provision.yml (--tags train_env) to restore them"]


def test_the_pins_command_says_whether_pip_has_anything_to_do(tmp_path):
    import torch

    good, bad = tmp_path / "good.txt", tmp_path / "bad.txt"
    good.write_text(f"torch=={pins.public(torch.__version__)}\n")
    bad.write_text("torch==0.1.0\n")
    ok = subprocess.run([sys.executable, "-m", "train.agent.measure.pins", str(good)], capture_output=True, text=True)
    assert ok.returncode == 0 and ok.stdout.strip() == "all 1 pins installed"
    drifted = subprocess.run([sys.executable, "-m", "train.agent.measure.pins", str(bad)], capture_output=True,
                             text=True)
    assert drifted.returncode == 1
    assert drifted.stdout.strip() == f"torch {pins.public(torch.__version__)} (pinned 0.1.0)"
