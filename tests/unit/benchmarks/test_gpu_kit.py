"""make gpu-kit: what a lent GPU machine is carried (no internet there: a gap is a lost session)."""

from __future__ import annotations

import importlib.metadata
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from benchmarks import gpu_kit

# What runs on the GPU machine: on_gpu.sh's driver, the training entry point, the sampler beside it.
# fairseq itself is left out: here it also imports what this venv happens to have (wandb, scipy...);
# on_gpu.sh imports it there before any run.
GPU_MODULES = ["benchmarks.gpu", "train.report.page", "train.agent.trainer.fairseq_train",
               "train.agent.measure.monitor"]
OURS = {"train", "benchmarks", "lab", "tandem", "fairseq", "fairseq_cli"}  # tandem's; fairseq comes apart


def closure(names) -> set[str]:
    """The distributions `names` need, from this venv's installed metadata (no network)."""
    seen: set[str] = set()
    todo = [canonicalize_name(n) for n in names]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for line in requires:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(canonicalize_name(req.name))
    return seen


def test_the_kit_carries_every_package_the_gpu_run_imports_that_the_image_lacks():
    code = (f"import sys, json\nfor m in {GPU_MODULES!r}: __import__(m)\n"
            "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))")
    imported = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                         check=True).stdout)
    owners = importlib.metadata.packages_distributions()
    third_party = {canonicalize_name(dist) for module in imported
                   if module not in sys.stdlib_module_names and module not in OURS and not module.startswith("_")
                   for dist in owners.get(module, [])} - {"fairseq-fixed"}
    covered = closure(gpu_kit.NEEDS) | closure(gpu_kit.IMAGE)
    assert third_party - covered == set(), "imported on the GPU machine, neither in the image nor in the kit"


def test_every_package_the_kit_needs_is_pinned_in_the_requirement_files():
    wanted = {canonicalize_name(name) for name in gpu_kit.NEEDS}
    pinned = {canonicalize_name(re.split("==", req)[0]) for req in gpu_kit.requirements()}
    assert pinned == wanted
    assert all("==" in req for req in gpu_kit.requirements())


@pytest.mark.parametrize("wheel, python, ok", [
    ("cffi-2.1.1-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl", "3.12", True),
    ("cryptography-50.0.2-cp311-abi3-manylinux_2_34_x86_64.whl", "3.12", True),
    ("hydra_core-1.3.2-py3-none-any.whl", "3.12", True),
    ("cffi-2.1.1-cp311-cp311-manylinux2014_x86_64.whl", "3.12", False),     # another Python's
    ("bcrypt-5.0.0-cp39-abi3-manylinux_2_41_x86_64.whl", "3.12", False),    # glibc newer than Ubuntu 24.04's
    ("bitarray-3.12.3-cp312-cp312-macosx_11_0_arm64.whl", "3.12", False),   # the controller's platform
    ("bitarray-3.12.3-cp312-cp312-manylinux_2_17_aarch64.whl", "3.12", False),
    ("bitarray-3.12.3-cp313-cp313-manylinux_2_17_x86_64.whl", "3.13", True),
])
def test_only_wheels_the_gpu_machines_python_installs_go_in(wheel, python, ok):
    assert gpu_kit.installable(wheel, python) is ok


def _downloaded(tmp_path: Path, wheels: list[str]) -> Path:
    downloaded = tmp_path / "cache"
    for name in wheels:
        (downloaded / "wheels").mkdir(parents=True, exist_ok=True)
        (downloaded / "wheels" / name).write_bytes(b"wheel")
    (downloaded / "sdist").mkdir()
    (downloaded / "sdist" / "fairseq_fixed-0.12.3.1.tar.gz").write_bytes(b"sdist")
    corpus_root = tmp_path / "corpus"
    (corpus_root / "subwords").mkdir(parents=True)
    (corpus_root / "bin").mkdir()
    for split in ("train", "valid", "test"):
        for lang in ("en", "de"):
            (corpus_root / "subwords" / f"{split}.{lang}").write_text("▁a ▁b\n")
    (corpus_root / "bin" / "dict.en.txt").write_text("▁a 1\n")
    (corpus_root / "bin" / "corpus.json").write_text("{}")
    return downloaded


