"""A run's checkpoint copies in a store off the cluster (train.agent.offsite.target), whole or not at all.

Layout, under the target's prefix:

    RUN/u1200/checkpoint_last.pt, run.json, manifest.json      checkpoint_last of update 1200 (resumes)
    RUN/best/u1100/checkpoint_best.pt, run.json, manifest.json checkpoint_best, when it changed

Each copy's files go first, streamed in blocks (multipart on S3; memory stays flat for a GB file) and
hashed on the way; then manifest.json, naming each file's sha256 and size, the update, the time and what
a resume needs (the run's preset, dataset, world size, tokens per update; run.json is the whole record).
A copy without its manifest, or with a file of another size, never counts (`whole_copies`); older
copies are deleted only once the new manifest is written, the newest KEEP kept. `fetch` refuses a manifest
naming anything but plain file names, and checks every file's sha256 before it takes its place in the
destination.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import tempfile
import time
from pathlib import Path

from train.agent.keeper.replica import received
from train.agent.offsite.target import Target, parse, scrubbed

MANIFEST = "manifest.json"
KEEP = 2  # whole copies of each kind kept in the store (the newest first)
BLOCK = 8 << 20  # bytes read and written at a time
KINDS = {"last": "", "best": "best"}  # a kind of copy -> its folder under RUN/
PROBE_BYTES = 8 << 20  # the check's probe copy: enough to time the store, little to pay for
PROBE_PREFIX = "tandem-check-"  # its run's name: never listed as a run to resume
COPY = re.compile(r"u(\d+)")
# what a manifest may name: a file in the copy's own folder, as tandem names them (checkpoint_last.pt,
# run.json); never a path, `..`, an absolute or hidden name (the fetch's own `.NAME.incoming`)
PLAIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


class OffsiteError(RuntimeError):
    """A store that could not be written or read, or a copy that is not whole: what failed, in one line."""


def said(err: Exception) -> str:
    """An exception as one line a user can act on (s3fs maps AccessDenied to PermissionError, etc.)."""
    text = " ".join(scrubbed(err).split()) or type(err).__name__  # a URL in it: never its secret
    return f"{type(err).__name__}: {text}"[:400]


def copy_dir(target: Target, run_id: str, kind: str, update: int) -> str:
    return target.path(run_id, KINDS[kind], f"u{update}")


def put(fs, local: Path, remote: str, sha256: str | None = None) -> dict:
    """Stream `local` to `remote`, hashing it; {sha256, size}. OffsiteError when the bytes read are not
    `sha256` (the file changed under us) or the store holds another size afterwards."""
    digest, size = hashlib.sha256(), 0
    with local.open("rb") as src, fs.open(remote, "wb") as out:
        while block := src.read(BLOCK):
            digest.update(block)
            out.write(block)
            size += len(block)
    if sha256 and digest.hexdigest() != sha256:
        raise OffsiteError(f"{local}: its bytes changed while uploaded (sha256 {digest.hexdigest()[:12]}, "
                           f"expected {sha256[:12]}); uploaded again at the next try")
    stored = fs.size(remote)
    if stored != size:
        raise OffsiteError(f"{remote}: the store holds {stored} bytes of {size}")
    return {"sha256": digest.hexdigest(), "size": size}


def upload(target: Target, run_id: str, kind: str, update: int, files: dict[str, Path],
           expected: dict[str, str] | None = None, facts: dict | None = None, fs=None) -> dict:
    """One copy: `files` (name -> local path) under RUN/[best/]u<update>/, then its manifest; then the
    copies beyond KEEP removed. Returns the manifest with `where` (the copy's URL). A copy of this update
    already whole there is left as it is; a torn one is redone (its manifest removed first)."""
    fs = fs or target.filesystem()
    where = copy_dir(target, run_id, kind, update)
    held = read_manifest(fs, where)
    if held and sizes_match(fs, where, held) and all(
            held["files"].get(n, {}).get("sha256") == s for n, s in (expected or {}).items()):
        return {**held, "where": target.url_of(run_id, KINDS[kind], f"u{update}")}
    if held:
        fs.rm_file(f"{where}/{MANIFEST}")
    fs.makedirs(where, exist_ok=True)  # sftp's open makes no folders (s3, gs: no-op; a directory: made)
    stored = {name: put(fs, path, f"{where}/{name}", (expected or {}).get(name)) for name, path in files.items()}
    manifest = {"format": 1, "run": run_id, "kind": kind, "update": update, "time": round(time.time(), 1),
                "files": stored, **(facts or {})}
    fs.pipe_file(f"{where}/{MANIFEST}", json.dumps(manifest, indent=1).encode())
    prune(fs, target, run_id, kind)
    return {**manifest, "where": target.url_of(run_id, KINDS[kind], f"u{update}")}


def abort_stale_uploads(fs, target: Target, run_id: str) -> int:
    """S3 keeps, and bills, the parts of a multipart upload never completed (its uploader killed with the VM),
    unseen by any listing: every one under RUN/ is aborted (one uploader a run, and none of this one's
    open when called: before and after each copy). The number aborted; other stores: 0."""
    if target.scheme != "s3":
        return 0
    bucket, _, prefix = target.path(run_id).partition("/")
    held = fs.call_s3("list_multipart_uploads", Bucket=bucket, Prefix=f"{prefix}/")
    stale = held.get("Uploads") or []
    for upload in stale:
        fs.abort_mpu(bucket, upload["Key"], upload["UploadId"])
    return len(stale)


def read_manifest(fs, where: str) -> dict | None:
    try:
        data = json.loads(fs.cat_file(f"{where}/{MANIFEST}"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("files"), dict) else None


def sizes_match(fs, where: str, manifest: dict) -> bool:
    """Every file the manifest names is there, with its size."""
    try:
        held = {Path(e["name"]).name: e["size"] for e in fs.ls(where, detail=True)}
    except OSError:
        return False
    return all(held.get(name) == f.get("size") for name, f in manifest["files"].items())


def _copies(fs, target: Target, run_id: str, kind: str) -> list[tuple[int, str]]:
    """(update, path) of every folder that may be a copy, whole or not, newest first."""
    try:
        names = fs.ls(target.path(run_id, KINDS[kind]), detail=False)
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = [(int(m.group(1)), n.rstrip("/")) for n in names if (m := COPY.fullmatch(Path(n.rstrip("/")).name))]
    return sorted(found, reverse=True)


def prune(fs, target: Target, run_id: str, kind: str, keep: int = KEEP) -> None:
    """Beyond the newest `keep` whole copies, every copy of that kind goes (a torn one older than the
    newest whole too); nothing is removed until that many whole copies exist beside it."""
    whole = 0
    for _, where in _copies(fs, target, run_id, kind):
        manifest = read_manifest(fs, where)
        if whole >= keep or (whole and manifest is None):
            fs.rm(where, recursive=True)
        elif manifest is not None and sizes_match(fs, where, manifest):
            whole += 1


def runs(fs, target: Target) -> list[str]:
    """The runs under the store's root; a check's probe a killed check left behind is none of them."""
    try:
        names = [Path(n.rstrip("/")).name for n in fs.ls(target.root, detail=False)]
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [n for n in names if not n.startswith(PROBE_PREFIX)]


def whole_copies(url: str, run_id: str | None = None, kind: str = "last") -> list[dict]:
    """Every whole copy (manifest present, sizes match) of `run_id` (None: of every run under the URL),
    newest first (by update, then time); each its manifest with `where`, the copy's URL for `fetch`."""
    target = parse(url)
    fs = target.filesystem()
    found = []
    for run in [run_id] if run_id else runs(fs, target):
        for update, where in _copies(fs, target, run, kind):
            manifest = read_manifest(fs, where)
            if manifest is not None and sizes_match(fs, where, manifest):
                found.append({**manifest, "where": target.url_of(run, KINDS[kind], f"u{update}")})
    return sorted(found, key=lambda m: (m.get("update", 0), m.get("time", 0)), reverse=True)


def newest(url: str, run_id: str | None = None, kind: str = "last") -> dict | None:
    """The newest whole copy (whole_copies' first), or None."""
    copies = whole_copies(url, run_id, kind)
    return copies[0] if copies else None


def listed(url: str) -> list[dict]:
    """What a resume from `url` may take, one entry a run, newest first: its newest whole copy's run,
    update, time, preset, dataset, hosts and `store` (the URL its runs are under), with how many whole
    copies it has. `url` a copy's own folder (RUN/uN: its manifest there): that copy alone, `pinned`."""
    target = parse(url)
    fs = target.filesystem()
    if (own := read_manifest(fs, target.root)) is not None and isinstance(own.get("update"), int):
        up = 3 if own.get("kind") == "best" else 2  # STORE/RUN/[best/]uN
        return [{**summary({**own, "where": target.url}), "store": target.url.rsplit("/", up)[0], "copies": 1,
                 "pinned": own["update"]}]
    found = []
    for run in runs(fs, target):
        if held := whole_copies(url, run):
            found.append({**summary(held[0]), "store": target.url, "copies": len(held)})
    return sorted(found, key=lambda m: (m.get("time") or 0), reverse=True)


def summary(manifest: dict) -> dict:
    """What a user picks a run's copy by (and the resume checks): run, update, age, preset, dataset, hosts."""
    hosts = manifest.get("hosts") or ([manifest["host"]] if manifest.get("host") else [])
    return {"run": manifest.get("run"), "update": manifest.get("update"), "time": manifest.get("time"),
            "preset": manifest.get("preset"), "dataset": manifest.get("dataset"), "hosts": hosts,
            "where": manifest.get("where")}


def fetch_whole(url: str, run_id: str, dest: str | Path, update: int | None = None) -> dict:
    """The newest copy of `run_id` under `url` whose every file matches its manifest's sha256 (only
    update `update`'s when given), fetched into `dest`; the copies refused on the way, newest first,
    each with why, in its `refused`. OffsiteError when none is whole."""
    refused = []
    for copy in whole_copies(url, run_id):
        if update is not None and copy.get("update") != update:
            continue
        try:
            return {**fetch(copy["where"], dest), "refused": refused}
        except OffsiteError as err:  # a flipped byte, a truncated upload: the next whole copy
            refused.append(str(err))
    which = f"update {update} of {run_id}" if update is not None else f"copy of {run_id}"
    raise OffsiteError(f"{url}: no whole {which} (manifest, sizes and every sha256)"
                       + (": " + "; ".join(refused) if refused else ""))


def fetch(copy_url: str, dest: str | Path) -> dict:
    """Copy a whole copy (its URL: `where`) into directory `dest`, each file streamed to a temporary name,
    its sha256 and size checked, then renamed into place. Returns its manifest; OffsiteError naming the
    file when one does not match (nothing of it is left in `dest`)."""
    target = parse(copy_url)
    fs = target.filesystem()
    manifest = read_manifest(fs, target.root)
    if manifest is None:
        raise OffsiteError(f"{copy_url}: no {MANIFEST} (not a whole copy)")
    # whoever can write the store writes the manifest: every name checked before anything is written
    if strange := [name for name in manifest["files"] if not PLAIN.fullmatch(name)]:
        raise OffsiteError(f"{copy_url}: its {MANIFEST} names {', '.join(map(repr, strange))}: expected a plain file "
                           "name (letters, digits, '.', '_', '-'; no folder, no leading '.'): nothing fetched")
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    for name, want in manifest["files"].items():
        partial = dest / f".{name}.incoming"
        try:
            with fs.open(target.path(name), "rb") as src:
                size, sha256 = received(src, partial, BLOCK)
            if (size, sha256) != (want["size"], want["sha256"]):
                raise OffsiteError(f"{target.url_of(name)}: {size:,} bytes, sha256 {sha256[:12]}; its "
                                   f"manifest says {want['size']:,} bytes, {want['sha256'][:12]}: not taken")
            os.replace(partial, dest / name)
        finally:
            partial.unlink(missing_ok=True)
    return {**manifest, "where": copy_url}


def check(url: str, host: str = "", probe_bytes: int = PROBE_BYTES) -> dict:
    """The upload's own path, end to end, with this host's credentials: a probe copy of `probe_bytes`
    made as `upload` makes one (the folder made, the file streamed, the manifest written, the run's
    copies listed and pruned), listed as a resume lists copies, fetched back with its sha256 checked,
    then deleted. {"mb_s": the write's speed} (the controller times a checkpoint's copy by it);
    OffsiteError saying which step failed and the fix (`host`: whose credentials were used). A role
    that may put and get objects but not list them passed a put-get-delete check, and then no copy
    was ever made (issue 53, 3): its listing fails here."""
    target = parse(url)
    if target.scheme == "file" and not os.path.isdir(target.root):  # an unmounted share: never the local disk
        raise OffsiteError(f"{target.url}: no such directory on {host or 'the host'}: {target.fix(host or 'the host')}"
                           " (tandem creates folders under it, never the directory itself)")
    probe_run = f"{PROBE_PREFIX}{host or 'host'}-{os.getpid()}-{int(time.time())}"
    step, fs, took = "opening", None, 0.0
    with tempfile.TemporaryDirectory(prefix="tandem-check-") as here:
        local = Path(here) / "checkpoint_last.pt"
        with local.open("wb") as f:
            f.write(os.urandom(min(probe_bytes, 1 << 20)))
            f.truncate(probe_bytes)  # sparse beyond its first MB: no disk, the same bytes on the wire
        try:
            fs = target.filesystem()
            step = "writing a probe copy"
            started = time.monotonic()
            upload(target, probe_run, "last", 0, {"checkpoint_last.pt": local}, fs=fs)
            took = time.monotonic() - started
            step = "listing the copies of"
            if not whole_copies(url, probe_run):
                raise OffsiteError("the probe copy written is not listed")
            step = "reading back"
            fetch(target.url_of(probe_run, KINDS["last"], "u0"), Path(here) / "back")
            step = "deleting"
            fs.rm(target.path(probe_run), recursive=True)
        except Exception as err:  # every store raises its own: said with the fix
            with contextlib.suppress(Exception):
                if fs is not None and step != "deleting":
                    fs.rm(target.path(probe_run), recursive=True)
            raise OffsiteError(f"{target.url}: {said(err)} {step} {probe_run}: "
                               f"{target.fix(host or 'the host', err)}") from err
    return {"mb_s": round(probe_bytes / 1e6 / max(took, 1e-3), 1)}
