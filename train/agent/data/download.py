"""Downloading corpora: resumable, checksummed, with progress (`report`).

`fetch(url, dest, sha256)` keeps a `.part` file and continues it with an HTTP Range
request after an interruption; the finished file is checked against its SHA-256 before
it takes its final name, so a corrupt download never looks like a good one.
"""

from __future__ import annotations

import hashlib
import shutil
import tarfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from . import progress as progress_

CHUNK = 1 << 20


class DownloadError(RuntimeError):
    pass


@dataclass(frozen=True)
class Source:
    url: str
    sha256: str | None  # None: print the checksum after the first download, to pin it
    members: tuple[str, ...] = ()  # files to take from the archive


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch(url: str, dest: Path, sha256: str | None = None, timeout: float = 60,
          report: progress_.Silent | None = None) -> Path:
    """Download `url` to `dest` (resuming a partial download), verify, and return `dest`.
    `report`: progress as stage 'download NAME' in bytes."""
    report = report or progress_.Silent()
    if dest.exists() and (sha256 is None or sha256_of(dest) == sha256):
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    have = part.stat().st_size if part.exists() else 0
    request = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as err:
        if err.code == 416 and have:  # the part file is already complete
            response = None
        else:
            raise DownloadError(f"{url}: HTTP {err.code} {err.reason}") from err
    except OSError as err:
        raise DownloadError(f"{url}: {err}") from err
    if response is not None:
        with response:
            resumed = response.status == 206
            if not resumed:
                have = 0  # the server ignored Range: start over
            length = response.headers.get("Content-Length")
            total = have + int(length) if length else None
            report.start(f"download {dest.name}" + (" (resumed)" if resumed else ""), total=total, unit="bytes",
                         done=have)
            with open(part, "ab" if resumed else "wb") as out:
                for block in iter(lambda: response.read(CHUNK), b""):
                    out.write(block)
                    report.advance(len(block))
            report.finish()
    got = sha256_of(part)
    if sha256 is not None and got != sha256:
        part.unlink()
        raise DownloadError(f"{url}: checksum mismatch, expected sha256 {sha256}, got {got}; deleted, retry")
    part.rename(dest)
    return dest


def remote_size(url: str, timeout: float = 30) -> int | None:
    """The size the server says `url` has (a HEAD request's Content-Length), None when it says none."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout) as response:
            length = response.headers.get("Content-Length")
    except OSError:  # HTTPError included: the download itself will say what is wrong
        return None
    return int(length) if length and length.isdigit() else None


def extract(archive: Path, members: tuple[str, ...], dest: Path) -> list[Path]:
    """Take the named files (matched by their base name) out of a tarball, flat into `dest`,
    streamed (a member of a GB is never in memory), each under a temporary name until whole."""
    dest.mkdir(parents=True, exist_ok=True)
    wanted = {Path(m).name for m in members}
    found = []
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            name = Path(member.name).name
            if member.isfile() and (not wanted or name in wanted):
                source = tar.extractfile(member)
                assert source is not None
                partial = dest / f".{name}.partial"
                with source, open(partial, "wb") as out:
                    shutil.copyfileobj(source, out, CHUNK)
                partial.rename(dest / name)
                found.append(dest / name)
    missing = wanted - {p.name for p in found}
    if missing:
        raise DownloadError(f"{archive}: missing {', '.join(sorted(missing))}")
    return found
