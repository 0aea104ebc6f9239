"""The wheelhouse is built per (Python, machine, torch build): a GPU host must never get the CPU
torch, nor a 3.12 host 3.11's wheels."""

from __future__ import annotations

import zipfile

import pytest

from train.provision import wheelhouse


def fake_torch(tmp_path, name: str, requires: list[str]):
    path = tmp_path / name
    with zipfile.ZipFile(path, "w") as whl:
        whl.writestr("torch-2.13.0.dist-info/METADATA",
                     "Name: torch\nVersion: 2.13.0\n" + "".join(f"Requires-Dist: {r}\n" for r in requires))
    return path


def test_the_torch_build_is_read_from_the_wheel(tmp_path):
    assert wheelhouse.torch_build(fake_torch(tmp_path, "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl",
                                             [])) == "cpu"
    assert wheelhouse.torch_build(fake_torch(tmp_path, "torch-2.13.0+cu128-cp312-cp312-manylinux_2_28_x86_64.whl",
                                             [])) == "cu128"
    # PyPI's build has no local version: its metadata names the CUDA it needs
    pypi = fake_torch(tmp_path, "torch-2.13.0-cp313-cp313-manylinux_2_28_x86_64.whl", [
        "filelock", 'cuda-toolkit[cublas,cudart]==13.0.3; platform_system == "Linux"'])
    assert wheelhouse.torch_build(pypi) == "cu130"
    older = fake_torch(tmp_path, "torch-2.7.0-cp312-cp312-manylinux_2_28_x86_64.whl", [
        'nvidia-cuda-runtime-cu12==12.6.77; platform_system == "Linux"'])
    assert wheelhouse.torch_build(older) == "cu126"
    mac = fake_torch(tmp_path, "torch-2.13.0-cp313-none-macosx_14_0_arm64.whl", ["filelock"])
    assert wheelhouse.torch_build(mac) == "cpu"


def test_the_build_is_named_as_the_role_names_it():
    assert wheelhouse.key("3.12", "x86_64", "cu128") == "py3.12-x86_64-cu128"


@pytest.mark.parametrize(("stderr", "missing"), [
    ("ERROR: Could not find a version that satisfies the requirement antlr4-python3-runtime==4.9.* "
     "(from omegaconf) (from versions: none)\nERROR: No matching distribution found for antlr4-python3-runtime==4.9.*",
     "antlr4-python3-runtime==4.9.*"),
    ("ERROR: No matching distribution found for numpy==2.4.6", "numpy==2.4.6"),
    ("ERROR: HTTP error 403 while getting https://example.invalid/x.whl", None),
])
def test_what_pip_found_no_wheel_for_is_read_from_its_error(stderr, missing):
    assert wheelhouse.missing_wheel(stderr) == missing
