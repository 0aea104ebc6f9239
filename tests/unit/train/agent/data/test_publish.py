"""The runner publishes a dataset whole where training reads it, and leaves an identical one alone."""

from __future__ import annotations

from train.agent.data.__main__ import manifest_sum, publish


def made(directory, content: str):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "train.en-de.en.bin").write_text(content)
    (directory / "MANIFEST.sha256").write_text(f"{content}  train.en-de.en.bin\n")
    return directory


def test_a_new_dataset_replaces_the_old_one_whole_and_the_same_one_is_left_alone(tmp_path):
    dest = tmp_path / "datasets" / "wmt16"
    dest.parent.mkdir()
    assert publish(made(tmp_path / "v1", "one"), dest)
    assert (dest / "train.en-de.en.bin").read_text() == "one"
    stamp = (dest / "MANIFEST.sha256").stat().st_mtime_ns
    assert not publish(made(tmp_path / "v1", "one"), dest)  # a re-run that changes nothing
    assert (dest / "MANIFEST.sha256").stat().st_mtime_ns == stamp
    assert publish(made(tmp_path / "v2", "two"), dest)
    assert (dest / "train.en-de.en.bin").read_text() == "two"
    assert manifest_sum(dest) == manifest_sum(tmp_path / "v2")
    assert sorted(p.name for p in dest.parent.iterdir()) == ["wmt16"]  # no .incoming or .old left
