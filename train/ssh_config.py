"""~/.ssh/config for fab's connections, honoured as ssh (and so Ansible) honours it: a host's alias
(HostName), User, Port, IdentityFile and ProxyJump (or ProxyCommand).

Fabric reads the files (~/.ssh/config, then /etc/ssh/ssh_config: paramiko's SSHConfig, where the first
value obtained wins, as in ssh). The inventory wins where it says a thing, as it does for Ansible: what
is looked up is its ansible_host (else the host's name), and its ansible_user, ansible_port and
ansible_ssh_private_key_file come before the file's User, Port and IdentityFile (train.cluster).
"""

from __future__ import annotations

from fabric import Config
from paramiko.ssh_exception import ConfigParseError

from .errors import ClusterError


def settings() -> Config:
    """A Fabric Config holding the ssh configs as the files say now, for one Connection."""
    try:
        return Config(overrides={"load_ssh_configs": True})
    except ConfigParseError as err:
        raise ClusterError(f"~/.ssh/config or /etc/ssh/ssh_config has a line ssh's config reader (paramiko) cannot "
                           f"read ({err}): fix it there") from None


def lookup(address: str) -> dict:
    """What the ssh configs say for `address` (paramiko's lookup: `hostname` always; `user`, `port`,
    `identityfile`, `proxyjump`, ... where set)."""
    return settings().base_ssh_config.lookup(address)
