"""An offline wheelhouse of the training environment: download once, install on N hosts.

    python -m train.provision.wheelhouse [--python 3.13] [--accelerator cpu|cu128|cu130] [--dest DIR]

A wheelhouse is a directory of builds, one per (Python, machine, accelerator) the hosts may have:

    <root>/py3.11-x86_64-cpu/     every wheel requirements-train.txt needs, for CPython 3.11, CPU torch
    <root>/py3.13-x86_64-cu130/   the same pins for 3.13 hosts with GPUs: torch's CUDA 13.0 build

Provisioning installs from <root>/<the hosts' key>/ with `pip --no-index`, the root served over HTTP
(`train_env_wheelhouse_url`, as the lab does) or copied from the controller (`train_env_wheelhouse_dir`).
Wheels are downloaded for the target Python and platform, not the controller's: a Debian 12
controller (3.11) builds the wheelhouse of Ubuntu 24.04 hosts (3.12). Pure-Python packages that ship
only an sdist are built into py3-none-any wheels here. fairseq has C++ parts: its wheel is the one
`make setup` built when the Python is the controller's; for another Python the wheelhouse holds
fairseq's sdist, and provisioning builds the wheel once on a host and shares it (roles/train_env).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import urllib.request
import zipfile
from pathlib import Path

TOP = Path(__file__).resolve().parents[2]
REQUIREMENTS = TOP / "requirements-train.txt"
FAIRSEQ = "fairseq-fixed"
# What building fairseq's wheel on a host needs besides the pins (torch, numpy): its setup.py's tools.
BUILD_REQUIREMENTS = TOP / "requirements-build.txt"
BUILD_TOOLS = [line.strip() for line in BUILD_REQUIREMENTS.read_text().splitlines() if "==" in line]
# torch's own index, one per accelerator (cpu, cu126, cu128, cu130); PyPI's torch is one CUDA build.
TORCH_INDEX = "https://download.pytorch.org/whl/{accelerator}"
# pip takes --platform literally: every manylinux tag a glibc 2.28+ host accepts (Debian 11+, Ubuntu 20.04+)
MANYLINUX = [f"manylinux_2_{minor}" for minor in range(28, 4, -1)] + ["manylinux2014", "manylinux2010", "manylinux1"]


def cache_dir() -> Path:
    return Path(os.environ.get("TANDEM_CACHE", Path.home() / ".cache" / "tandem"))


def default_root(requirements: Path = REQUIREMENTS) -> Path:
    digest = hashlib.sha256(requirements.read_bytes() + " ".join(BUILD_TOOLS).encode()).hexdigest()[:12]
    return cache_dir() / "wheelhouse" / digest


def key(python: str, machine: str, accelerator: str) -> str:
    """('3.13', 'x86_64', 'cu130') -> 'py3.13-x86_64-cu130': the same name roles/train_env computes."""
    return f"py{python}-{machine}-{accelerator}"


def this_python() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def pinned(requirements: Path, name: str) -> str:
    for line in requirements.read_text().splitlines():
        if line.split("==")[0].strip().lower() == name:
            return line.strip()
    raise SystemExit(f"{requirements}: no pinned {name}")


def torch_build(wheel: Path) -> str:
    """Which accelerator a torch wheel is built for: 'cpu', 'cu128', ... from its local version
    (torch-2.13.0+cpu-...) or, for PyPI's build without one, the CUDA its metadata requires."""
    local = re.match(r"torch-[^-+]+\+(\w+)-", wheel.name)
    if local:
        return local.group(1)
    with zipfile.ZipFile(wheel) as whl:
        name = next(n for n in whl.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = whl.read(name).decode()
    cuda = re.search(r"^Requires-Dist: (?:cuda-toolkit\S*==|nvidia-cuda-runtime-cu\d+==)(\d+)\.(\d+)", metadata, re.M)
    return f"cu{cuda.group(1)}{cuda.group(2)}" if cuda else "cpu"


def missing_wheel(stderr: str) -> str | None:
    """The requirement pip found no wheel for ('antlr4-python3-runtime==4.9.3'), if that is why it failed."""
    found = re.search(r"(?:No matching distribution found for|satisfies the requirement) "
                      r"([A-Za-z0-9_.\-]+(?:[=<>!~]=?[^\s;)]+)?)", stderr)
    return found.group(1) if found else None


def pure_wheel(requirement: str, into: Path) -> None:
    """Build a package that ships only an sdist into a wheel here: fine when it is pure Python."""
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(into), requirement],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{requirement} has no wheel for the hosts' Python and could not be built here:\n"
                         f"{proc.stderr}")
    built = [w for w in into.glob("*.whl") if not re.search(r"-(py3|py2\.py3)-none-any\.whl$", w.name)]
    if built:
        raise SystemExit(f"{requirement} has no wheel for the hosts' Python, and it builds platform code "
                         f"({built[0].name}): build it on a host with that Python")


