"""sftp:// targets check the server's host key against known_hosts (train.agent.offsite.sftp): an
unknown key, or another key than known_hosts holds (an impostor at the address), is refused naming the
host and the fix, and nothing is written there. A paramiko SFTP server on loopback; the host's HOME (its
~/.ssh: a client key, known_hosts) a temporary directory."""

from __future__ import annotations

import paramiko
import pytest

from tests.unit.train.agent.offsite.sftp_server import Server
from train.agent.offsite import copies
from train.agent.offsite import sftp as offsite_sftp
from train.agent.offsite.target import parse


@pytest.fixture
def home(tmp_path, monkeypatch):
    """The training user's HOME: a client key in ~/.ssh, no agent, no system known_hosts."""
    ssh = tmp_path / "home" / ".ssh"
    ssh.mkdir(parents=True)
    paramiko.RSAKey.generate(2048).write_private_key_file(str(ssh / "id_rsa"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    monkeypatch.setattr(offsite_sftp, "SYSTEM_KNOWN_HOSTS", str(tmp_path / "no-system-known-hosts"))
    return ssh


@pytest.fixture
def server(tmp_path):
    (tmp_path / "served" / "srv" / "ckpts").mkdir(parents=True)
    with Server(tmp_path / "served") as s:
        yield s


def known(ssh, port: int, key: paramiko.PKey) -> None:
    (ssh / "known_hosts").write_text(f"[127.0.0.1]:{port} {key.get_name()} {key.get_base64()}\n")


def test_a_server_whose_key_known_hosts_holds_takes_the_copies(home, server, tmp_path):
    known(home, server.port, server.key)
    url = f"sftp://127.0.0.1:{server.port}/srv/ckpts"
    copies.check(url, "v100a")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "checkpoint_last.pt").write_bytes(b"weights" * 1000)
    made = copies.upload(parse(url), "r1", "last", 10, {"checkpoint_last.pt": tmp_path / "src" / "checkpoint_last.pt"})
    assert made["where"] == f"{url}/r1/u10"
    assert (tmp_path / "served" / "srv" / "ckpts" / "r1" / "u10" / "manifest.json").exists()


@pytest.mark.parametrize("held", ["another key", "no key"])
def test_an_unknown_or_changed_host_key_is_refused_naming_the_host_and_the_fix(home, server, tmp_path, held):
    if held == "another key":  # an impostor answers at the address known_hosts knows another key for
        known(home, server.port, paramiko.RSAKey.generate(2048))
    url = f"sftp://127.0.0.1:{server.port}/srv/ckpts"
    with pytest.raises(copies.OffsiteError) as refused:
        copies.check(url, "v100a")
    said = str(refused.value)
    assert "127.0.0.1" in said and "known_hosts" in said
    assert f"ssh-keyscan -p {server.port} 127.0.0.1 >> ~/.ssh/known_hosts" in said and "on v100a" in said
    if held == "another key":
        assert f"ssh-keygen -R '[127.0.0.1]:{server.port}'" in said
    assert not list((tmp_path / "served" / "srv" / "ckpts").iterdir())  # nothing written there
