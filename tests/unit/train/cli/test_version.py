"""`fab version`: tandem's version from pyproject.toml, and the checkout's commit."""

from __future__ import annotations

import re
import tomllib

from train.cli import version
from train.cluster import TOP


def test_the_version_is_pyprojects_and_the_commit_the_checkouts():
    expected = tomllib.loads((TOP / "pyproject.toml").read_text())["project"]["version"]
    assert version.package_version() == expected
    assert re.fullmatch(rf"tandem {re.escape(expected)}( \(git [0-9a-f]{{7,}}(\+changes)?\))?", version.line())


def test_outside_a_checkout_there_is_no_commit(monkeypatch, tmp_path):
    monkeypatch.setattr(version, "TOP", tmp_path)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    assert version.git_commit() is None
