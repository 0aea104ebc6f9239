"""The cluster as Fabric sees it: hosts resolved through the Ansible inventory.

The inventory is the one source of truth (address, user, key, known_hosts, GPUs, NIC,
data device). Which inventory the fab tasks read: train.onboard.inventory (`FABRIC_INVENTORY`, else
`inventory:` in fabric.yaml, inventory/mine.yml).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import paramiko
import yaml
from fabric import Connection, ThreadingGroup
from fabric.exceptions import GroupException
from invoke.exceptions import UnexpectedExit
from invoke.runners import Result

from . import hostvars, inventory_cache, inventory_vault, ssh_config
from .errors import ClusterError  # below train.hostvars, which raises it too; callers import it from here

TOP = Path(__file__).resolve().parent.parent
CLUSTER_GROUP = "cluster"


@dataclass(frozen=True)
class Host:
    """One host. `address` is where the controller's SSH reaches it (ansible_host, often a public
    or NAT'd address); `cluster_address` is where the other hosts reach it (the inventory's
    `cluster_address`, else `address`): everything host to host uses it, never `address`."""

    name: str
    address: str
    user: str = "root"
    port: int = 22
    key: str | None = None
    known_hosts: str | None = None
    gpus: int = 0
    nic: str | None = None
    data_device: str | None = None
    vars: dict = field(default_factory=dict, compare=False, repr=False)
    cluster_address: str = ""

    def __post_init__(self) -> None:
        if not self.cluster_address:
            object.__setattr__(self, "cluster_address", self.address)

    def var(self, name: str) -> object:
        """The inventory's `name` for this host, typed, its default when unset (train.hostvars defines
        every name tandem reads; another raises)."""
        return hostvars.get(self, name)

    @property
    def ranks(self) -> int:
        """How many ranks (training processes) this host runs: one per GPU on a GPU host; on a CPU
        host the inventory's `cpu_ranks` (default 1). The one place that says it: torchrun's
        --nproc_per_node, fairseq's world size, the cost model, the benchmarks and every view of
        which ranks run where read it."""
        if self.gpus > 0:
            return self.gpus
        return self.var("cpu_ranks")  # type: ignore[return-value]


def rank_layout(ranks_per_host: Sequence[int]) -> list[range]:
    """The global ranks of each host, in host order: torchrun numbers a host's ranks after those of
    the hosts before it (node_rank × nproc_per_node + local_rank).

    >>> rank_layout([2, 2])
    [range(0, 2), range(2, 4)]
    """
    out, first = [], 0
    for n in ranks_per_host:
        out.append(range(first, first + n))
        first += n
    return out


def ranks_label(ranks: range) -> str:
    """'0' for one rank, '2-3' for several: how every view names a host's ranks."""
    if len(ranks) == 0:
        return "-"
    return str(ranks.start) if len(ranks) == 1 else f"{ranks.start}-{ranks.stop - 1}"


def placement(hosts: Sequence[Host]) -> str:
    """Which ranks run on which host, rank 0's host first: 'v100a 0-1, v100b 2-3'."""
    spans = rank_layout([h.ranks for h in hosts])
    return ", ".join(f"{h.name} {ranks_label(r)}" for h, r in zip(hosts, spans, strict=True))


def world_size(hosts: Sequence[Host]) -> int:
    """Every rank of every host: fairseq's distributed world size, the cost model's n."""
    return sum(h.ranks for h in hosts)


def load_hosts(path: Path) -> list[Host]:
    """Every host of the inventory's `cluster` group, in inventory order (= node rank)."""
    if not path.exists():
        raise ClusterError(f"inventory {path} does not exist (lab: `make lab-up` writes inventory/lab.yml)")
    cached = inventory_cache.read(path)
    if cached is None:  # tandem's variables only, read or not from the cache: one behaviour either way
        cached = inventory_cache.kept(parse_inventory(path))
        inventory_cache.write(path, cached)
    return one_name_a_machine([_host(name, inventory_vault.opened(name, variables)) for name, variables in cached],
                              path)


def one_name_a_machine(hosts: list[Host], path: Path) -> list[Host]:
    """`hosts`, refused where two names reach the same SSH login: that machine would train as two
    hosts (its GPUs given twice the ranks) and every parallel call would answer for one name only."""
    seen: dict[tuple, str] = {}
    for host in hosts:
        login = (host.user, host.address, host.port or 22)
        if login in seen:
            raise ClusterError(f"inventory {path}: {seen[login]} and {host.name} are both "
                               f"{host.user}@{host.address}:{host.port or 22}, one machine under two names; list it "
                               "once (its `gpus:` gives it one rank a GPU)")
        seen[login] = host.name
    return hosts


