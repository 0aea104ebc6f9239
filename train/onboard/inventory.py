"""Which inventory every fab task reads, and saying so when the user did not name it.

    FABRIC_INVENTORY=FILE   the user's choice: read, nothing said
    unset                   fabric.yaml's `inventory`, inventory/mine.yml (where `fab init` writes), said once on
                            stderr: `inventory: inventory/mine.yml (fabric.yaml's, written by fab init;
                            FABRIC_INVENTORY overrides)`

Without FABRIC_INVENTORY, an inventory that does not exist, or one whose hosts are all at documentation
addresses (RFC 5737: inventory/hosts.yml, the commented example, or a file written from the README's
203.0.113.x), is refused in one line with the fix (exit 2), before any host is asked. Named with
FABRIC_INVENTORY, either is read as named (the tests read the example; its hosts are never reached).
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..cluster import TOP, Host, load_hosts
from ..errors import BadInventory

DEFAULT = "inventory/mine.yml"  # fabric.yaml's `inventory`, fab init's default --out
EXAMPLE_NETS = tuple(ipaddress.ip_network(n) for n in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24"))
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
