"""An offline wheelhouse of the training environment: download once, install on N hosts.

    python -m train.wheelhouse [--dest DIR]

holds every wheel requirements-train.txt needs (with their dependencies) and the fairseq
wheel built once by `make setup`. Provisioning installs from it with `pip --no-index`,
either served over HTTP (`train_env_wheelhouse_url`, as the lab does) or copied from the
controller (`train_env_wheelhouse_dir`): clusters behind firewalls need nothing else.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

TOP = Path(__file__).resolve().parent.parent
REQUIREMENTS = TOP / "requirements-train.txt"
FAIRSEQ = "fairseq-fixed"


def cache_dir() -> Path:
    return Path(os.environ.get("TANDEM_CACHE", Path.home() / ".cache" / "tandem"))


def default_dest(requirements: Path = REQUIREMENTS) -> Path:
    digest = hashlib.sha256(requirements.read_bytes()).hexdigest()[:12]
    return cache_dir() / "wheelhouse" / digest


def pinned(requirements: Path, name: str) -> str:
    for line in requirements.read_text().splitlines():
        if line.split("==")[0].strip().lower() == name:
            return line.strip()
    raise SystemExit(f"{requirements}: no pinned {name}")


def build(dest: Path | None = None, requirements: Path = REQUIREMENTS) -> Path:
    dest = dest or default_dest(requirements)
    if (dest / ".complete").exists():
        return dest
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    fairseq = pinned(requirements, FAIRSEQ)
    others = [line for line in requirements.read_text().splitlines()
              if line.strip() and not line.startswith("#") and line != fairseq]
    (tmp / "requirements.txt").write_text("\n".join(others) + "\n")
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--dest", str(tmp),
                           "-r", str(tmp / "requirements.txt")], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"pip download failed for {requirements}:\n{proc.stderr}")
    version = fairseq.split("==")[1]
    wheels = sorted((cache_dir() / "wheels").glob(f"fairseq_fixed-{version}-*.whl"))
    if not wheels:
        raise SystemExit(f"no {fairseq} wheel in {cache_dir() / 'wheels'}: run `make setup` first")
    shutil.copy2(wheels[-1], tmp)
    # The exact pins the hosts install, fairseq included (installed without its deps).
    shutil.copy2(requirements, tmp / "requirements-train.txt")
    (tmp / ".complete").touch()
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return dest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dest", type=Path, help="where to put it (default: the cache)")
    args = parser.parse_args()
    print(build(args.dest))


if __name__ == "__main__":
    main()