def parse_inventory(path: Path) -> list[tuple[str, dict]]:
    """Ansible's own reading of the inventory: each `cluster` host's name and variables."""
    # Ansible's own parser: group_vars, host_vars and every inventory format just work.
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.plugins.loader import init_plugin_loader
    from ansible.utils.collection_loader import AnsibleCollectionConfig
    from ansible.vars.manager import VariableManager

    if AnsibleCollectionConfig.collection_finder is None:  # as Ansible's CLIs do: a cloud inventory's plugin
        init_plugin_loader()  # (amazon.aws.aws_ec2, docs/inventory.md) lives in a collection
    loader = DataLoader()
    manager = InventoryManager(loader=loader, sources=[str(path)])
    variables = VariableManager(loader=loader, inventory=manager)
    group = manager.groups.get(CLUSTER_GROUP)
    members = group.get_hosts() if group else manager.get_hosts()
    if not members:
        yaml_error(path)  # Ansible only warns that it could not parse the file: say where and why
        raise ClusterError(f"inventory {path} lists no hosts (expected a `{CLUSTER_GROUP}` group; Ansible's warnings "
                           "above say why a source did not parse: a cloud's needs inventory/examples/requirements.*)")
    return [(h.name, variables.get_vars(host=h)) for h in members]


def yaml_error(path: Path) -> None:
    """Raise ClusterError naming the file and line where the YAML inventory at `path` (a file, or the
    YAML files of a directory) does not parse; nothing when it does."""
    for file in sorted(path.iterdir()) if path.is_dir() else [path]:
        if file.suffix not in (".yml", ".yaml"):
            continue
        try:  # the syntax only: Ansible's own tags (!vault) need no constructor here
            for _ in yaml.compose_all(file.read_text()):
                pass
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f"{file}, line {mark.line + 1}" if mark else str(file)
            said = " ".join(str(getattr(err, "problem", None) or err).split())
            raise ClusterError(f"inventory {where}: not valid YAML ({said}): fix that line (an indentation, "
                               "a missing ':' or quote)") from None


def _host(name: str, variables: dict) -> Host:
    def var(key: str):
        return hostvars.value(variables, key, name)

    address = var("ansible_host") or name
    said = ssh_config.lookup(address)  # the inventory's login first, then ~/.ssh/config's, as with Ansible
    return Host(
        name=name,
        address=address,
        user=var("ansible_user") or said.get("user") or os.environ.get("USER", "root"),
        port=var("ansible_port") if "ansible_port" in variables else _ssh_port(name, said),
        key=var("ansible_ssh_private_key_file"),
        known_hosts=var("tandem_known_hosts_file"),
        gpus=var("gpus"),
        nic=var("cluster_nic"),
        data_device=var("data_device"),
        vars=dict(variables),
        cluster_address=var("cluster_address") or "",
    )


def _ssh_port(name: str, said: dict) -> int:
    """The Port ~/.ssh/config gives the host (22 when none)."""
    try:
        return int(said.get("port", 22))
    except ValueError:
        raise ClusterError(f"{name}: ~/.ssh/config gives it Port {said['port']!r}, not a number: fix it there, "
                           "or set ansible_port in the inventory") from None


def select(hosts: list[Host], names: list[str] | None) -> list[Host]:
    """The named hosts, in the order asked; all of them when no names are given."""
    if not names:
        return hosts
    by_name = {h.name: h for h in hosts}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise ClusterError(
            f"unknown host {', '.join(unknown)}: the inventory has {', '.join(by_name)}"
        )
    return [by_name[n] for n in names]


CONNECT_S = 10.0  # connect(): TCP connect, banner, authentication
DEAD_LINK_S = 30  # sent bytes unacknowledged this long, or an idle link unanswered: the host is gone

# paramiko's transport thread logs the traceback of a failed handshake (a host that accepts TCP and
# says nothing: "Error reading SSH protocol banner") before the exception reaches tandem, which says
# it in one line naming the host; logging's last resort would print it on stderr, above that line.
logging.getLogger("paramiko.transport").setLevel(logging.CRITICAL)


class HostConnection(Connection):
    """A Fabric connection whose TCP socket notices a vanished network. Without it a request
    sent just before a host's network went down waits for its answer forever (paramiko has no
    deadline on exec's reply, and TCP retransmits for ~15 minutes); with it the kernel drops the
    connection after DEAD_LINK_S, paramiko's transport ends, and every wait on it returns."""

    def open(self):
        try:
            opened = super().open()
        except UNREACHABLE as err:  # which host it was, for the line that says it (train.cli.executor.cluster_task)
            err.tandem_host = getattr(self, "tandem_host", None)
            raise
        sock = self.client.get_transport().sock
        if isinstance(sock, socket.socket):
            dead_link_options(sock)
        return opened


