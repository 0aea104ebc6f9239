"""A copy's manifest names its files; a name that is not a plain file name (a path, `..`, absolute, empty,
hidden) is refused by name before anything is written: a bucket writer's `"/.." * 16 + path` overwrote a
stand-in authorized_keys (issue 54)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from train.agent.offsite import copies as offsite_copies
from train.agent.offsite.target import parse

BODY = b"ssh-ed25519 AAAA attacker\n"


def planted(share: Path, name: str, also: dict[str, bytes] | None = None) -> str:
    """A copy under the directory store `share` whose manifest names `name` (and `also`), each file there
    where the store reads it, sizes and sha256 matching; its URL."""
    target = parse(str(share / "r1" / "u10"))
    files = {**(also or {}), name: BODY}  # the copy's folder first
    for each, body in files.items():
        where = Path(target.path(each))
        if not where.is_dir():  # "", ".", "..": the copy's folder or its parent
            where.parent.mkdir(parents=True, exist_ok=True)
            where.write_bytes(body)
    manifest = {"run": "r1", "update": 10, "time": 1.0,
                "files": {n: {"size": len(b), "sha256": hashlib.sha256(b).hexdigest()} for n, b in files.items()}}
    (share / "r1" / "u10" / "manifest.json").write_text(json.dumps(manifest))
    return str(share / "r1" / "u10")


@pytest.mark.parametrize("name", ["../../etc/x", "sub/x", "..", ".", "", ".ssh", ".x.incoming", "a\\b",
                                  "x\n", "/abs"])
def test_a_manifest_naming_anything_but_a_plain_file_name_is_refused_before_anything_is_written(tmp_path, name):
    (tmp_path / "share").mkdir()
    url = planted(tmp_path / "share", name if name != "/abs" else str(tmp_path / "abs" / "x"),
                  also={"checkpoint_last.pt": b"weights"})
    dest = tmp_path / "a" / "b" / "dest"
    with pytest.raises(offsite_copies.OffsiteError) as refused:
        offsite_copies.fetch(url, dest)
    said = str(refused.value)
    assert said.startswith(f"{url}: ") and "plain file name" in said and "\n" not in said
    assert not dest.exists()  # nothing written, not even the good file
    assert not (tmp_path / "a" / "etc").exists() and not (tmp_path / "abs" / "x").exists()


def test_plain_names_are_fetched(tmp_path):
    (tmp_path / "share").mkdir()
    url = planted(tmp_path / "share", "checkpoint_last.pt", also={"run.json": b"{}"})
    offsite_copies.fetch(url, tmp_path / "dest")
    assert sorted(p.name for p in (tmp_path / "dest").iterdir()) == ["checkpoint_last.pt", "run.json"]


def test_the_issues_climb_out_of_the_store_is_refused_and_nothing_lands_where_it_points(tmp_path):
    """issue 54's own manifest: `"/.." * 16 + path` climbs out of any destination to an absolute path."""
    aimed = tmp_path / "home" / ".ssh" / "authorized_keys"
    copy = tmp_path / "share" / "r1" / "u10"
    copy.mkdir(parents=True)
    name = "/.." * 16 + str(aimed)
    (copy / "manifest.json").write_text(json.dumps({"run": "r1", "update": 10, "files": {
        name: {"size": len(BODY), "sha256": hashlib.sha256(BODY).hexdigest()}}}))
    with pytest.raises(offsite_copies.OffsiteError, match="plain file name"):
        offsite_copies.fetch(str(copy), tmp_path / "dest")
    assert not aimed.exists() and not (tmp_path / "dest").exists()
