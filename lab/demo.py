"""`make demo`: tandem's main job end to end on the local lab, each step the command a user
would type, printed before it runs."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.rule import Rule

TOP = Path(__file__).resolve().parent.parent
VENV_BIN = TOP / ".venv" / "bin"
console = Console(highlight=False, soft_wrap=True)

STEPS = [
    ("Bring up the lab: two hosts with their own Debian, sshd and an empty data disk, each on two "
     "networks like a cloud VM (SSH on eth0, the cluster on ens5)",
     ["make", "-s", "lab-up"]),
    ("Ansible reaches every host through the lab inventory (host keys checked)",
     ["ansible", "-i", "inventory/lab.yml", "cluster", "-m", "ansible.builtin.ping"]),
    ("Fabric resolves the same hosts through the inventory and asks them in parallel",
     ["fab", "info"]),
    ("Provision: packages, /etc/hosts, the data volume, NIC speed and iperf3, the training "
     "environment from the lab's wheelhouse, then the verification table",
     ["ansible-playbook", "-i", "inventory/lab.yml", "provision.yml"]),
    ("Bandwidth before training: iperf3 between every pair, then an all_reduce sweep (nccl-tests style)",
     ["fab", "bench-net", "--max-size", "64M"]),
    ("Prepare the data: a synthetic en-de corpus, joint sentencepiece, fairseq binaries, "
     "copied to /data on both hosts and checked",
     ["fab", "prepare-data"]),
    ("Step time against bandwidth: the tiny model under a 10mbit cap and uncapped, with the model's "
     "prediction (the cap is always lifted afterwards)",
     ["fab", "bench-step", "--rates", "10mbit,none", "--cycles", "1"]),
    ("Predict the whole run: seconds per update, hours, network-bound or not",
     ["fab", "predict"]),
    ("Train the tiny Transformer on both hosts at once (torchrun, gloo on CPU), with a progress bar",
     ["fab", "train", "--new"]),
    ("Score it: translate the test set with the best checkpoint, SacreBLEU",
     ["fab", "evaluate"]),
    ("The report: loss, learning rate, step time, NIC throughput, and the answers with numbers",
     ["fab", "report"]),
]


def main() -> int:
    env = dict(os.environ, FABRIC_INVENTORY="inventory/lab.yml",
               PATH=f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}")
    started = time.monotonic()
    for number, (title, command) in enumerate(STEPS, 1):
        console.print(Rule(f"[bold]{number}. {title}", align="left"))
        console.print(f"[dim]$ {shlex.join(command)}[/]")
        if subprocess.run(command, cwd=TOP, env=env).returncode != 0:
            console.print(f"[red]demo stopped: step {number} failed[/] ({shlex.join(command)})")
            return 1
    console.print(Rule())
    console.print(f"[bold green]demo done[/] in {time.monotonic() - started:.0f} s. The lab is still up: "
                  "`FABRIC_INVENTORY=inventory/lab.yml .venv/bin/fab info` to look around, "
                  "`make lab-down` to remove it.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
