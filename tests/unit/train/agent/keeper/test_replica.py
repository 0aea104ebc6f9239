"""A checkpoint copy replaces a host's previous one only whole (size and sha256 as the manifest says),
and a checkpoint of another history is set aside, never overwritten (train.agent.keeper.replica)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from train.agent.keeper import replica


@pytest.fixture
def serving():
    """An HTTP server on loopback that serves whatever bytes the test sets (a peer's keeper)."""
    body = {"bytes": b""}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", str(len(body["bytes"])))
            self.end_headers()
            self.wfile.write(body["bytes"])

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield body, f"http://127.0.0.1:{server.server_address[1]}/checkpoint"
    server.shutdown()


def hold(run_dir, data: bytes, generation: int, update: int) -> dict:
    """This host holds a whole checkpoint (its file, snapshot and manifest)."""
    last, snap, man = replica.paths(run_dir)
    snap.parent.mkdir(parents=True)
    last.write_bytes(data)
    snap.hardlink_to(last)
    held = {"generation": generation, "update": update, "size": len(data), "sha256": replica.sha256_of(last)}
    man.write_text(json.dumps(held))
    return held


def test_a_torn_copy_never_replaces_the_whole_one_the_host_holds(tmp_path, serving):
    body, url = serving
    held = hold(tmp_path, b"update 40 " * 1000, 1, 40)
    new = b"update 50 " * 1000
    want = {"generation": 1, "update": 50, "size": len(new), "sha256": __import__("hashlib").sha256(new).hexdigest()}
    body["bytes"] = new[: len(new) // 2] + b"x" * (len(new) - len(new) // 2)  # torn: the size right, not the bytes
    with pytest.raises(replica.FetchError, match="not replaced"):
        replica.fetch(url, "t", tmp_path, want)
    assert replica.manifest(tmp_path) == held and replica.paths(tmp_path)[0].read_bytes() == b"update 40 " * 1000
    assert not list((tmp_path / "checkpoints").glob(".*incoming*"))  # no partial file left
    body["bytes"] = new
    assert replica.fetch(url, "t", tmp_path, want) == want
    assert replica.manifest(tmp_path) == want and replica.paths(tmp_path)[0].read_bytes() == new


def test_another_historys_checkpoint_is_set_aside_by_generation_and_update(tmp_path):
    hold(tmp_path, b"the other side", 2, 90)
    aside = replica.set_aside(tmp_path, {"generation": 2, "update": 90})
    assert aside.name == "checkpoint_last.g2-u90.pt" and aside.read_bytes() == b"the other side"
    assert replica.manifest(tmp_path) is None and not replica.paths(tmp_path)[0].exists()


def test_histories_set_aside_are_kept_whole_with_their_manifest_and_the_oldest_goes_first(tmp_path, capsys):
    for update in (90, 120, 150):
        hold(tmp_path, f"side at {update}".encode(), 2, update)
        replica.set_aside(tmp_path, {"generation": 2, "update": update, "sha256": "s", "size": 9}, keep=2)
        (tmp_path / "checkpoints" / ".keep").rename(tmp_path / f"old-keep-{update}")
    kept = replica.set_aside_list(tmp_path)
    assert [k["update"] for k in kept] == [120, 150] and kept[0]["why"] == "another history"
    assert "set-aside checkpoint of update 90 (generation 2) removed: more than 2 kept" in capsys.readouterr().out


def test_a_byte_flipped_at_rest_fails_verification_though_the_size_matches(tmp_path):
    held = hold(tmp_path, b"update 40 " * 1000, 1, 40)
    assert replica.verify(tmp_path, held)
    snap = replica.paths(tmp_path)[1]
    with snap.open("r+b") as f:  # one byte, in place: the size and the manifest unchanged
        f.seek(5000)
        f.write(b"X")
    assert replica.manifest(tmp_path) == held  # the size alone says nothing is wrong
    assert not replica.verify(tmp_path, held)


def test_a_torn_manifest_is_read_from_its_copy_and_the_checkpoint_keeps_its_history(tmp_path):
    """One torn or rotten manifest.json (issue 52, 5): the checkpoint is not "generation 0, no lineage"
    (set aside as another history) but keeps its generation and lineage from the manifest's copy."""
    import json as _json

    from train.agent.keeper import replica as _replica

    last, snap, man = _replica.paths(tmp_path)
    snap.parent.mkdir(parents=True)
    snap.write_bytes(b"x" * 64)
    held = {"generation": 7, "update": 350, "size": 64, "sha256": _replica.sha256_of(snap),
            "lineage": [[5, "v100a", 0], [7, "v100b", 300]]}
    _replica._write_manifest(man, held)
    man.write_text(_json.dumps(held)[:20])  # torn
    assert _replica.manifest(tmp_path) == held
    assert _replica.verify(tmp_path, _replica.manifest(tmp_path))
    _replica.clear(tmp_path)
    assert _replica.manifest(tmp_path) is None and not list(snap.parent.glob(".*bak"))
