"""A keeper's spec (the run's heartbeat token) is never readable by another user of the host, not even
for the moment between the copy and a chmod (issue 54)."""

from __future__ import annotations

import os
import subprocess

from train.hosts.private_files import put_private


class LocalHost:
    """A connection to this machine: its shell for `run`, a file opened as an SFTP server opens one
    (created with umask 022: 0644) for `put`; each put notes the file's mode as the first byte lands."""

    def __init__(self):
        self.modes_at_put: list[int] = []

    def run(self, line: str, **_):
        return subprocess.run(["bash", "-c", line], check=True, capture_output=True, text=True)

    def put(self, stream, path: str):
        old = os.umask(0o022)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        finally:
            os.umask(old)
        self.modes_at_put.append(os.fstat(fd).st_mode & 0o777)
        with os.fdopen(fd, "wb") as f:
            f.write(stream.read())


def test_a_spec_is_the_owners_alone_from_its_first_byte(tmp_path):
    host, spec = LocalHost(), tmp_path / "spec.json"
    put_private(host, b'{"token": "t1"}', str(spec))
    assert host.modes_at_put == [0o600] and spec.stat().st_mode & 0o777 == 0o600
    spec.chmod(0o644)  # a spec written before issue 54
    put_private(host, b'{"token": "t2"}', str(spec))
    assert host.modes_at_put[-1] == 0o600 and spec.read_bytes() == b'{"token": "t2"}'