def test_the_manifest_lists_what_on_gpu_sh_installs_and_leaves_the_images_packages_out(tmp_path):
    wheels = ["hydra_core-1.3.2-py3-none-any.whl", "numpy-2.4.6-cp312-cp312-manylinux_2_28_x86_64.whl",
              "jinja2-3.1.6-py3-none-any.whl", "resolvelib-1.2.1-py3-none-any.whl"]
    downloaded = _downloaded(tmp_path, wheels)
    manifest = gpu_kit.assemble(tmp_path / "kit", downloaded, tmp_path / "corpus", "3.12", None)
    kit = tmp_path / "kit"
    assert manifest["install"] == ["hydra-core", "resolvelib"]
    assert sorted(p.name for p in kit.glob("*.whl")) == manifest["wheels"]
    assert manifest["left_to_the_image"] == sorted(["numpy-2.4.6-cp312-cp312-manylinux_2_28_x86_64.whl",
                                                    "jinja2-3.1.6-py3-none-any.whl"])
    assert json.loads((kit / "MANIFEST.json").read_text()) == manifest
    # what on_gpu.sh reads from it
    assert sorted(p.name for p in (kit / "subwords").iterdir()) == sorted(
        [f"{s}.{lang}" for s in ("train", "valid", "test") for lang in ("en", "de")] + ["dict.en.txt", "corpus.json"])
    assert [p.name for p in (kit / "sdist").iterdir()] == ["fairseq_fixed-0.12.3.1.tar.gz"]


def test_a_wheel_for_another_python_stops_the_build(tmp_path):
    downloaded = _downloaded(tmp_path, ["cffi-2.1.1-cp311-cp311-manylinux2014_x86_64.whl"])
    with pytest.raises(SystemExit, match="not installable by CPython 3.12"):
        gpu_kit.assemble(tmp_path / "kit", downloaded, tmp_path / "corpus", "3.12", None)


def test_a_prebuilt_fairseq_wheel_travels_instead_of_a_build_there(tmp_path):
    downloaded = _downloaded(tmp_path, ["hydra_core-1.3.2-py3-none-any.whl"])
    prebuilt = tmp_path / "fairseq_fixed-0.12.3.1-cp312-cp312-linux_x86_64.whl"
    prebuilt.write_bytes(b"wheel")
    manifest = gpu_kit.assemble(tmp_path / "kit", downloaded, tmp_path / "corpus", "3.12", prebuilt)
    assert manifest["fairseq"]["wheel"] == prebuilt.name
    assert (tmp_path / "kit" / prebuilt.name).exists()
    assert "fairseq-fixed" not in manifest["install"]  # on_gpu.sh installs it apart, --no-deps


def test_a_directory_that_is_not_a_kit_is_never_emptied(tmp_path):
    downloaded = _downloaded(tmp_path, ["hydra_core-1.3.2-py3-none-any.whl"])
    mistaken = tmp_path / "work"
    mistaken.mkdir()
    (mistaken / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit, match="holds no kit"):
        gpu_kit.assemble(mistaken, downloaded, tmp_path / "corpus", "3.12", None)
    assert (mistaken / "notes.txt").read_text() == "mine"
    gpu_kit.assemble(tmp_path / "kit", downloaded, tmp_path / "corpus", "3.12", None)
    gpu_kit.assemble(tmp_path / "kit", downloaded, tmp_path / "corpus", "3.12", None)  # a kit is rebuilt


def test_a_rebuild_keeps_what_else_the_kit_holds_and_refuses_a_foreign_manifest(tmp_path):
    downloaded = _downloaded(tmp_path, ["hydra_core-1.3.2-py3-none-any.whl"])
    kit = tmp_path / "kit"
    gpu_kit.assemble(kit, downloaded, tmp_path / "corpus", "3.12", None)
    (kit / "tools").mkdir()
    (kit / "tools" / "py_spy-0.4.0-py2.py3-none-manylinux_2_5_x86_64.whl").write_bytes(b"wheel")
    (kit / "stale-1.0-py3-none-any.whl").write_bytes(b"old")
    gpu_kit.assemble(kit, downloaded, tmp_path / "corpus", "3.12", None)
    assert (kit / "tools" / "py_spy-0.4.0-py2.py3-none-manylinux_2_5_x86_64.whl").exists()  # on_gpu.sh's PROFILE
    assert not (kit / "stale-1.0-py3-none-any.whl").exists()
    # another tool's MANIFEST.json (a web app's, an extension's) is not a kit's
    site = tmp_path / "site"
    site.mkdir()
    (site / "MANIFEST.json").write_text('{"name": "my app"}')
    (site / "index.html").write_text("mine")
    with pytest.raises(SystemExit, match="holds no kit"):
        gpu_kit.assemble(site, downloaded, tmp_path / "corpus", "3.12", None)
    assert (site / "index.html").read_text() == "mine"
    afile = tmp_path / "kit.txt"
    afile.write_text("mine")
    with pytest.raises(SystemExit, match="is a file"):
        gpu_kit.assemble(afile, downloaded, tmp_path / "corpus", "3.12", None)
    assert afile.read_text() == "mine"
