"""The inventory cache (train/inventory_cache.py) keeps no secret; `!vault` values work (train/inventory_vault.py)."""

from __future__ import annotations

import json
import stat
import textwrap

import pytest
from ansible.parsing.vault import VaultLib, VaultSecret

from train.cluster import ClusterError, load_hosts

PASSWORD = "correct horse"


def vaulted(plaintext: str) -> str:
    """`plaintext` as ansible-vault encrypt_string writes it under a `name: !vault |` line."""
    ciphertext = VaultLib([("default", VaultSecret(PASSWORD.encode()))]).encrypt(plaintext).decode()
    return "!vault |\n" + textwrap.indent(ciphertext, "  ")


@pytest.fixture
def inventory(tmp_path, monkeypatch):
    """An inventory with a become password and a cloud key in group_vars (one plain, one vaulted inline), and
    a price tandem reads, vaulted; the user's vault password in a file, as ansible-playbook finds it."""
    (tmp_path / "pass").write_text(PASSWORD + "\n")
    monkeypatch.setenv("ANSIBLE_VAULT_PASSWORD_FILE", str(tmp_path / "pass"))
    monkeypatch.setenv("TANDEM_CACHE", str(tmp_path / "cache"))
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "all.yml").write_text(
        "ansible_become_password: hunter2\n"
        "aws_secret_access_key: AKIAPLAINSECRET\n"
        f"vault_token: {vaulted('VAULTEDSECRET')}\n"
        f"hourly_usd: {vaulted('3.25')}\n")
    path = tmp_path / "mine.yml"
    path.write_text("cluster:\n  hosts:\n    gpu1:\n      ansible_host: 203.0.113.10\n      gpus: 2\n")
    return path


def cache_files(inventory) -> list:
    return sorted((inventory.parent / "cache" / "inventories").glob("*.json"))


def test_the_cache_keeps_only_tandems_variables_private_and_a_vaulted_one_sealed(inventory):
    hosts = load_hosts(inventory)
    assert hosts[0].var("hourly_usd") == 3.25 and hosts[0].gpus == 2  # decrypted with the user's password
    [cached] = cache_files(inventory)
    text = cached.read_text()
    for secret in ("hunter2", "AKIAPLAINSECRET", "VAULTEDSECRET", "3.25", "ansible_become_password",
                   "aws_secret_access_key", "vault_token"):
        assert secret not in text
    assert json.loads(text)[0][1]["hourly_usd"]["__ansible_vault"].startswith("$ANSIBLE_VAULT;")
    assert stat.S_IMODE(cached.stat().st_mode) == 0o600
    assert stat.S_IMODE(cached.parent.stat().st_mode) == 0o700
    again = load_hosts(inventory)  # from the cache now: the same hosts, the same variables
    assert again == hosts and again[0].vars == hosts[0].vars and "ansible_become_password" not in again[0].vars


def test_an_older_reading_of_the_inventory_and_the_old_layout_are_removed(inventory):
    load_hosts(inventory)
    [first] = cache_files(inventory)
    legacy = first.parent / ("0" * 24 + ".json")  # the layout before: every variable, passwords too
    legacy.write_text("[]")
    other = first.parent / ("f" * 16 + "-" + "0" * 24 + ".json")  # another inventory's: kept
    other.write_text("[]")
    inventory.write_text(inventory.read_text().replace("gpus: 2", "gpus: 4"))
    assert load_hosts(inventory)[0].gpus == 4
    assert [f.name for f in cache_files(inventory)] != [first.name]
    assert not first.exists() and not legacy.exists() and other.exists()


def test_a_vaulted_value_tandem_reads_without_the_password_names_host_variable_and_the_fix(inventory, monkeypatch):
    monkeypatch.delenv("ANSIBLE_VAULT_PASSWORD_FILE")
    with pytest.raises(ClusterError, match=r"^gpu1: hourly_usd is vaulted .*ANSIBLE_VAULT_PASSWORD_FILE"):
        load_hosts(inventory)


def test_a_vaulted_value_tandem_does_not_read_needs_no_password(inventory, monkeypatch):
    monkeypatch.delenv("ANSIBLE_VAULT_PASSWORD_FILE")
    (inventory.parent / "group_vars" / "all.yml").write_text(f"vault_token: {vaulted('VAULTEDSECRET')}\n")
    assert load_hosts(inventory)[0].var("hourly_usd") is None
