"""The kit a lent GPU machine needs, built here in one command (the machine has no internet).

    python -m benchmarks.gpu_kit [--python 3.12] [--dest kit]          (make gpu-kit PYTHON=3.12)

    kit/*.whl                           what the GPU image lacks, for CPython X.Y on manylinux x86_64:
                                        fairseq's runtime deps, ansible-core (on_gpu.sh's ansible-playbook),
                                        fabric (benchmarks.gpu's report imports train.cluster), their deps,
                                        cython and wheel (fairseq's build); NEEDS says why each
    kit/sdist/fairseq_fixed-<pin>.tar.gz  fairseq's sdist: benchmarks/on_gpu.sh builds its wheel there...
    kit/fairseq_fixed-<pin>-cpXY-*.whl  ...unless $TANDEM_CACHE/wheels has one built for that Python
    kit/subwords/                       tandem's subwords of the shared WMT en-de sample (vocab 32000):
                                        {train,valid,test}.{en,de}, dict.en.txt, corpus.json
    kit/MANIFEST.json                   what is in it and why, and what the image is taken to have

Then, on the machine: `KIT=kit OUT=out bash benchmarks/on_gpu.sh`. Downloads and the subwords are kept in
$TANDEM_CACHE/gpu-kit: a second build copies them (seconds).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import canonicalize_name, parse_wheel_filename

from train.agent.data import corpus
from train.provision.wheelhouse import cache_dir, pure_wheel

TOP = Path(__file__).resolve().parent.parent
SAMPLE = TOP.parent / "shared" / "data" / "wmt-en-de-sample"
PIN_FILES = (TOP / "requirements-train.txt", TOP / "requirements.txt", TOP / "requirements-build.txt")
FAIRSEQ = "fairseq-fixed"
VOCAB = 32000
# The lent machines run Ubuntu 24.04: glibc 2.39 takes every manylinux tag up to manylinux_2_39.
GLIBC_MINOR = 39
MANYLINUX = [f"manylinux_2_{minor}" for minor in range(GLIBC_MINOR, 4, -1)] + ["manylinux2014", "manylinux2010",
                                                                                 "manylinux1"]
MACHINE = "x86_64"
# What the kit exists for: each name, why the machine needs it (pins: PIN_FILES, else ANTLR's).
NEEDS = {
    "hydra-core": "fairseq's config", "omegaconf": "fairseq's config", "bitarray": "fairseq's data",
    "tensorboardX": "fairseq imports it", "cffi": "fairseq's runtime deps",
    "antlr4-python3-runtime": "hydra-core's (an sdist only: built here as py3-none-any)",
    "ansible-core": "on_gpu.sh's ansible-playbook (provisioning's GPU checks)",
    "fabric": "benchmarks.gpu's report imports train.cluster", "paramiko": "train.cluster",
    "invoke": "train.cluster",
    # on_gpu.sh builds fairseq's wheel there against the image's torch (--no-build-isolation): pip takes
    # these only if the image lacks them
    "cython": "building fairseq's wheel", "wheel": "building fairseq's wheel",
}
ANTLR = "antlr4-python3-runtime==4.9.3"  # hydra-core 1.3.2 wants 4.9.*
# What the GPU image already has (Python 3.12, torch 2.11 cu130), and what those bring that the kit's
# packages also ask for: left out of the kit. on_gpu.sh installs with pip's resolver, so a wrong
# guess here fails there by name ("No matching distribution found for X").
IMAGE = ("torch", "numpy", "sacrebleu", "sentencepiece", "psutil", "nvidia-ml-py", "rich", "matplotlib",
         "jinja2", "pyyaml", "markupsafe", "packaging")


def pins() -> dict[str, str]:
    """name -> 'name==version' from the requirement files, requirements-train.txt first."""
    found: dict[str, str] = {}
    for path in PIN_FILES:
        for line in path.read_text().splitlines():
            line = line.split("#")[0].strip()
            if "==" in line:
                found.setdefault(canonicalize_name(line.split("==")[0]), line)
    return found


def requirements() -> list[str]:
    """The kit's top-level requirements, pinned."""
    pinned = pins() | {canonicalize_name(ANTLR.split("==")[0]): ANTLR}
    missing = [name for name in NEEDS if canonicalize_name(name) not in pinned]
    if missing:
        raise SystemExit(f"no pin for {', '.join(missing)} in {', '.join(p.name for p in PIN_FILES)}")
    return [pinned[canonicalize_name(name)] for name in NEEDS]


