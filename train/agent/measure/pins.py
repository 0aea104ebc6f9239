"""The pinned training environment against what a host really has installed.

The host answers `installed()` (what `pip freeze` lists, read from the package metadata, in
train.agent.measure.probe); the controller holds the pins (requirements-train.txt). One hash of the pinned
packages as installed says whether they match; when it does not, `drift` names each package.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path


def canonical(name: str) -> str:
    """PEP 503: Fairseq_Fixed, fairseq.fixed -> fairseq-fixed."""
    return re.sub(r"[-_.]+", "-", name).lower()


def public(version: str) -> str:
    """2.13.0+cpu -> 2.13.0: the local label says which build (CPU, CUDA), the pin says which release."""
    return version.split("+", 1)[0]


def read_pins(path: Path) -> dict[str, str]:
    """requirements file -> {canonical name: version} of its `name==version` lines."""
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            pins[canonical(name)] = version.strip()
    return pins


def installed() -> dict[str, str]:
    """{canonical name: version} of every distribution this Python sees (pip freeze's list)."""
    from importlib import metadata

    return {canonical(d.metadata["Name"]): d.version for d in metadata.distributions() if d.metadata["Name"]}


def digest(pins: dict[str, str], have: dict[str, str]) -> str:
    """sha256 of the pinned packages as installed: equal to digest(pins, pins) when none drifted."""
    lines = "".join(f"{name}=={public(have.get(name, '-'))}\n" for name in sorted(pins))
    return hashlib.sha256(lines.encode()).hexdigest()


def drift(pins: dict[str, str], have: dict[str, str]) -> list[str]:
    """['sacrebleu 2.5.0 (pinned 2.6.0)', 'tqdm missing (pinned 4.70.1)']: [] when the hash matches."""
    if digest(pins, have) == digest(pins, pins):
        return []
    return [f"{name} {public(have[name])} (pinned {want})" if name in have else f"{name} missing (pinned {want})"
            for name, want in sorted(pins.items()) if public(have.get(name, "-")) != want]


def main(argv: list[str] | None = None) -> int:
    """python -m train.agent.measure.pins REQUIREMENTS...: exit 0 when this Python has every pin, else 1 and
    each drifted package on a line (roles/train_env runs pip only then)."""
    import sys

    files = sys.argv[1:] if argv is None else argv
    pinned = {name: version for f in files for name, version in read_pins(Path(f)).items()}
    drifted = drift(pinned, installed())
    print("\n".join(drifted) or f"all {len(pinned)} pins installed")
    return 1 if drifted else 0


if __name__ == "__main__":
    raise SystemExit(main())
