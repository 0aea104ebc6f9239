"""Which inventory fab reads (train/onboard/inventory.py): the one FABRIC_INVENTORY names, else fabric.yaml's
(inventory/mine.yml, where `fab init` writes) said on stderr, never the commented example unsaid."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from train.errors import BadInventory
from train.onboard import inventory as inventory_choice

TOP = Path(__file__).resolve().parents[4]
FAB = str(Path(sys.executable).parent / "fab")
EXAMPLE = TOP / "inventory" / "hosts.yml"


def closed_port() -> int:
    """A loopback port nothing listens on: a host that refuses at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def mine(tmp_path) -> Path:
    path = tmp_path / "mine.yml"
    path.write_text(f"""all:
  vars: {{ansible_user: nobody}}
  children:
    cluster:
      hosts:
        alpha: {{ansible_host: 127.0.0.1, ansible_port: {closed_port()}, gpus: 0}}
""")
    return path


def fab(*args: str, config: Path, environ: dict | None = None) -> subprocess.CompletedProcess:
    """fab with FABRIC_INVENTORY unset, `config` standing in for fabric.yaml's `inventory` (a runtime config file,
    `fab -f`, overrides the project's), in a fresh environment as a new terminal has."""
    env = {k: v for k, v in os.environ.items() if k != "FABRIC_INVENTORY"} | {"COLUMNS": "200"} | (environ or {})
    return subprocess.run([FAB, "-f", str(config), *args], cwd=TOP, capture_output=True, text=True, timeout=120,
                          env=env)


def config_naming(tmp_path: Path, inventory: Path) -> Path:
    path = tmp_path / "fabric-runtime.yaml"
    path.write_text(f"inventory: {inventory}\n")
    return path


def test_the_example_is_refused_with_the_fix_unless_fabric_inventory_names_it(tmp_path):
    proc = fab("info", config=config_naming(tmp_path, EXAMPLE))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip() == (
        "error: inventory/hosts.yml (fabric.yaml's inventory) is an example: its hosts are at documentation "
        "addresses (v100a 203.0.113.10, v100b 203.0.113.11), no machine of yours: write yours with `fab init "
        "--hosts-at ADDRESSES --user USER` (README step 2), or name one: export FABRIC_INVENTORY=FILE")
    assert not proc.stdout
    hosts = inventory_choice.load(None, say=pytest.fail, environ={"FABRIC_INVENTORY": str(EXAMPLE)})
    assert [h.name for h in hosts] == ["v100a", "v100b"]  # named: read as named, nothing said


def test_an_inventory_fab_init_has_not_written_yet_is_refused_with_the_fix(tmp_path):
    proc = fab("info", config=config_naming(tmp_path, tmp_path / "mine.yml"))
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        f"error: no inventory: FABRIC_INVENTORY is not set and {tmp_path}/mine.yml (fabric.yaml's) does not exist: "
        "write yours with `fab init --hosts-at ADDRESSES --user USER` (README step 2), or name one: "
        "export FABRIC_INVENTORY=FILE")


def test_the_inventory_fab_reads_unnamed_is_said_once_on_stderr(tmp_path, mine):
    proc = fab("info", config=config_naming(tmp_path, mine))  # alpha refuses: exit 1, after the line
    lines = proc.stderr.splitlines()
    assert lines[0] == f"inventory: {mine} (fabric.yaml's; FABRIC_INVENTORY overrides)"
    assert sum(line.startswith("inventory: ") for line in lines) == 1 and "alpha" in proc.stdout + proc.stderr
    proc = fab("info", config=config_naming(tmp_path, EXAMPLE), environ={"FABRIC_INVENTORY": str(mine)})
    assert "inventory: " not in proc.stderr and "example" not in proc.stderr  # the user's choice, unsaid


def test_fabric_yaml_reads_what_fab_init_writes():
    import yaml

    assert yaml.safe_load((TOP / "fabric.yaml").read_text())["inventory"] == inventory_choice.DEFAULT
    from train.onboard.init import DEFAULT_OUT

    assert DEFAULT_OUT == inventory_choice.DEFAULT
    choice = inventory_choice.Choice(TOP / inventory_choice.DEFAULT, False, inventory_choice.DEFAULT)
    assert choice.note() == "inventory: inventory/mine.yml (fabric.yaml's, written by fab init; FABRIC_INVENTORY " \
                            "overrides)"


def test_a_missing_unnamed_inventory_raises_bad_input(tmp_path):
    with pytest.raises(BadInventory, match=r"^no inventory: FABRIC_INVENTORY is not set and "):
        inventory_choice.choose(str(tmp_path / "nope.yml"), environ={})
