"""A host's whole copy of the run's checkpoint, and how it moves host to host (train.agent.keeper.loop).

fairseq saves checkpoint_last.pt on rank 0 only. On rank 0's host the keeper *snapshots* each save:
a hard link of the file (fairseq replaces it by rename at the next save, train.agent.trainer.fairseq_train
makes its copies atomic, so the link keeps a whole file) into RUN/checkpoints/.keep/, with a
manifest: the generation that made it, its update, size and sha256. That snapshot is what a peer
fetches and what a restart resumes from.

A fetch streams the file over the cluster network into a temporary name beside the target, hashing
it on the way; only a copy whose size and sha256 match the manifest replaces the host's previous
one (os.replace: a reader sees the old file or the new, never half). Every file is fsync'd before a
manifest names it, and a snapshot is hashed against its manifest before it is resumed from or
served (`verify`): a byte flipped at rest is found there, not in a peer's copy. A checkpoint of
another history (a split's other side) is never overwritten: it is set aside whole in
RUN/checkpoints/set-aside/, its manifest beside it, the least trained removed beyond SET_ASIDE_KEPT.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import threading
import time
import urllib.request
from pathlib import Path

from train.agent.trainer import checkpoint_info

LAST = "checkpoint_last.pt"
KEEP = ".keep"
CHUNK = 1 << 20
SET_ASIDE = "set-aside"
SET_ASIDE_KEPT = 1  # histories set aside a host keeps (GBs each, in preflight's disk need): the least trained go


class FetchError(RuntimeError):
    """A copy that did not arrive whole; the host keeps its previous checkpoint."""


class Superseded(FetchError):
    """A copy that arrived whole after this host's ranks started from another: dropped, never put under them."""


def paths(run_dir: str | Path) -> tuple[Path, Path, Path]:
    """(the checkpoint fairseq reads, the stable snapshot, its manifest)."""
    checkpoints = Path(run_dir) / "checkpoints"
    return checkpoints / LAST, checkpoints / KEEP / LAST, checkpoints / KEEP / "manifest.json"


def free(run_dir: str | Path) -> int:
    """The bytes free on the run's filesystem."""
    return shutil.disk_usage(run_dir).free


def said_no_room(run_dir: str | Path, why: str) -> None:
    """Why this host has no room for the run's checkpoint ('' once it has), for `fab status`."""
    path = Path(run_dir) / "keeper" / "no_room.json"
    try:
        if why:
            path.write_text(json.dumps({"why": why, "since": time.time()}))
        else:
            path.unlink(missing_ok=True)
    except OSError:
        pass  # a disk too full for 100 bytes: the keeper's log and heartbeat say it


PARTIALS = (f".{LAST}.incoming", f".{LAST}.link", f".{LAST}.restore")


def remove_partials(run_dir: str | Path) -> None:
    """The temporary files of a copy, snapshot or restore that a kill cut short."""
    last, snap, _ = paths(run_dir)
    for folder in {last.parent, snap.parent}:
        for name in PARTIALS:
            (folder / name).unlink(missing_ok=True)


def loose(run_dir: str | Path) -> bool:
    """Whether fairseq's checkpoint_last.pt is there (a run from before keepers, or a save not snapshot yet)."""
    return paths(run_dir)[0].exists()


def manifest(run_dir: str | Path) -> dict | None:
    """{generation, update, sha256, size} of the whole checkpoint this host holds, or None."""
    _, snapshot, path = paths(run_dir)
    data = None
    for copy in (path, _backup(path)):  # a torn or rotten manifest: its copy (the bytes are hashed anyway)
        try:
            data = json.loads(copy.read_text())
            break
        except (OSError, ValueError):
            continue
    if not isinstance(data, dict):
        return None
    try:
        if snapshot.stat().st_size != data["size"]:
            return None
    except (OSError, KeyError):
        return None
    return data


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_manifest(path: Path, data: dict) -> None:
    """The manifest, durably: after the file it names (fsync'd by the caller), then the directory; and a
    second copy beside it, so that one torn or rotten file never loses the checkpoint's history."""
    for target in (path, _backup(path)):
        tmp = target.with_name(f".{target.name}.tmp")
        with tmp.open("w") as f:
            f.write(json.dumps(data))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    _fsync(path.parent)


