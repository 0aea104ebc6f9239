"""A copy off a host is whole or absent: a host lost mid-copy leaves no half checkpoint."""

from __future__ import annotations

import pytest

from train.cluster import get_whole


class _Channel:
    def __init__(self):
        self.timeout = None

    def settimeout(self, seconds):
        self.timeout = seconds


class _Sftp:
    def __init__(self):
        self.channel = _Channel()

    def get_channel(self):
        return self.channel


class _Transport:
    def set_keepalive(self, seconds):
        self.keepalive = seconds


class _Conn:
    """Fabric's Connection as get_whole uses it; `get` writes part of the file, then the host goes."""

    def __init__(self, payload: bytes, fail_after: int | None = None):
        self.payload, self.fail_after = payload, fail_after
        self.transport, self._sftp = _Transport(), _Sftp()

    def open(self):
        pass

    def sftp(self):
        return self._sftp

    def get(self, remote, local):
        with open(local, "wb") as f:
            if self.fail_after is None:
                f.write(self.payload)
                return
            f.write(self.payload[: self.fail_after])
        raise TimeoutError("no byte for 60 s")


def test_a_copy_cut_off_midway_leaves_the_previous_copy_and_no_part(tmp_path):
    local = tmp_path / "checkpoint_last.pt"
    local.write_bytes(b"the previous, whole checkpoint")
    conn = _Conn(b"x" * 1000, fail_after=300)
    with pytest.raises(TimeoutError):
        get_whole(conn, "/data/tandem/runs/r/checkpoints/checkpoint_last.pt", str(local), stall_s=60)
    assert local.read_bytes() == b"the previous, whole checkpoint"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint_last.pt"]
    assert conn.sftp().get_channel().timeout == 60  # a stalled copy gives up instead of hanging


def test_a_whole_copy_replaces_the_previous_one(tmp_path):
    local = tmp_path / "checkpoint_last.pt"
    local.write_bytes(b"old")
    get_whole(_Conn(b"new" * 10), "/remote", str(local))
    assert local.read_bytes() == b"new" * 10
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint_last.pt"]
