"""A dataset's name becomes a directory on every host: one a shell or rsync would split is refused first."""

from __future__ import annotations

import pytest

from train.cluster import ClusterError
from train.data import prepare


def test_the_default_names_pass():
    assert prepare.check_name(prepare.default_name(None, False)) == "synthetic"
    assert prepare.check_name(prepare.default_name(None, True)) == "wmt16"
    assert prepare.check_name(prepare.default_name("/home/me/corpora/en-de_v2.1", False)) == "en-de_v2.1"


@pytest.mark.parametrize("name", ["my corpus", "a;b", "../up", "-x", "dé"])
def test_a_name_a_shell_would_split_is_refused_before_anything_is_prepared(name, tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_CACHE", str(tmp_path))
    with pytest.raises(ClusterError, match="letters, digits, '.', '_' and '-' only"):
        prepare.prepare_data([], console=None, name=name)
    assert not (tmp_path / "data").exists()