def _backup(path: Path) -> Path:
    return path.with_name(f".{path.name}.bak")


_verified: dict[str, tuple[int, int, int, str]] = {}  # path -> (inode, mtime, size, sha256) hashed by this process


def _stamp(path: Path, sha256: str) -> None:
    st = path.stat()
    _verified[str(path)] = (st.st_ino, st.st_mtime_ns, st.st_size, sha256)


def verify(run_dir: str | Path, held: dict, cached: bool = False) -> bool:
    """Whether the snapshot's bytes hash to `held`'s sha256. `cached`: a file this process hashed
    already (same inode, mtime and size) is not read again (serving a peer: GBs at each request)."""
    snap = paths(run_dir)[1]
    try:
        st = snap.stat()
        if cached and _verified.get(str(snap)) == (st.st_ino, st.st_mtime_ns, st.st_size, held.get("sha256")):
            return True
        digest = sha256_of(snap)
    except OSError:
        return False
    if digest != held.get("sha256"):
        return False
    _stamp(snap, digest)
    return True


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


Seen = tuple[int, int] | None  # checkpoint_last.pt's inode and mtime when last looked at


def snapshot(run_dir: str | Path, generation: int, seen: Seen, lineage=()) -> tuple[Seen, dict | None]:
    """Snapshot rank 0's checkpoint_last.pt when it is a new file since `seen` (its inode and mtime)
    and reads whole. `lineage`: the generations that trained it (train.agent.keeper.generation). Returns
    (what was seen now, the new manifest or None)."""
    last, snap, man = paths(run_dir)
    try:
        st = last.stat()
    except FileNotFoundError:
        return seen, None
    now = (st.st_ino, st.st_mtime_ns)
    if now == seen:
        return seen, None
    snap.parent.mkdir(parents=True, exist_ok=True)
    tmp = snap.with_name(f".{LAST}.link")
    tmp.unlink(missing_ok=True)
    os.link(last, tmp)
    said = checkpoint_info.read(tmp, tries=1)
    if said.get("update") is None:  # not whole (yet): looked at again at the next poll
        tmp.unlink(missing_ok=True)
        return seen, None
    _fsync(tmp)
    data = {"generation": generation, "update": said["update"], "size": tmp.stat().st_size, "sha256": sha256_of(tmp),
            "lineage": [list(step) for step in lineage]}
    os.replace(tmp, snap)  # the previous snapshot stays until this one is whole and hashed
    _stamp(snap, data["sha256"])
    _write_manifest(man, data)
    return now, data


def seen_now(run_dir: str | Path) -> Seen:
    """checkpoint_last.pt's inode and mtime now (None when there is none): a file this host's keeper
    put there itself (fetched, restored) is not a save of its rank 0 to snapshot again."""
    try:
        st = paths(run_dir)[0].stat()
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_mtime_ns)


def received(source, partial: Path, chunk: int = CHUNK) -> tuple[int, str]:
    """`source` (a readable stream) written whole to `partial` and on disk (fsync); its size and sha256,
    hashed on the way (a GB checkpoint is read once)."""
    digest, size = hashlib.sha256(), 0
    with partial.open("wb") as out:
        while block := source.read(chunk):
            digest.update(block)
            out.write(block)
            size += len(block)
        out.flush()
        os.fsync(out.fileno())
    return size, digest.hexdigest()