def constraints() -> list[str]:
    """The pins, then what this venv runs for the rest (cryptography, resolvelib, pycparser...): the kit
    carries the versions tandem's tests ran with, not whatever is newest today."""
    pinned = pins()
    here = {canonicalize_name(d.metadata["Name"]): f"{d.metadata['Name']}=={d.version}"
            for d in importlib.metadata.distributions() if "+" not in d.version}
    return sorted(pinned.values()) + sorted(v for k, v in here.items() if k not in pinned)


def target_tags(python: str) -> set[Tag]:
    """Every wheel tag CPython `python` on the GPU image installs."""
    version = tuple(int(part) for part in python.split("."))
    platforms = [f"{tag}_{MACHINE}" for tag in MANYLINUX]
    return set(cpython_tags(version, platforms=platforms)) | set(compatible_tags(version, platforms=platforms))


def installable(wheel: str, python: str) -> bool:
    return bool(parse_wheel_filename(wheel)[3] & target_tags(python))


def in_image(wheel: str) -> bool:
    return parse_wheel_filename(wheel)[0] in {canonicalize_name(name) for name in IMAGE}


def _pip(*args: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"pip {' '.join(args[:2])} failed:\n{proc.stderr[-3000:]}")


def download(python: str) -> Path:
    """The wheels (with their deps) for the target and fairseq's sdist, in the cache; once per inputs."""
    fairseq = pins()[FAIRSEQ]
    inputs = json.dumps([python, MANYLINUX, requirements(), constraints(), fairseq])
    cache = cache_dir() / "gpu-kit" / f"py{python}-{hashlib.sha256(inputs.encode()).hexdigest()[:12]}"
    if (cache / ".complete").exists():
        return cache
    cache.mkdir(parents=True, exist_ok=True)
    print(f"gpu-kit: downloading wheels for CPython {python} into {cache}", file=sys.stderr, flush=True)
    (cache / "constraints.txt").write_text("\n".join(constraints()) + "\n")
    pure = cache / "pure"
    if not list(pure.glob("antlr4*.whl")):
        pure_wheel(ANTLR, pure)
    platforms = [arg for tag in MANYLINUX for arg in ("--platform", f"{tag}_{MACHINE}")]
    _pip("download", "-q", "--dest", str(cache / "wheels"), "--only-binary", ":all:", "--python-version", python,
         "--implementation", "cp", "--abi", f"cp{python.replace('.', '')}", "--abi", "abi3", "--abi", "none",
         *platforms, "--find-links", str(pure), "-c", str(cache / "constraints.txt"), *requirements())
    # its metadata needs torch to read: this venv's, not an isolated build's
    _pip("download", "-q", "--no-deps", "--no-binary", ":all:", "--no-build-isolation", "--dest",
         str(cache / "sdist"), fairseq)
    (cache / ".complete").touch()
    return cache


def subwords(work: Path, sample: Path) -> Path:
    """tandem's subwords of the sample (train.agent.data.corpus: resumable, so a second build does nothing)."""
    print(f"gpu-kit: subwords of {sample} (vocab {VOCAB})", file=sys.stderr, flush=True)
    made = corpus.prepare("wmt-sample", work, source=sample, vocab_size=VOCAB)
    return Path(made.bin_dir).parent


def prebuilt_fairseq(python: str) -> Path | None:
    """A fairseq wheel built for that Python before (on_gpu.sh returns the one it builds: put it there)."""
    version, tag = pins()[FAIRSEQ].split("==")[1], f"cp{python.replace('.', '')}"
    wheels = sorted((cache_dir() / "wheels").glob(f"fairseq_fixed-{version}-{tag}-{tag}-*{MACHINE}.whl"))
    return wheels[-1] if wheels else None


# What a build writes into --dest (besides its *.whl): a rebuild clears these and keeps anything else
# there (tools/: the py-spy wheel on_gpu.sh's PROFILE installs).
KIT_ENTRIES = ("sdist", "subwords", "MANIFEST.json")


