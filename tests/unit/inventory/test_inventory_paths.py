"""An inventory fab cannot read (train.onboard.inventory.readable), and one ansible-playbook cannot (ansible.cfg's
`[inventory]`): fab refuses it as bad input in one line, exit 2, before Ansible reads it (no pages of Ansible's
warnings, never every file of a directory); ansible-playbook fails instead of matching no host and exiting 0."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from train.errors import BadInventory
from train.onboard import inventory as inventory_choice

TOP = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
MINE = """all:
  vars: {ansible_user: nobody}
  children:
    cluster:
      hosts:
        alpha: {ansible_host: 127.0.0.1, ansible_port: 1, gpus: 0}
"""


def fab_status(inventory: Path | str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "FABRIC_INVENTORY": str(inventory), "TANDEM_CACHE": str(tmp_path / "cache"),
           "COLUMNS": "400"}
    return subprocess.run([str(BIN / "fab"), "status"], cwd=TOP, capture_output=True, text=True, timeout=120, env=env)


def refused_in_one_line(proc: subprocess.CompletedProcess) -> str:
    assert (proc.returncode, proc.stdout) == (2, ""), proc.stdout + proc.stderr[-3000:]
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: "), proc.stderr[-3000:]
    return proc.stderr.strip()


def test_a_missing_inventory_fabric_inventory_names_is_bad_input_without_the_labs_fix(tmp_path):
    said = refused_in_one_line(fab_status(tmp_path / "mine.yaml", tmp_path))
    assert said == (f"error: no inventory: FABRIC_INVENTORY names {tmp_path}/mine.yaml, which does not exist: write "
                    "yours with `fab init --hosts-at ADDRESSES --user USER` (README step 2), or name one: "
                    "export FABRIC_INVENTORY=FILE")


def test_the_labs_inventory_missing_names_make_lab_up(monkeypatch):
    monkeypatch.setattr(inventory_choice, "LAB", "inventory/lab-never-brought-up.yml")
    with pytest.raises(BadInventory) as refused:
        inventory_choice.load(None, say=pytest.fail, environ={"FABRIC_INVENTORY": "inventory/lab-never-brought-up.yml"})
    assert str(refused.value) == ("no inventory: FABRIC_INVENTORY names inventory/lab-never-brought-up.yml, which "
                                  "does not exist: the lab's: `make lab-up` writes it")


def test_a_directory_is_refused_unread(tmp_path):
    (tmp_path / "mine.yml").write_text(MINE)  # Ansible would read it, and every other file there
    said = refused_in_one_line(fab_status(tmp_path, tmp_path))
    assert said == (f"error: FABRIC_INVENTORY names {tmp_path}, a directory: name the inventory file in it "
                    f"(e.g. export FABRIC_INVENTORY={tmp_path}/mine.yml)")


def test_fabric_yamls_inventory_a_directory_or_not_yaml_is_refused_too(tmp_path):
    """fab's own inventory setting (fabric.yaml `inventory:`, `fab -f other.yaml`), not FABRIC_INVENTORY."""
    (tmp_path / "mine.yml").write_text(MINE)
    with pytest.raises(BadInventory) as refused:
        inventory_choice.load(str(tmp_path), say=pytest.fail, environ={})
    assert str(refused.value).startswith(f"fabric.yaml's inventory is {tmp_path}, a directory: name the inventory ")
    notes = tmp_path / "notes.txt"
    notes.write_text("alpha: [unclosed\n")
    with pytest.raises(BadInventory, match=r"^fabric.yaml's inventory is .*notes.txt, which is not YAML \(line 2"):
        inventory_choice.load(str(notes), say=pytest.fail, environ={})


def test_invalid_yaml_is_said_in_one_line_with_its_line(tmp_path):
    bad = tmp_path / "mine.yml"
    bad.write_text(MINE.replace("gpus: 0}", "gpus: 0"))
    said = refused_in_one_line(fab_status(bad, tmp_path))
    assert said.startswith(f"error: inventory {bad}, line 7: not valid YAML (")
    assert said.endswith("): fix that line (an indentation, a missing ':' or quote)")


def test_a_file_that_is_not_an_inventory_is_refused(tmp_path):
    said = refused_in_one_line(fab_status("README.md", tmp_path))
    assert said.startswith("error: FABRIC_INVENTORY names README.md, which is not YAML (line ")
    listed = tmp_path / "hosts.yml"
    listed.write_text("- alpha\n- beta\n")
    assert refused_in_one_line(fab_status(listed, tmp_path)) == (
        f"error: FABRIC_INVENTORY names {listed}, which is no inventory: a YAML inventory names its groups "
        "(all:, cluster:) or a cloud's plugin: at the top (fab init writes one)")


def test_yaml_and_ini_inventories_are_still_read(tmp_path):
    mine = tmp_path / "mine.yml"
    mine.write_text(MINE)
    ini = tmp_path / "hosts.ini"
    ini.write_text("[cluster]\nalpha ansible_host=127.0.0.1 ansible_port=1 ansible_user=nobody gpus=0\n")
    for path in (mine, ini):
        hosts = inventory_choice.load(None, say=pytest.fail, environ={"FABRIC_INVENTORY": str(path)})
        assert [(h.name, h.address, h.port) for h in hosts] == [("alpha", "127.0.0.1", 1)]


def playbook(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "ansible-playbook"), "provision.yml", "--list-hosts", *args], cwd=TOP,
                          capture_output=True, text=True, timeout=300)


def test_ansible_playbook_fails_on_a_misspelled_inventory_or_a_pattern_matching_no_host(tmp_path):
    misspelled = playbook("-i", str(tmp_path / "mine.yaml"))
    assert misspelled.returncode != 0, misspelled.stdout[-2000:]
    assert f"Completely failed to parse inventory source {tmp_path}/mine.yaml" in misspelled.stderr
    unparsable = tmp_path / "mine.yml"
    unparsable.write_text(MINE.replace("gpus: 0}", "gpus: 0"))
    assert playbook("-i", str(unparsable)).returncode != 0
    nobody = playbook("-i", "inventory/hosts.yml", "--limit", "v100z")
    assert nobody.returncode != 0 and "Could not match supplied host pattern" in nobody.stderr
    example = playbook("-i", "inventory/hosts.yml")  # the same command with hosts to match: listed, exit 0
    assert example.returncode == 0 and "v100a" in example.stdout, example.stderr[-2000:]