def reachable(url: str) -> bool:
    try:
        urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=10).close()
        return True
    except (OSError, ValueError):
        return False


def download(requirements: Path, into: Path, python: str, machine: str, accelerator: str) -> None:
    """Every pin (with its dependencies) as wheels for CPython `python` on linux `machine`."""
    pure = into.parent / (into.name + ".pure")
    pure.mkdir(exist_ok=True)
    platforms = [arg for tag in MANYLINUX for arg in ("--platform", f"{tag}_{machine}")]
    command = [sys.executable, "-m", "pip", "download", "-q", "--dest", str(into), "-r", str(requirements),
               "--only-binary", ":all:", "--python-version", python, "--implementation", "cp",
               "--abi", f"cp{python.replace('.', '')}", "--abi", "abi3", "--abi", "none", *platforms,
               "--find-links", str(pure)]
    index = TORCH_INDEX.format(accelerator=accelerator)
    # pip retries an unreachable index for every package (minutes): ask once, and say so
    if reachable(index + "/torch/"):
        command += ["--extra-index-url", index]
    else:
        print(f"{index} is not reachable from here: torch comes from the other indexes", file=sys.stderr)
    for _ in range(10):
        proc = subprocess.run(command, capture_output=True, text=True)
        if proc.returncode == 0:
            shutil.rmtree(pure)
            return
        missing = missing_wheel(proc.stderr)
        if not missing or missing.lower().startswith("torch"):  # torch is never built here
            break
        pure_wheel(missing, pure)
    raise SystemExit(f"pip download failed for Python {python} ({machine}, {accelerator}):\n{proc.stderr[-3000:]}")


def build(root: Path | None = None, python: str | None = None, machine: str = "x86_64",
          accelerator: str = "cpu", requirements: Path = REQUIREMENTS) -> Path:
    """The wheelhouse root, with the build for (python, machine, accelerator) in it."""
    root = root or default_root(requirements)
    python = python or this_python()
    dest = root / key(python, machine, accelerator)
    if (dest / ".complete").exists():
        return root
    tmp = dest.with_name(dest.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)  # an interrupted build goes on: pip skips what it has
    # pip runs quietly (its bars would fill the lab's log): say what takes the minutes
    print(f"wheelhouse: downloading the pins for Python {python} ({machine}, torch {accelerator}) into {dest}: "
          f"~300 MB with the CPU torch, ~2.7 GB with a CUDA one", file=sys.stderr, flush=True)
    fairseq = pinned(requirements, FAIRSEQ)
    others = [line for line in requirements.read_text().splitlines()
              if line.strip() and not line.startswith("#") and line != fairseq]
    (tmp / "requirements.txt").write_text("\n".join(others + BUILD_TOOLS) + "\n")
    download(tmp / "requirements.txt", tmp, python, machine, accelerator)
    torch = sorted(tmp.glob("torch-*.whl"))
    got = torch_build(torch[0]) if torch else "none"
    if got != accelerator:
        raise SystemExit(f"asked for torch's {accelerator} build for Python {python}, the reachable indexes gave "
                         f"{torch[0].name if torch else 'no torch wheel'} ({got}): is "
                         f"{TORCH_INDEX.format(accelerator=accelerator)} reachable from here?")
    version = fairseq.split("==")[1]
    tag = f"cp{python.replace('.', '')}"
    wheels = sorted((cache_dir() / "wheels").glob(f"fairseq_fixed-{version}-{tag}-{tag}-*{machine}.whl"))
    if wheels:
        shutil.copy2(wheels[-1], tmp)
    else:  # the hosts build it once from the sdist (roles/train_env): it compiles against their Python
        # its metadata needs torch and cython to read: this venv's (make setup), not an isolated build
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", FAIRSEQ,
                               "--no-build-isolation", "--dest", str(tmp), fairseq], capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"pip download failed for {fairseq}'s sdist:\n{proc.stderr}")
    # The exact pins the hosts install, fairseq included (installed without its deps).
    shutil.copy2(requirements, tmp / "requirements-train.txt")
    (tmp / ".complete").touch()
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return root


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dest", type=Path, help="the wheelhouse root (default: in the cache)")
    parser.add_argument("--python", default=this_python(), help="the hosts' Python, e.g. 3.12 (default: this one)")
    parser.add_argument("--machine", default="x86_64", help="the hosts' machine (x86_64, aarch64)")
    parser.add_argument("--accelerator", default="cpu",
                        help="torch's build: cpu, or the CUDA of GPU hosts (cu126, cu128, cu130)")
    args = parser.parse_args()
    root = build(args.dest, args.python, args.machine, args.accelerator)
    print(root / key(args.python, args.machine, args.accelerator))


if __name__ == "__main__":
    main()
