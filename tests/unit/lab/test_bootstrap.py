"""lab/bootstrap.sh as the README's step 1 runs it: `make setup && source .venv/bin/activate` in a user's
login shell, then `fab` by its bare name.

`make setup` runs in a copy of the checkout (the checkout's own .venv is in use), on this machine's
$TANDEM_CACHE: the controller's shared virtualenv is built there once (~40 s), then .venv takes ~1 s.
Each command runs in a fresh login shell with a clean environment (`env -i`, a home of its own), as a
user types it."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from labtools import TOP

from lab.config import default_cache


def copy_of_the_checkout(dest: Path) -> Path:
    """The checkout's files (committed or not, ignored ones aside: no .venv)."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=TOP,
                           capture_output=True, text=True, check=True).stdout.split("\0")
    for rel in filter(None, files):
        if (TOP / rel).is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(TOP / rel, dest / rel)
    return dest


class Checkout:
    """A copy of the checkout, and a user's fresh login shell in it."""

    def __init__(self, where: Path):
        self.path, self.home = copy_of_the_checkout(where / "tandem"), where / "home"
        self.home.mkdir()

    def login_shell(self, command: str, timeout: float = 60) -> subprocess.CompletedProcess:
        env = ["env", "-i", f"HOME={self.home}", "PATH=/usr/bin:/bin", "LANG=C.UTF-8", "COLUMNS=200",
               f"TANDEM_CACHE={default_cache()}", f"TANDEM_PYTHON={os.path.realpath(sys.executable)}"]
        return subprocess.run([*env, "bash", "-lc", f"cd {shlex.quote(str(self.path))} && {command}"],
                              capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
    checkout = Checkout(tmp_path_factory.mktemp("setup"))
    setup = checkout.login_shell("make setup && source .venv/bin/activate", timeout=900)
    assert setup.returncode == 0, setup.stdout[-3000:] + setup.stderr[-3000:]
    assert "ready: .venv" in setup.stdout, setup.stdout
    return checkout


def test_fab_runs_by_its_bare_name_once_the_venv_is_activated(checkout):
    activated = "source .venv/bin/activate && "
    where = checkout.login_shell(activated + 'echo "$VIRTUAL_ENV"; echo "$PS1"; command -v fab')
    assert where.returncode == 0, where.stdout + where.stderr
    venv, prompt, fab = where.stdout.splitlines()
    assert venv == str(checkout.path / ".venv")
    assert prompt.startswith("(.venv) "), prompt
    assert fab == str(checkout.path / ".venv" / "bin" / "fab")

    listed = checkout.login_shell(activated + "fab -l")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert {"init", "train", "version"} <= {line.split()[0] for line in listed.stdout.splitlines()[1:] if line.strip()}

    version = checkout.login_shell(activated + "fab version")
    assert version.returncode == 0, version.stdout + version.stderr
    pyproject = tomllib.loads((checkout.path / "pyproject.toml").read_text())
    assert version.stdout.split()[:2] == ["tandem", pyproject["project"]["version"]], version.stdout


def test_nothing_in_the_venv_names_the_folder_it_was_built_in(checkout):
    """activate*, pyvenv.cfg, the tools' #! and exec lines, links: .venv's own place, never .venv.new."""
    venv = checkout.path / ".venv"
    assert not (checkout.path / ".venv.new").exists()
    named = []
    for path in venv.rglob("*"):
        if path.is_symlink():
            text = os.readlink(path)
        elif path.is_file():
            text = path.read_bytes().decode(errors="replace")
        else:
            continue
        if ".venv.new" in text:
            named.append(str(path.relative_to(venv)))
    assert not named, f"these name .venv.new: {named}"
    shebangs = [p.read_text().splitlines()[:2] for p in (venv / "bin").iterdir()
                if not p.is_symlink() and p.read_bytes().startswith(b"#!")]
    assert any(str(venv / "bin" / "python") in " ".join(lines) for lines in shebangs)  # fab's, ansible's, ...
