"""A dataset on every host: a copy that does not match its manifest, or a host lost after the copy, is named;
a receiver without the room for it is refused before anything is copied, naming host, need and free."""

from __future__ import annotations

import io
import shutil
import subprocess
import threading

import pytest

from train.cluster import ClusterError, GroupResult, Host, HostResult
from train.data import distribute

HOSTS = [Host("v100a", "10.0.0.1"), Host("v100b", "10.0.0.2"), Host("v100c", "10.0.0.3")]


def copied(monkeypatch, answers: GroupResult) -> None:
    monkeypatch.setattr(distribute, "run_all", lambda hosts, command, **kw: answers)


def test_every_host_holds_the_same_dataset(monkeypatch, tmp_path):
    copied(monkeypatch, GroupResult((h.name, HostResult(h.name, stdout="ab12  MANIFEST.sha256\n", exited=0))
                                    for h in HOSTS))
    assert distribute.check_copies(HOSTS, "synthetic") == {"v100a": "ab12", "v100b": "ab12", "v100c": "ab12"}


def test_a_mismatch_and_a_lost_host_are_named(monkeypatch, tmp_path):
    copied(monkeypatch, GroupResult({
        "v100a": HostResult("v100a", stdout="ab12  MANIFEST.sha256\n", exited=0),
        "v100b": HostResult("v100b", error=OSError("No route to host")),
        "v100c": HostResult("v100c", stdout="train.en-de.en.bin: FAILED\n", exited=1)}))
    with pytest.raises(ClusterError) as err:
        distribute.check_copies(HOSTS, "synthetic")
    assert str(err.value).splitlines() == [
        "dataset not on every host:",
        "  v100b: unreachable after the copy: No route to host",
        "  v100c: the copy in /data/tandem/datasets/synthetic/ does not match its manifest: "
        "train.en-de.en.bin: FAILED"]


FAKE_SSH = """#!/bin/sh
# ssh [options] HOST COMMAND...: run COMMAND here, as ssh would run it on HOST (through a shell)
while [ $# -gt 0 ]; do
  case $1 in -p|-o|-i|-l) shift 2 ;; -*) shift ;; *) break ;; esac
done
shift
exec sh -c "$*"
"""


@pytest.mark.skipif(not shutil.which("rsync"), reason="no rsync on this controller")
def test_the_copy_creates_a_missing_destination_without_rsync_mkpath(tmp_path):
    """macOS's rsync (2.6.9, or openrsync) has no --mkpath: the host creates the directory itself
    (`mkdir -p` in --rsync-path). Run for real with this machine's rsync, the host's ssh a stand-in."""
    src = tmp_path / "bin"
    (src / "sub").mkdir(parents=True)
    (src / "dict.en.txt").write_text("hallo 3\n")
    (src / "sub" / "x.bin").write_bytes(b"\0\1")
    dest = tmp_path / "data" / "tandem" / "datasets" / "my set"  # three levels missing, a space in the name
    argv = distribute.rsync_command(src, Host("v100a", "10.0.0.1", key="/k/id_ed25519", known_hosts="/k/kh"),
                                    f"{dest}/")
    assert "--mkpath" not in argv
    options = [a for a in argv if a.startswith("-") and not a.startswith("--rsync-path=")]
    assert options == ["-a", "--delete", "--stats", "-e"]
    ssh = tmp_path / "ssh"
    ssh.write_text(FAKE_SSH)
    ssh.chmod(0o755)
    argv[argv.index("-e") + 1] = f"{ssh} {argv[argv.index('-e') + 1].removeprefix('ssh ')}"
    for _ in range(2):  # a second copy into the now existing directory as well
        done = subprocess.run(argv, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
    assert (dest / "dict.en.txt").read_text() == "hallo 3\n" and (dest / "sub" / "x.bin").read_bytes() == b"\0\1"


def test_a_receiver_without_room_is_refused_naming_host_need_and_free(monkeypatch):
    copied(monkeypatch, GroupResult({"v100b": HostResult("v100b", stdout="5000000000\n", exited=0),
                                     "v100c": HostResult("v100c", stdout="300000000\n", exited=0)}))
    with pytest.raises(ClusterError) as err:
        distribute.check_receivers_disk(HOSTS[1:], need=1_200_000_000)
    assert str(err.value).splitlines() == [
        "dataset not copied:",
        "  v100c: not enough disk for the dataset in /data/tandem/datasets: needs 1.20 GB, 0.30 GB free"]


def test_the_host_to_host_copy_shows_each_receivers_bytes_as_they_arrive(monkeypatch):
    """A GB dataset over the cluster link is minutes: a bar per receiver follows what it holds (du
    there, asked every few seconds), and is full once the copy is whole."""
    from rich.console import Console

    asked = []

    def du(hosts, name):
        asked.append(([h.name for h in hosts], name))
        return {"v100b": 1_000_000, "v100c": 400_000}

    monkeypatch.setattr(distribute, "held_bytes", du)
    console = Console(record=True, width=120, force_terminal=False)
    with distribute.copy_progress(console, HOSTS[0], HOSTS[1:], "synthetic", 2_900_000, every_s=0.01) as bars:
        for _ in range(500):  # the poller's first answer drawn (its thread: up to 5 s on a loaded machine)
            if [task.completed for task in bars.bars.tasks] == [1_000_000, 400_000]:
                break
            threading.Event().wait(0.01)
        assert [task.completed for task in bars.bars.tasks] == [1_000_000, 400_000]
    out = console.export_text()
    assert "copy v100a → v100b" in out and "copy v100a → v100c" in out, out
    assert asked[0] == (["v100b", "v100c"], "synthetic")
    assert out.count("2.9/2.9 MB") == 2, out


def test_a_receivers_bar_never_passes_the_dataset_and_one_that_did_not_answer_stays():
    """rsync's temporary files are counted by du until renamed, over the old files they replace."""
    from rich.console import Console

    bars = distribute.CopyBars(Console(file=io.StringIO()), "v100a", ["v100b", "v100c"], 2_900_000)
    bars.update({"v100b": 1_000_000, "v100c": 500_000})
    bars.update({"v100b": 3_100_000})
    assert [task.completed for task in bars.bars.tasks] == [2_900_000, 500_000]
    bars.close(done=False)


def test_a_copy_that_fails_leaves_its_bars_where_they_were(monkeypatch):
    from rich.console import Console

    monkeypatch.setattr(distribute, "held_bytes", lambda hosts, name: {"v100b": 1_000_000})
    console = Console(record=True, width=120, force_terminal=False)
    with pytest.raises(ClusterError), distribute.copy_progress(console, HOSTS[0], HOSTS[1:2], "synthetic",
                                                                2_900_000, every_s=0.01):
        threading.Event().wait(0.1)
        raise ClusterError("copying the dataset from v100a host to host failed for: v100b 12")
    assert "2.9/2.9 MB" not in console.export_text()
