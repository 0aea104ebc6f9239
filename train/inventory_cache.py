"""The inventory as Ansible read it last time, while its files are what they were.

Ansible's InventoryManager takes about a second to start (its plugin and collection loaders), and
every fab task reads the inventory: `fab status` would spend most of its time there. A static
inventory (a YAML or INI file, its group_vars/ and host_vars/ beside it) is read again only when one
of those files changed (their paths, sizes and modification times are the key). A dynamic inventory
(a file naming a `plugin:`, a script) is never cached: what the cloud answers changes without a file
changing.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path


def cache_dir() -> Path:
    return Path(os.environ.get("TANDEM_CACHE", Path.home() / ".cache" / "tandem")) / "inventories"


def is_static(path: Path) -> bool:
    if path.is_dir() or os.access(path, os.X_OK) or path.suffix not in (".yml", ".yaml", ".ini", ""):
        return False
    return not any(line.startswith("plugin:") for line in path.read_text(errors="replace").splitlines())


def key(path: Path) -> str | None:
    """What the reading depends on, hashed; None for an inventory that is not cached."""
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
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def read(path: Path) -> list[tuple[str, dict]] | None:
    digest = key(path)
    if digest is None:
        return None
    try:
        return [(name, variables) for name, variables in json.loads((cache_dir() / f"{digest}.json").read_text())]
    except (OSError, ValueError, TypeError):
        return None


def write(path: Path, members: list[tuple[str, dict]]) -> None:
    digest = key(path)
    if digest is None:
        return
    wanted = [(name, {k: v for k, v in variables.items() if k not in ("hostvars", "groups", "omit")})
              for name, variables in members]
    try:
        cache_dir().mkdir(parents=True, exist_ok=True)
        tmp = cache_dir() / f".{digest}.{os.getpid()}"
        tmp.write_text(json.dumps(wanted, default=str))
        tmp.replace(cache_dir() / f"{digest}.json")
    except OSError:
        pass  # a cache, not a result