def dead_link_options(sock: socket.socket) -> None:
    """Keepalive probes after 10 s idle, every 5 s, 4 unanswered: an idle link that vanished is
    dropped after ~30 s. Linux also bounds unacknowledged sent data (TCP_USER_TIMEOUT); macOS has
    no such option, and names the idle time TCP_KEEPALIVE, not TCP_KEEPIDLE."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    idle = getattr(socket, "TCP_KEEPIDLE", None) or getattr(socket, "TCP_KEEPALIVE", None)
    for option, value in ((idle, 10), (getattr(socket, "TCP_KEEPINTVL", None), 5),
                          (getattr(socket, "TCP_KEEPCNT", None), 4),
                          (getattr(socket, "TCP_USER_TIMEOUT", None), DEAD_LINK_S * 1000)):
        if option is not None:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)


def connect(host: Host, timeout: float | None = None) -> Connection:
    """A Fabric connection with host key checking on, against the inventory's known_hosts; connecting
    (TCP, SSH's banner, authentication) gives up after `timeout` seconds each (default CONNECT_S)."""
    timeout = timeout or CONNECT_S
    # the banner's wait ends first: paramiko's negotiation gives up at `timeout` without a word (the next
    # step then says "No existing session"), where a banner that never came says what happened
    connect_kwargs = {"banner_timeout": timeout * 0.8, "auth_timeout": timeout}
    if host.key:
        connect_kwargs["key_filename"] = os.path.expanduser(host.key)
    # ~/.ssh/config as ssh reads it (train.ssh_config): the alias's HostName, its IdentityFile after the
    # inventory's key, its ProxyJump; user and port are the host's, already resolved with it
    conn = HostConnection(host.address, user=host.user, port=host.port, config=ssh_config.settings(),
                          connect_kwargs=connect_kwargs, connect_timeout=timeout)
    known = os.path.expanduser(host.known_hosts or "~/.ssh/known_hosts")
    check_host_keys(conn, [known])
    hop = conn.gateway
    while isinstance(hop, Connection):  # a ProxyJump's hosts are checked too (Fabric would accept any key)
        check_host_keys(hop, [known, os.path.expanduser("~/.ssh/known_hosts")])
        hop.connect_timeout = timeout  # a bastion that does not answer fails as the host would
        hop = hop.gateway
    conn.tandem_host = host  # the inventory name, for messages
    return conn


def check_host_keys(conn: Connection, files: list[str]) -> None:
    """Refuse a host key that none of `files` (known_hosts) holds."""
    conn.client.set_missing_host_key_policy(paramiko.RejectPolicy())
    for known in dict.fromkeys(files):
        if os.path.exists(known):
            conn.client.load_host_keys(known)


TRANSFER_STALL_S = 60  # a copy that moves no byte for this long has lost its host


def get_whole(conn: Connection, remote: str, local: str, stall_s: float = TRANSFER_STALL_S) -> None:
    """Copy `remote` to `local` under a temporary name, renamed once complete: a reader (a resume,
    a restart on the hosts left) never finds half a file. A host whose network vanishes mid-copy
    fails the copy within `stall_s` instead of holding it (and whoever waits on it) forever."""
    conn.open()
    conn.transport.set_keepalive(10)
    conn.sftp().get_channel().settimeout(stall_s)
    partial = f"{local}.partial"
    try:
        conn.get(remote, partial)
        os.replace(partial, local)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(partial)


def group(hosts: list[Host]) -> ThreadingGroup:
    """All hosts at once: commands run in parallel, failures come back per host."""
    return ThreadingGroup.from_connections([connect(h) for h in hosts])


class Deadline:
    """Closes the SSH transports of `connections` still open `seconds` after entering.

    invoke's `timeout` starts once the command runs; before that paramiko waits up to an hour
    for a channel to open and, for the reply to exec, forever. A host whose network vanishes
    between the handshake and that reply would hold the caller (`fab train` following a run
    that just lost that host) for good. Closing the transport ends every such wait at once."""

    def __init__(self, connections: list[Connection], seconds: float):
        self.connections, self.seconds, self.cut = list(connections), seconds, set()
        self._timer = threading.Timer(seconds, self._cut)
        self._timer.daemon = True

    def _cut(self) -> None:
        for conn in self.connections:
            transport = conn.client.get_transport()
            if transport is not None and transport.is_active():
                self.cut.add(id(conn))
                transport.close()

    def explain(self, conn: Connection, result: object) -> object:
        """A host's failure caused by the cut, said as what it is."""
        if id(conn) in self.cut and isinstance(result, Exception):
            return TimeoutError(f"no answer within {self.seconds:g} s; its connection was closed "
                                f"({type(result).__name__})")
        return result

    def __enter__(self) -> Deadline:
        self._timer.start()
        return self

    def __exit__(self, *exc) -> None:
        self._timer.cancel()


# What losing a host looks like to SSH: no route, refused, timed out (Deadline), transport gone.
UNREACHABLE = (OSError, EOFError, paramiko.SSHException)


@dataclass(frozen=True)
class HostResult:
    """One host's outcome, as callers need it (Fabric's Result, or the exception in its place):
    did it work, what it printed or returned, and when not, why."""

    host: str
    stdout: str = ""
    stderr: str = ""
    exited: int | None = None  # None: no exit status (unreachable, cut off)
    error: Exception | None = None  # the host was not reached, or the work raised
    value: object = None  # on_each: what the work returned

    @property
    def ok(self) -> bool:
        return self.error is None and self.exited == 0

    @property
    def reachable(self) -> bool:
        """False when SSH could not reach the host, or lost it (not when the work itself raised)."""
        return not isinstance(self.error, UNREACHABLE)

    @property
    def why(self) -> str:
        """The cause in a few words: `unreachable (...)`, else the command's own last words."""
        if not self.reachable:
            return f"unreachable ({self.error})"
        if self.error is not None:
            return f"{type(self.error).__name__}: {self.error}"
        return (self.stderr.strip() or self.stdout.strip())[-300:] or f"failed (exit {self.exited})"

    @classmethod
    def of(cls, host: str, outcome: object) -> HostResult:
        if isinstance(outcome, UnexpectedExit):  # a c.run without warn=True: its result, not a crash
            outcome = outcome.result
        if isinstance(outcome, Exception):
            return cls(host, error=outcome)
        if isinstance(outcome, Result):
            return cls(host, stdout=outcome.stdout or "", stderr=outcome.stderr or "", exited=outcome.exited,
                       value=outcome)
        return cls(host, exited=0, value=outcome)


class GroupResult(dict[str, HostResult]):
    """{host name: HostResult}, in the order the hosts were given, with the outcome read once."""

    @property
    def failed(self) -> dict[str, HostResult]:
        return {name: r for name, r in self.items() if not r.ok}

    @property
    def succeeded(self) -> dict[str, HostResult]:
        return {name: r for name, r in self.items() if r.ok}

    @property
    def unreachable(self) -> dict[str, HostResult]:
        return {name: r for name, r in self.items() if not r.reachable}

    def problems(self) -> list[str]:
        """`host: why` for each host that failed."""
        return [f"{name}: {r.why}" for name, r in self.failed.items()]


def require_reachable(lost: dict[str, str]) -> None:
    """A view that could not reach every host fails, naming them and the fix, in one line: {host: why}."""
    if lost:
        raise ClusterError("unreachable: " + "; ".join(f"{name} ({why})" for name, why in lost.items())
                           + ": check that each VM runs and lets SSH in from this machine (`fab init --check` "
                           "says why not, host by host)")


def run_all(hosts: list[Host], command: str, **kwargs) -> GroupResult:
    """Run one command on every host in parallel. Unreachable hosts and failing commands are
    results, not a crash, so callers can name the host and the cause. With `timeout`, the whole
    call (connecting included) ends within timeout + CONNECT_S + 5 s, whatever the network does."""
    kwargs.setdefault("hide", True)
    kwargs.setdefault("warn", True)
    kwargs.setdefault("in_stream", False)  # never wait on our stdin
    limit = kwargs["timeout"] + CONNECT_S + 5 if kwargs.get("timeout") else None
    with group(hosts) as connections:  # closed afterwards: `fab train` polls every 2 s while following
        deadline = Deadline(list(connections), limit) if limit else None
        with deadline or contextlib.nullcontext():
            try:
                results = connections.run(command, **kwargs)
            except GroupException as err:
                results = err.result
    by_name = {conn.tandem_host.name: deadline.explain(conn, result) if deadline else result
               for conn, result in results.items()}
    return GroupResult((h.name, HostResult.of(h.name, by_name[h.name])) for h in hosts)


def run_each(hosts: list[Host], commands: dict[str, str], **kwargs) -> GroupResult:
    """A command per host (each host may name its NIC or paths differently), all at once."""
    if len(set(commands.values())) == 1:
        return run_all(hosts, next(iter(commands.values())), **kwargs)
    kwargs = {"hide": True, "warn": True, "in_stream": False, **kwargs}
    return on_each(hosts, lambda h, c: c.run(commands[h.name], **kwargs))


def on_each(hosts: list[Host], work) -> GroupResult:
    """work(host, connection) on every host at once; what it returns (a Fabric Result, or any
    value), or the exception it raised, per host."""

    def one(host: Host):
        try:
            with connect(host) as conn:
                return work(host, conn)
        except Exception as err:  # reported per host by the caller
            return err

    if not hosts:
        return GroupResult()
    with ThreadPoolExecutor(max_workers=len(hosts)) as pool:
        outcomes = list(pool.map(one, hosts))
    return GroupResult((h.name, HostResult.of(h.name, o)) for h, o in zip(hosts, outcomes, strict=True))
