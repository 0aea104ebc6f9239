"""The controller installs ansible-core and only the collections requirements-collections.txt names
(lab/bootstrap.sh), not the whole ansible release: a role that calls a module of another collection
would fail on a user's laptop with "couldn't resolve module/action", though the tests' environment,
which has the whole release, passes it."""

from __future__ import annotations

import re
from pathlib import Path

TOP = Path(__file__).resolve().parents[2]
MODULE_CALL = re.compile(r"^\s*-?\s*([a-z0-9_]+\.[a-z0-9_]+)\.[a-z0-9_]+:", re.MULTILINE)
LOOKUP = re.compile(r"(?:lookup|query)\(\s*['\"]([a-z0-9_]+\.[a-z0-9_]+)\.[a-z0-9_]+['\"]")


def installed_collections() -> set[str]:
    lines = (TOP / "requirements-collections.txt").read_text().splitlines()
    return {line.strip() for line in lines if line.strip() and not line.startswith("#") and "==" not in line}


def used_collections() -> dict[str, str]:
    """Each collection a task, handler or lookup names, with one file that names it."""
    used: dict[str, str] = {}
    files = [TOP / "provision.yml", *(TOP / "playbooks").rglob("*.yml"), *(TOP / "roles").rglob("*.yml")]
    for path in files:
        text = path.read_text()
        for name in MODULE_CALL.findall(text) + LOOKUP.findall(text):
            used.setdefault(name, str(path.relative_to(TOP)))
    return used


def test_every_collection_the_roles_call_is_one_the_controller_installs():
    used = used_collections()
    assert {"ansible.posix", "community.general"} <= set(used)  # the scan finds the calls it must
    missing = {name: where for name, where in used.items()
               if name != "ansible.builtin" and name not in installed_collections()}
    assert not missing, f"requirements-collections.txt lacks {missing}"


def test_the_controller_installs_ansible_core_not_the_whole_release():
    controller = (TOP / "requirements.txt").read_text()
    assert re.search(r"^ansible-core==", controller, re.MULTILINE)
    assert not re.search(r"^(ansible|torch|fairseq\S*)==", controller, re.MULTILINE)
