"""Which inventory every fab task reads, and saying so when the user did not name it.

    FABRIC_INVENTORY=FILE   the user's choice: read, nothing said
    unset                   fabric.yaml's `inventory`, inventory/mine.yml (where `fab init` writes), said once on
                            stderr: `inventory: inventory/mine.yml (fabric.yaml's, written by fab init;
                            FABRIC_INVENTORY overrides)`

Without FABRIC_INVENTORY, an inventory that does not exist, or one whose hosts are all at documentation
addresses (RFC 5737: inventory/hosts.yml, the commented example, or a file written from the README's
203.0.113.x), is refused in one line with the fix (exit 2), before any host is asked. Named with
FABRIC_INVENTORY, either is read as named (the tests read the example; its hosts are never reached).

Named or not, an inventory that is not there, a directory (Ansible would read every file in it: all of /tmp), or
a file that is not YAML is refused in one line (exit 2) before Ansible reads it; an INI file (`*.ini`) and an
executable inventory script are left to Ansible.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from ..cluster import TOP, Host, load_hosts
from ..errors import BadInventory

DEFAULT = "inventory/mine.yml"  # fabric.yaml's `inventory`, fab init's default --out
EXAMPLE_NETS = tuple(ipaddress.ip_network(n) for n in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24"))
LAB = "inventory/lab.yml"  # `make lab-up` writes it
FIX = "write yours with `fab init --hosts-at ADDRESSES --user USER` (README step 2), or name one: " \
      "export FABRIC_INVENTORY=FILE"


@dataclass(frozen=True)
class Choice:
    path: Path
    named: bool  # FABRIC_INVENTORY names it
    configured: str  # fabric.yaml's `inventory`

    @property
    def shown(self) -> str:
        return os.path.relpath(self.path, TOP) if self.path.is_relative_to(TOP) else str(self.path)

    def note(self) -> str:
        """The line that says which inventory fab reads when the user did not name it."""
        whose = "fabric.yaml's, written by fab init" if self.configured == DEFAULT else "fabric.yaml's"
        return f"inventory: {self.shown} ({whose}; FABRIC_INVENTORY overrides)"


def _absolute(text: str) -> Path:
    path = Path(os.path.expanduser(text))
    return path if path.is_absolute() else TOP / path


def choose(configured: str | None, environ: Mapping[str, str] = os.environ) -> Choice:
    """FABRIC_INVENTORY's inventory, else fabric.yaml's `configured` (DEFAULT when none), which must exist."""
    named = environ.get("FABRIC_INVENTORY")
    if named:
        return Choice(_absolute(named), True, configured or DEFAULT)
    choice = Choice(_absolute(configured or DEFAULT), False, configured or DEFAULT)
    if not choice.path.exists():
        raise BadInventory(f"no inventory: FABRIC_INVENTORY is not set and {choice.shown} (fabric.yaml's) does not "
                          f"exist: {FIX}")
    return choice


def readable(choice: Choice) -> None:
    """Refuse, as the module says, an inventory that is not there, a directory or a file that is not YAML (its
    line and why); the YAML's syntax only, as Ansible's tags (!vault) need no constructor here."""
    which = "FABRIC_INVENTORY names" if choice.named else "fabric.yaml's inventory is"
    path = choice.path
    if not path.exists():  # unnamed: choose said it
        fix = "the lab's: `make lab-up` writes it" if path == TOP / LAB else FIX
        raise BadInventory(f"no inventory: {which} {choice.shown}, which does not exist: {fix}")
    if path.is_dir():
        raise BadInventory(f"{which} {choice.shown}, a directory: name the inventory file in it "
                           f"(e.g. export FABRIC_INVENTORY={choice.shown.rstrip('/')}/mine.yml)")
    if path.suffix == ".ini" or (path.suffix not in (".yml", ".yaml") and os.access(path, os.X_OK)):
        return
    try:
        node = yaml.compose(path.read_bytes(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except OSError as err:
        raise BadInventory(f"{which} {choice.shown}, which cannot be read: {err.strerror}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        said = " ".join(str(getattr(err, "problem", None) or err).split())
        if path.suffix in (".yml", ".yaml"):
            where = f"{choice.shown}, line {mark.line + 1}" if mark else choice.shown
            raise BadInventory(f"inventory {where}: not valid YAML ({said}): fix that line (an indentation, "
                               "a missing ':' or quote)") from None
        at = f"line {mark.line + 1}: " if mark else ""
        raise BadInventory(f"{which} {choice.shown}, which is not YAML ({at}{said}): name a YAML inventory (fab init "
                           "writes one), an INI one as *.ini or an executable inventory script") from None
    if not isinstance(node, yaml.MappingNode):
        raise BadInventory(f"{which} {choice.shown}, which is {'empty' if node is None else 'no inventory'}: a YAML "
                           "inventory names its groups (all:, cluster:) or a cloud's plugin: at the top (fab init "
                           "writes one)")


def placeholders(hosts: Sequence[Host]) -> bool:
    """Whether every host is at a documentation address (RFC 5737): an example, not a cluster."""
    def example(address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(ip in net for net in EXAMPLE_NETS)

    return bool(hosts) and all(example(h.address) for h in hosts)


_said: set[str] = set()


def load(configured: str | None, say: Callable[[str], None], environ: Mapping[str, str] = os.environ) -> list[Host]:
    """The chosen inventory's `cluster` hosts (train.cluster.load_hosts); `say` hears once which inventory it
    is when FABRIC_INVENTORY did not name it. Raises BadInventory as the module's docstring says."""
    choice = choose(configured, environ)
    readable(choice)
    hosts = load_hosts(choice.path)
    if choice.named:
        return hosts
    if placeholders(hosts):
        at = ", ".join(f"{h.name} {h.address}" for h in hosts)
        raise BadInventory(f"{choice.shown} (fabric.yaml's inventory) is an example: its hosts are at documentation "
                          f"addresses ({at}), no machine of yours: {FIX}")
    if choice.shown not in _said:
        _said.add(choice.shown)
        say(choice.note())
    return hosts
