"""tandem's version as `fab version` says it: the installed package's (pyproject.toml), and the
commit of the checkout it runs from, when it runs from one.

`fab --version` cannot say it: Invoke answers it with Fabric's before it loads the fabfile.
"""

from __future__ import annotations

import subprocess
from importlib import metadata

from ..cluster import TOP


def package_version() -> str:
    try:
        return metadata.version("tandem")
    except metadata.PackageNotFoundError:  # a checkout that was never installed: pyproject says it
        import tomllib

        return tomllib.loads((TOP / "pyproject.toml").read_text())["project"]["version"]


def git_commit() -> str | None:
    """The checkout's short commit, `+changes` when files differ from it; None outside a checkout."""
    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(TOP), *args], capture_output=True, text=True, timeout=10)

    try:
        head = git("rev-parse", "--short", "HEAD")
    except (OSError, subprocess.TimeoutExpired):
        return None
    if head.returncode != 0:
        return None
    dirty = git("status", "--porcelain", "--untracked-files=no").stdout.strip()
    return head.stdout.strip() + ("+changes" if dirty else "")


def line() -> str:
    """`tandem 0.1.0 (git 0aaabd7)`."""
    commit = git_commit()
    return f"tandem {package_version()}" + (f" (git {commit})" if commit else "")
