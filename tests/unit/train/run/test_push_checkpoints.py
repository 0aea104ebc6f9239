"""The line that copies rank 0's checkpoints to the peers, run here with a stand-in rsync."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

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


class TwoHosts:
    """The push line run here for real (rsync, cmp, stat, cp), the peer a directory of its own: a
    stand-in ssh runs the peer's side with the sender's paths moved under `peer_root`. Every rsync
    the sender starts is logged with the files it was given; a `replace-last` file, where present,
    is renamed over checkpoint_last.pt by the next such rsync before it starts, a `rewrite-last` file
    copied onto it in place, a `rewrite-last-after` one once that rsync is done (fairseq saving while
    a push is under way: checkpoints[0] by a rename, the others by shutil.copyfile, in place)."""

    def __init__(self, tmp_path):
        self.tmp = tmp_path
        self.save_dir = tmp_path / "v100a" / "checkpoints"
        self.peer_dir = tmp_path / "v100b" / "checkpoints"
        self.bin, home = tmp_path / "bin", tmp_path / "home"
        self.saves = 0
        for d in (self.save_dir, self.bin, home / ".ssh", tmp_path / "tmp"):
            d.mkdir(parents=True)
        (home / ".ssh" / "tandem_cluster").write_text("a key\n")
        self.sent = tmp_path / "sent.log"
        self.env = {"PATH": f"{self.bin}:/usr/bin:/bin", "HOME": str(home), "TMPDIR": str(tmp_path / "tmp")}
        ssh = self.bin / "ssh"
        ssh.write_text(f"""#!/bin/sh
while [ "${{1#-}}" != "$1" ]; do shift 2; done
shift  # the login
exec sh -c "$(echo "$*" | sed 's#{tmp_path}/v100a/#{tmp_path}/v100b/#g')"
""")
        rsync = self.bin / "rsync"
        rsync.write_text(f"""#!/bin/sh
case "$*" in *--server*) exec /usr/bin/rsync "$@";; esac
if [ -f {tmp_path}/replace-last ]; then mv {tmp_path}/replace-last {self.save_dir}/checkpoint_last.pt; fi
rewrite() {{
  cat {tmp_path}/$1 > {self.save_dir}/checkpoint_last.pt; rm {tmp_path}/$1
  touch -d @$(( $(date +%s) + 600 )) {self.save_dir}/checkpoint_last.pt  # minutes later, as saves are
}}
if [ -f {tmp_path}/rewrite-last ]; then rewrite rewrite-last; fi
for word in "$@"; do case "$word" in *.pt) basename "$word" >> {self.sent};; esac; done
echo -- >> {self.sent}
/usr/bin/rsync "$@"; rc=$?
if [ -f {tmp_path}/rewrite-last-after ]; then rewrite rewrite-last-after; fi
exit $rc
""")
        for tool in (ssh, rsync):
            tool.chmod(0o755)

    def save(self, name: str, data: bytes) -> None:
        """As fairseq does: written under another name, then renamed (a new inode); saves are minutes
        apart (rsync's quick check compares whole seconds)."""
        (self.tmp / "saving").write_bytes(data)
        self.saves += 1
        os.utime(self.tmp / "saving", (time.time() + 60 * self.saves,) * 2)
        (self.tmp / "saving").rename(self.save_dir / name)

    def copy_to_best(self) -> None:
        """fairseq's checkpoint_best.pt at a save that improved: a copy of the file it just wrote."""
        (self.save_dir / "checkpoint_best.pt").write_bytes((self.save_dir / "checkpoint_last.pt").read_bytes())

    def push(self) -> list[list[str]]:
        """Run the push; the files each rsync the sender started was given."""
        self.sent.write_text("")
        peer = Host("v100b", "10.0.0.2", user="debian", cluster_address="172.30.0.12")
        out = subprocess.run(["sh", "-c", checkpoints.push_command(str(self.save_dir), [peer])],
                             capture_output=True, text=True, timeout=60, env=self.env)
        assert out.stdout.split()[:2] == ["v100b", "0"], out
        return [chunk.split() for chunk in self.sent.read_text().split("--")[:-1]]

    def peer(self, name: str) -> bytes:
        return (self.peer_dir / name).read_bytes()


def test_a_best_that_is_a_copy_of_last_crosses_the_network_once(tmp_path):
    """At a save that improved, best is last's copy: last alone is sent, the peer makes best from
    it, with the sender's time on it, so the next push sends no best at all (rsync's quick check)."""
    hosts = TwoHosts(tmp_path)
    hosts.save("checkpoint_last.pt", b"update 10" * 10_000)
    hosts.copy_to_best()
    assert hosts.push() == [["checkpoint_last.pt"]]
    assert hosts.peer("checkpoint_best.pt") == hosts.peer("checkpoint_last.pt") == b"update 10" * 10_000
    sender_best, peer_best = (d / "checkpoint_best.pt" for d in (hosts.save_dir, hosts.peer_dir))
    assert peer_best.stat().st_mtime_ns == sender_best.stat().st_mtime_ns
    assert not list(hosts.peer_dir.glob(".*"))

    # a save that did not improve: a new last, best as it was; rsync is given both and leaves the
    # peer's best alone (the same size and time: not sent, not even rewritten)
    made = peer_best.stat().st_ino
    hosts.save("checkpoint_last.pt", b"update 20" * 10_000)
    assert [sorted(files) for files in hosts.push()] == [["checkpoint_best.pt", "checkpoint_last.pt"]]
    assert hosts.peer("checkpoint_last.pt") == b"update 20" * 10_000
    assert hosts.peer("checkpoint_best.pt") == b"update 10" * 10_000
    assert peer_best.stat().st_ino == made


@pytest.mark.parametrize("how", ["replace-last", "rewrite-last", "rewrite-last-after"])
def test_a_last_saved_again_while_it_was_sent_goes_again_with_best_as_itself(tmp_path, how):
    """fairseq saved again during the push (a new file renamed over last, or copied onto it in place,
    before or after rsync read it): what reached the peer as last may be neither save's whole, and
    is not best's copy, so both go again as themselves: the peer ends with the new last and the old
    best, never best made from a last it did not match."""
    hosts = TwoHosts(tmp_path)
    hosts.save("checkpoint_last.pt", b"update 10" * 10_000)
    hosts.copy_to_best()
    (tmp_path / how).write_bytes(b"update 20" * 10_000)
    assert [sorted(files) for files in hosts.push()] == [["checkpoint_last.pt"],
                                                         ["checkpoint_best.pt", "checkpoint_last.pt"]]
    assert hosts.peer("checkpoint_last.pt") == b"update 20" * 10_000
    assert hosts.peer("checkpoint_best.pt") == b"update 10" * 10_000
