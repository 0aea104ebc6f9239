"""The inventory as Ansible read it last time, while its files are what they were.

Ansible's InventoryManager takes about a second to start (its plugin and collection loaders), and
every fab task reads the inventory: `fab status` would spend most of its time there. A static
inventory (a YAML or INI file, its group_vars/ and host_vars/ beside it) is read again only when one
of those files changed (their paths, sizes and modification times are the key). A dynamic inventory
(a file naming a `plugin:`, a script) is never cached: what the cloud answers changes without a file
changing.

The cache keeps no secret: only the variables tandem reads (train.hostvars) and the groups, a vaulted one
still sealed (train.inventory_vault opens it in memory), in a 0600 file in a 0700 folder, one file an
inventory (an older reading of it, and any file of the layout before that kept every variable, removed).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from pathlib import Path

from . import hostvars, inventory_vault

KEPT = frozenset(hostvars.DEFINITION) | {"group_names"}  # group_names: Ansible's own, hostvars.groups reads it
LEGACY = re.compile(r"[0-9a-f]{24}\.json")  # the layout before, holding every variable (passwords, keys)


def cache_dir() -> Path:
    return Path(os.environ.get("TANDEM_CACHE", Path.home() / ".cache" / "tandem")) / "inventories"


def is_static(path: Path) -> bool:
    if path.is_dir() or os.access(path, os.X_OK) or path.suffix not in (".yml", ".yaml", ".ini", ""):
        return False
    return not any(line.startswith("plugin:") for line in path.read_text(errors="replace").splitlines())


def key(path: Path) -> str | None:
    """What the reading depends on, hashed, after the inventory's own prefix (its path hashed): None for an
    inventory that is not cached."""
    path = path.resolve()
    if not is_static(path):
        return None
    parts = [str(path), path.read_text(errors="replace")]
    for sub in ("group_vars", "host_vars"):
        root = path.parent / sub
        if root.is_dir():
            for f in sorted(root.rglob("*")):
                if f.is_file():
                    stat = f.stat()
                    parts.append(f"{f} {stat.st_size} {stat.st_mtime_ns}")
    content = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]
    return f"{_prefix(path)}-{content}"


def _prefix(path: Path) -> str:
    return hashlib.sha256(str(path).encode()).hexdigest()[:16]


def kept(members: list[tuple[str, dict]]) -> list[tuple[str, dict]]:
    """Each host's variables that tandem reads, a vaulted one sealed; every other (a become password, a
    cloud key, vaulted or not) left out, never decrypted."""
    return [(name, {k: inventory_vault.sealed(v) or v for k, v in variables.items() if k in KEPT})
            for name, variables in members]


def read(path: Path) -> list[tuple[str, dict]] | None:
    digest = key(path)
    if digest is None:
        return None
    try:
        return [(name, variables) for name, variables in json.loads((cache_dir() / f"{digest}.json").read_text())]
    except (OSError, ValueError, TypeError):
        return None


def write(path: Path, members: list[tuple[str, dict]]) -> None:
    """Cache `members` (kept()'s) for the inventory at `path`, removing its older readings."""
    digest = key(path)
    if digest is None:
        return
    folder = cache_dir()
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        folder.chmod(0o700)  # one made 0755 before
        tmp = folder / f".{digest}.{os.getpid()}"
        tmp.unlink(missing_ok=True)  # made 0600 here, never an older file's mode
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as out:
            json.dump(members, out, default=lambda v: inventory_vault.sealed(v) or str(v))  # a vaulted one nested
        tmp.replace(folder / f"{digest}.json")
        mine = digest.split("-")[0] + "-"
        for old in folder.iterdir():
            if LEGACY.fullmatch(old.name) or (old.name.startswith(mine) and old.name != f"{digest}.json"):
                with contextlib.suppress(OSError):
                    old.unlink()
    except OSError:
        pass  # a cache, not a result
