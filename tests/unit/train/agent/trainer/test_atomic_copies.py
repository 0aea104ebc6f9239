"""fairseq's checkpoint copies (best -> last) land whole: a hard link taken at any moment is a whole file."""

import os

import pytest

pytest.importorskip("fairseq")


def test_a_checkpoint_copy_replaces_the_file_it_overwrites_by_rename(tmp_path):
    from fairseq.file_io import PathManager

    from train.agent.trainer.fairseq_train import atomic_checkpoint_copies

    atomic_checkpoint_copies()
    best, last = tmp_path / "checkpoint_best.pt", tmp_path / "checkpoint_last.pt"
    last.write_bytes(b"old" * 1000)
    snapshot = tmp_path / "snapshot.pt"
    os.link(last, snapshot)  # what the keeper holds while fairseq saves again
    best.write_bytes(b"new" * 2000)
    assert PathManager.copy(str(best), str(last), overwrite=True)
    assert last.read_bytes() == b"new" * 2000
    assert snapshot.read_bytes() == b"old" * 1000  # the old inode was replaced, never written into
    assert not list(tmp_path.glob("*.tandem-copy"))
