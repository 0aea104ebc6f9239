"""fairseq rewrites checkpoint_last.pt in place at every save: the controller's copy is one
whole checkpoint, read while the file held still, or the previous copy stays."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from train.cluster import ClusterError, Host
from train.run import checkpoints


class _RewrittenWhileRead:
    """A host whose checkpoint_last.pt is saved again during the first `rewrites` reads."""

    def __init__(self, rewrites: int, lost_at_read: int | None = None):
        self.rewrites, self.version, self.reads, self.lost_at_read = rewrites, 1, 0, lost_at_read
        self.transport = SimpleNamespace(set_keepalive=lambda s: None)
        channel = SimpleNamespace(settimeout=lambda s: None)
        self._sftp = SimpleNamespace(get_channel=lambda: channel)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def open(self):
        pass

    def sftp(self):
        return self._sftp

    def run(self, command, **kwargs):
        if "checkpoint_best" in command:
            return SimpleNamespace(ok=False, stdout="")
        return SimpleNamespace(ok=True, stdout=f"1000 2026-11-23 12:00:0{self.version}.0 +0000\n")

    def get(self, remote, local):
        self.reads += 1
        if self.reads == self.lost_at_read:
            raise TimeoutError("no byte for 60 s")
        with open(local, "wb") as f:
            f.write(f"first half of save {self.version}|".encode())
            if self.rewrites:
                self.rewrites, self.version = self.rewrites - 1, self.version + 1
            f.write(f"second half of save {self.version}".encode())


@pytest.fixture
def host(monkeypatch):
    def use(conn):
        monkeypatch.setattr(checkpoints, "connect", lambda h: conn)
        return Host(name="v100a", address="10.0.0.1")

    return use


def test_a_save_during_the_copy_is_read_again_whole(tmp_path, host):
    source = host(_RewrittenWhileRead(rewrites=1))
    assert checkpoints.fetch_checkpoints(source, "/data/run/checkpoints", tmp_path) == ["checkpoint_last.pt"]
    assert (tmp_path / "checkpoint_last.pt").read_text() == "first half of save 2|second half of save 2"
    assert not list(tmp_path.glob(".*.fetched"))


def test_saves_during_every_copy_keep_the_previous_copy_and_say_so(tmp_path, host):
    (tmp_path / "checkpoint_last.pt").write_text("the previous, whole checkpoint")
    source = host(_RewrittenWhileRead(rewrites=3))
    with pytest.raises(ClusterError, match=r"v100a: .*checkpoint_last\.pt changed during each of 3 copies"):
        checkpoints.fetch_checkpoints(source, "/data/run/checkpoints", tmp_path)
    assert (tmp_path / "checkpoint_last.pt").read_text() == "the previous, whole checkpoint"
    assert not list(tmp_path.glob(".*.fetched"))


def test_a_host_lost_during_a_second_read_leaves_the_previous_copy_and_no_candidate(tmp_path, host):
    (tmp_path / "checkpoint_last.pt").write_text("the previous, whole checkpoint")
    source = host(_RewrittenWhileRead(rewrites=1, lost_at_read=2))
    with pytest.raises(TimeoutError):
        checkpoints.fetch_checkpoints(source, "/data/run/checkpoints", tmp_path)
    assert (tmp_path / "checkpoint_last.pt").read_text() == "the previous, whole checkpoint"
    assert not list(tmp_path.glob(".*.fetched"))
