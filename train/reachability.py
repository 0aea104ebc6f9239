"""One reachability verdict per host, taken before a task's own work: a host SSH cannot reach is said
as unreachable (its name, address, port, the OS error and the fix), never as what the task would have
found missing there (a file, a driver, a NIC, root, a run).

    v100b: nothing answers SSH at ubuntu@203.0.113.11 port 22 ([Errno 111] Connection refused): check the
    VM is running, the address (ansible_host), and that its firewall / security group lets SSH in ...

`explain` says one SSH failure with its fix (`fab init`'s table says the same); `require_answering` asks
every host once (`true`, all at once through train.cluster.run_all) and raises ClusterError naming each
host that did not answer; `unreachable` reads the same from results a task already has.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping, Sequence

import paramiko

from .cluster import ClusterError, Host, HostResult, run_all

CLOUD_USERS = "ubuntu on Ubuntu images, debian on Debian, ec2-user on Amazon Linux"
ANSWER_S = 10  # `true` needs no time of its own: the wait is SSH's (connect, banner, authentication)


def explain(host: Host, error: BaseException) -> str:
    """Why fab cannot log in to `host`, and what to do: one line that starts with its name."""
    login = f"{host.user}@{host.address}" + (f" (port {host.port})" if host.port != 22 else "")
    reached = f"{host.user}@{host.address} port {host.port}"  # where nothing answered: the port always said
    known = host.known_hosts or "~/.ssh/known_hosts"
    port = f"-p {host.port} " if host.port != 22 else ""
    if isinstance(error, paramiko.BadHostKeyException):
        return (f"{host.name}: {login} shows another host key than {known} holds (a new VM at that address?): "
                f"if that is expected, `ssh-keygen -R {host.address} -f {known}`, then add its new key: "
                f"`ssh-keyscan {port}{host.address} >> {known}`")
    if isinstance(error, paramiko.SSHException) and "not found in known_hosts" in str(error):
        return (f"{host.name}: its SSH host key is not in {known} (fab checks it): compare "
                f"`ssh-keyscan {port}{host.address}` with the fingerprint in the provider's console, then "
                f"`ssh-keyscan {port}{host.address} >> {known}`")
    if isinstance(error, paramiko.SSHException) and "protocol banner" in str(error):
        return (f"{host.name}: something answers at {reached} but not as SSH ({error}): check the address and port "
                "(ansible_host, ansible_port), and that no firewall cuts the connection; a VM still booting says "
                "nothing until its sshd is up: retry in a minute")
    if isinstance(error, paramiko.PasswordRequiredException):
        return (f"{host.name}: the key {host.key} has a passphrase: load it into the agent (`ssh-add {host.key}`); "
                "fab and Ansible use the agent")
    if isinstance(error, paramiko.AuthenticationException):
        key = f"the key {host.key}" if host.key else "your SSH keys (no ansible_ssh_private_key_file given)"
        return (f"{host.name}: {login} refused {key}: check the login user ({CLOUD_USERS}) and that the key is "
                "the one the VM was created with (ansible_ssh_private_key_file, fab init --key)")
    if isinstance(error, FileNotFoundError):
        return (f"{host.name}: the key file {host.key} does not exist: fix ansible_ssh_private_key_file "
                "(fab init --key)")
    if isinstance(error, socket.gaierror):
        return f"{host.name}: {host.address} does not resolve ({error}): fix ansible_host"
    if isinstance(error, (TimeoutError, paramiko.ssh_exception.NoValidConnectionsError, ConnectionError)):
        return (f"{host.name}: nothing answers SSH at {reached} ({error}): check the VM is running, the address "
                "(ansible_host), and that its firewall / security group lets SSH in from this machine")
    return f"{host.name}: SSH to {reached} failed ({type(error).__name__}: {error}): try `ssh {port}{login}` by hand"


def unreachable(hosts: Sequence[Host], results: Mapping[str, HostResult]) -> ClusterError | None:
    """The error naming every host of `results` SSH could not reach (None: each answered), to raise
    before anything reads what a host said: its silence is no missing file."""
    lines = [explain(h, results[h.name].error) for h in hosts
             if h.name in results and not results[h.name].reachable]  # type: ignore[arg-type]
    if not lines:
        return None
    return ClusterError("unreachable, nothing done there:\n  " + "\n  ".join(lines))


def require_answered(hosts: Sequence[Host], results: Mapping[str, HostResult]) -> None:
    """Raise `unreachable`'s error when a host of `results` could not be reached."""
    if error := unreachable(hosts, results):
        raise error


def require_answering(hosts: Sequence[Host]) -> None:
    """Ask every host once, all at once; raise naming each one that does not answer (module docstring)."""
    if hosts:
        require_answered(hosts, run_all(list(hosts), "true", timeout=ANSWER_S))
