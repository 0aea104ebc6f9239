"""A host whose network vanishes mid-request never holds up `fab train`: run_all with a timeout
answers for every host, the silent one included, within its deadline.

The host is a real SSH server on loopback (paramiko's) that authenticates the client and then
never answers the exec request: what the controller sees when a host's link goes down between
the handshake and the reply. paramiko alone would wait for that reply forever."""

from __future__ import annotations

import socket
import threading
import time

import paramiko
import pytest

from train import cluster
from train.cluster import Host, run_all


class _Silent(paramiko.ServerInterface):
    def __init__(self, release: threading.Event):
        self.release = release

    def get_allowed_auths(self, username):
        return "publickey"

    def check_auth_publickey(self, username, key):
        return paramiko.AUTH_SUCCESSFUL

    def check_channel_request(self, kind, chanid):
        return paramiko.OPEN_SUCCEEDED

    def check_channel_exec_request(self, channel, command):
        self.release.wait(120)  # the reply that never comes (until the test ends)
        return False


@pytest.fixture
def silent_host(tmp_path):
    host_key = paramiko.Ed25519Key.generate() if hasattr(paramiko.Ed25519Key, "generate") else None
    if host_key is None:
        host_key = paramiko.RSAKey.generate(2048)
    client_key = paramiko.RSAKey.generate(2048)
    client_key.write_private_key_file(str(tmp_path / "id"))
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{port} {host_key.get_name()} {host_key.get_base64()}\n")
    release, transports = threading.Event(), []

    def serve():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            transport = paramiko.Transport(conn)
            transport.add_server_key(host_key)
            transport.start_server(server=_Silent(release))
            transports.append(transport)

    threading.Thread(target=serve, daemon=True).start()
    yield Host("v100b", "127.0.0.1", port=port, key=str(tmp_path / "id"), known_hosts=str(known))
    release.set()
    listener.close()
    for transport in transports:
        transport.close()


def test_a_host_silent_after_the_handshake_is_named_within_the_deadline(silent_host, monkeypatch):
    monkeypatch.setattr(cluster, "CONNECT_S", 1.0)  # the deadline: timeout + CONNECT_S + 5 s
    answers: dict = {}
    caller = threading.Thread(target=lambda: answers.update(run_all([silent_host], "true", timeout=1)), daemon=True)
    started = time.monotonic()
    caller.start()
    caller.join(60)
    assert not caller.is_alive(), "run_all still waits on the silent host after 60 s"
    said = answers["v100b"]
    assert not said.reachable and isinstance(said.error, TimeoutError), said
    assert "unreachable (no answer within 7 s" in said.why, said.why
    assert time.monotonic() - started < 30