def _is_kit(dest: Path) -> bool:
    """`dest` holds a kit this module wrote: its MANIFEST.json parses and has the kit's keys."""
    try:
        manifest = json.loads((dest / "MANIFEST.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and {"needs", "wheels", "subwords"} <= manifest.keys()


def _fresh(dest: Path) -> None:
    """Clear the kit's own entries in `dest`; never a directory that holds no kit (a mistyped --dest)
    nor what a kit's directory holds besides (tools/)."""
    if dest.exists() and not dest.is_dir():
        raise SystemExit(f"--dest {dest} is a file, not a directory: give another --dest")
    if dest.is_dir() and any(dest.iterdir()) and not _is_kit(dest):
        raise SystemExit(f"{dest} is not empty and holds no kit (no MANIFEST.json of gpu_kit's): give another --dest")
    if dest.is_dir():
        for path in [*dest.glob("*.whl"), *(dest / name for name in KIT_ENTRIES)]:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            elif path.exists() or path.is_symlink():
                path.unlink()
    (dest / "sdist").mkdir(parents=True)
    (dest / "subwords").mkdir()


def assemble(dest: Path, downloaded: Path, corpus_root: Path, python: str, fairseq_wheel: Path | None) -> dict:
    """Copy the kit into `dest`; returns its manifest (also written as MANIFEST.json)."""
    _fresh(dest)
    wheels = sorted(p.name for p in (downloaded / "wheels").glob("*.whl"))
    wrong = [w for w in wheels if not installable(w, python)]
    if wrong:
        raise SystemExit(f"not installable by CPython {python} on manylinux {MACHINE}: {', '.join(wrong)}")
    kept = [w for w in wheels if not in_image(w)]
    for name in kept:
        shutil.copy2(downloaded / "wheels" / name, dest)
    for sdist in (downloaded / "sdist").iterdir():
        shutil.copy2(sdist, dest / "sdist")
    if fairseq_wheel:
        shutil.copy2(fairseq_wheel, dest)
    for split in corpus.SPLITS:
        for lang in corpus.LANGS:
            shutil.copy2(corpus_root / "subwords" / f"{split}.{lang}", dest / "subwords")
    for name in ("dict.en.txt", "corpus.json"):
        shutil.copy2(corpus_root / "bin" / name, dest / "subwords")
    manifest = {
        "python": python, "platforms": [f"{tag}_{MACHINE}" for tag in MANYLINUX],
        "install": [canonicalize_name(parse_wheel_filename(w)[0]) for w in kept],
        "wheels": kept, "left_to_the_image": sorted(set(wheels) - set(kept)),
        "needs": NEEDS, "image": list(IMAGE),
        "fairseq": {"sdist": sorted(p.name for p in (dest / "sdist").iterdir()),
                    "wheel": fairseq_wheel.name if fairseq_wheel else None},
        "subwords": sorted(p.name for p in (dest / "subwords").iterdir()),
    }
    (dest / "MANIFEST.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def size_mb(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 2**20


def build(dest: Path, python: str, sample: Path = SAMPLE) -> dict:
    start = time.monotonic()
    downloaded = download(python)
    corpus_root = subwords(cache_dir() / "gpu-kit" / "data", sample)
    manifest = assemble(dest, downloaded, corpus_root, python, prebuilt_fairseq(python))
    for wheel in manifest["wheels"]:
        print(f"  {wheel}")
    fairseq = manifest["fairseq"]["wheel"] or f"{manifest['fairseq']['sdist'][0]} (built there)"
    print(f"{dest}: {len(manifest['wheels'])} wheels for CPython {python}, fairseq {fairseq}, "
          f"subwords of {sample.name}; {size_mb(dest):.1f} MiB, {time.monotonic() - start:.0f} s")
    return manifest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default="3.12", help="the GPU machine's Python (default 3.12)")
    parser.add_argument("--dest", type=Path, default=TOP / "kit", help="the kit's directory (default: kit)")
    parser.add_argument("--sample", type=Path, default=SAMPLE, help="the corpus whose subwords travel")
    args = parser.parse_args()
    if not re.fullmatch(r"3\.\d+", args.python):
        parser.error(f"--python {args.python}: a CPython version such as 3.12")
    build(args.dest, args.python, args.sample)


if __name__ == "__main__":
    main()
