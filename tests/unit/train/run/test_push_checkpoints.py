"""The line that copies rank 0's checkpoints to the peers, run here with a stand-in rsync."""

from __future__ import annotations

import subprocess

from train.cluster import Host
from train.run import checkpoints


def test_a_copy_that_failed_says_why_from_files_of_its_own_and_leaves_none(tmp_path):
    """rsync's words come back per peer from a directory this call made (a fixed name in /tmp can be
    another login user's file, which the next user, root included, may not write), removed afterwards."""
    bin_dir, home, tmp = tmp_path / "bin", tmp_path / "home", tmp_path / "tmp"
    for d in (bin_dir, home / ".ssh", tmp):
        d.mkdir(parents=True)
    rsync = bin_dir / "rsync"
    rsync.write_text("#!/bin/sh\necho 'ssh: connect to host 172.30.0.12 port 22: No route to host' >&2\nexit 255\n")
    rsync.chmod(0o755)
    (home / ".ssh" / "tandem_cluster").write_text("a key\n")
    peer = Host("v100b", "10.0.0.2", user="debian", cluster_address="172.30.0.12")
    line = checkpoints.push_command("/data/tandem/runs/r/checkpoints", [peer])
    assert "/tmp" not in line
    out = subprocess.run(["sh", "-c", line], capture_output=True, text=True, timeout=30,
                         env={"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(home), "TMPDIR": str(tmp)})
    assert out.stdout.strip() == "v100b 255 ssh: connect to host 172.30.0.12 port 22: No route to host", out
    assert list(tmp.iterdir()) == []
