"""A connection to a host notices a vanished network on a Linux controller and on a macOS one."""

from __future__ import annotations

import socket

import pytest

from train import cluster


class Recorder:
    def __init__(self):
        self.options = {}

    def setsockopt(self, level, option, value):
        self.options[(level, option)] = value


@pytest.mark.skipif(not hasattr(socket, "TCP_USER_TIMEOUT"), reason="Linux's socket options")
def test_a_linux_socket_gets_keepalive_and_a_bound_on_unacknowledged_data():
    with socket.socket() as sock:
        cluster.dead_link_options(sock)
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 10
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == 5
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == 4
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == cluster.DEAD_LINK_S * 1000


def test_on_macos_the_idle_time_is_tcp_keepalive_and_there_is_no_user_timeout(monkeypatch):
    """macOS's socket module (as Python builds it there): TCP_KEEPALIVE = 0x10 is the idle time,
    TCP_KEEPINTVL 0x101, TCP_KEEPCNT 0x102, no TCP_KEEPIDLE, no TCP_USER_TIMEOUT."""
    for name in ("TCP_KEEPIDLE", "TCP_USER_TIMEOUT"):
        monkeypatch.delattr(socket, name, raising=False)
    for name, value in (("TCP_KEEPALIVE", 0x10), ("TCP_KEEPINTVL", 0x101), ("TCP_KEEPCNT", 0x102)):
        monkeypatch.setattr(socket, name, value, raising=False)
    sock = Recorder()
    cluster.dead_link_options(sock)
    assert sock.options == {(socket.SOL_SOCKET, socket.SO_KEEPALIVE): 1, (socket.IPPROTO_TCP, 0x10): 10,
                            (socket.IPPROTO_TCP, 0x101): 5, (socket.IPPROTO_TCP, 0x102): 4}