def fetch(url: str, token: str, run_dir: str | Path, want: dict, timeout_s: float = 30.0,
          keep=lambda: True, lock: threading.Lock | None = None, context=None) -> dict:
    """Copy the checkpoint `want` (a manifest: size, sha256, generation, update) from a peer's keeper
    at `url`, verify it, and make it this host's checkpoint. FetchError when it did not arrive whole;
    Superseded when `keep()` says no, asked under `lock` as the copy is put in place (the ranks that
    started meanwhile own checkpoint_last.pt)."""
    last, snap, man = paths(run_dir)
    snap.parent.mkdir(parents=True, exist_ok=True)
    partial = last.with_name(f".{LAST}.incoming")
    request = urllib.request.Request(url, headers={"X-Tandem-Token": token})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s, context=context) as answer:  # context: mutual TLS
            size, sha256 = received(answer, partial)
        if size != want["size"] or sha256 != want["sha256"]:
            raise FetchError(f"{url}: {size:,} bytes, sha256 {sha256[:12]}; the manifest says "
                             f"{want['size']:,} bytes, {want['sha256'][:12]}: not replaced")
        with lock or contextlib.nullcontext():
            if not keep():
                raise Superseded(f"{url}: the copy of update {want['update']} arrived after this host's ranks "
                                 "started from another: dropped")
            link = snap.with_name(f".{LAST}.link")
            link.unlink(missing_ok=True)
            os.link(partial, link)
            os.replace(partial, last)
            os.replace(link, snap)
            _stamp(snap, want["sha256"])
            _write_manifest(man, {k: want[k] for k in ("generation", "update", "size", "sha256", "lineage")
                                  if k in want})
        return want
    except OSError as err:
        raise FetchError(f"{url}: {type(err).__name__}: {err}") from err
    finally:
        partial.unlink(missing_ok=True)


def set_aside(run_dir: str | Path, held: dict, why: str = "", keep: int = SET_ASIDE_KEPT) -> Path | None:
    """Move this host's checkpoint (another history than the one the run goes on with, or a corrupt
    one: `why`) whole to RUN/checkpoints/set-aside/, named by its generation and update, its manifest
    beside it; beyond `keep` histories there the oldest is removed (said). The path, or None if none."""
    last, snap, man = paths(run_dir)
    source = snap if snap.exists() else last
    if not source.exists():
        return None
    folder = last.parent / SET_ASIDE
    folder.mkdir(parents=True, exist_ok=True)
    name = f"checkpoint_last.g{held['generation']}-u{held['update']}{'.' + why if why else ''}"
    aside = folder / f"{name}.pt"
    os.replace(source, aside)
    (folder / f"{name}.json").write_text(json.dumps({**held, "why": why or "another history",
                                                      "set_aside_at": time.time()}))
    for stale in (last, man, _backup(man)):
        stale.unlink(missing_ok=True)
    for old in pruned(set_aside_list(run_dir), keep):
        Path(old["path"]).unlink(missing_ok=True)
        Path(old["path"]).with_suffix(".json").unlink(missing_ok=True)
        print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} set-aside checkpoint of update {old.get('update')} "
              f"(generation {old.get('generation')}) removed: more than {keep} kept", flush=True)
    return aside


def pruned(aside: list[dict], keep: int) -> list[dict]:
    """The set-aside checkpoints to remove so that `keep` stay (0 or less: all stay): those with the least
    training first, never the one with the most (a split's other side may hold the run's best)."""
    if keep <= 0:
        return []
    ranked = sorted(aside, key=lambda d: (int(d.get("update") or 0), d.get("set_aside_at") or 0))
    return ranked[:-keep]


def set_aside_list(run_dir: str | Path) -> list[dict]:
    """The checkpoints set aside on this host, oldest first: {path, size, generation, update, why, set_aside_at}."""
    found = []
    for pt in (Path(run_dir) / "checkpoints" / SET_ASIDE).glob("*.pt"):
        try:
            info = json.loads(pt.with_suffix(".json").read_text())
        except (OSError, ValueError):
            info = {}
        try:
            st = pt.stat()
        except OSError:
            continue
        when = info.get("set_aside_at", st.st_mtime)
        found.append({**info, "path": str(pt), "size": st.st_size, "set_aside_at": when})
    return sorted(found, key=lambda d: d["set_aside_at"])


def clear(run_dir: str | Path) -> None:
    """No checkpoint here: a generation that starts from none must find none on any host (a rank that
    finds one would wait on a broadcast the others never send)."""
    for path in (*paths(run_dir), _backup(paths(run_dir)[2])):
        path.unlink(missing_ok=True)


def restore(run_dir: str | Path) -> None:
    """Make the snapshot the file fairseq resumes from (where checkpoint_last.pt is another file: a
    save after the snapshot the generation starts from, or none): a hard link, no bytes copied."""
    last, snap, _ = paths(run_dir)
    if last.exists() and os.path.samefile(last, snap):
        return
    tmp = last.with_name(f".{LAST}.restore")
    tmp.unlink(missing_ok=True)
    os.link(snap, tmp)
    os.replace(tmp, last)
