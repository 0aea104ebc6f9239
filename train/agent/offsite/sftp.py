"""sftp:// targets with the server's host key checked against known_hosts, as ssh itself does.

fsspec's SFTPFileSystem never loads a known_hosts file and adds any key it meets (paramiko's
AutoAddPolicy): an impostor at the address would receive the checkpoints and serve them back to a resume.
Here the system's and the training user's known_hosts are loaded and an unknown or changed key refused.
"""

from __future__ import annotations

import os

import paramiko
from fsspec.implementations.sftp import SFTPFileSystem

SYSTEM_KNOWN_HOSTS = "/etc/ssh/ssh_known_hosts"


class HostKeyRefused(PermissionError):
    """The sftp server's key is not the one known_hosts holds for it (or none is held)."""


def known_as(host: str, port: int) -> str:
    """The server's name in known_hosts: `host`, or `[host]:port` off port 22."""
    return host if port == 22 else f"[{host}]:{port}"


def keyscan(host: str, port: int) -> str:
    return f"ssh-keyscan {'' if port == 22 else f'-p {port} '}{host} >> ~/.ssh/known_hosts"


class KnownHostsSFTP(SFTPFileSystem):
    """SFTPFileSystem that refuses a server whose host key known_hosts does not hold (HostKeyRefused)."""

    def _connect(self):
        self.client = paramiko.SSHClient()
        if os.path.exists(SYSTEM_KNOWN_HOSTS):
            self.client.load_system_host_keys(SYSTEM_KNOWN_HOSTS)
        self.client.load_system_host_keys()  # ~/.ssh/known_hosts, the user's entries over the system's
        self.client.set_missing_host_key_policy(paramiko.RejectPolicy())
        port = int(self.ssh_kwargs.get("port") or 22)
        try:
            self.client.connect(self.host, **self.ssh_kwargs)
        except paramiko.BadHostKeyException:
            self.client.close()
            raise HostKeyRefused(
                f"{self.host}'s host key is not the one known_hosts holds for {known_as(self.host, port)}: another "
                f"machine answers at that address, or the server was reinstalled; once you know which, "
                f"`ssh-keygen -R '{known_as(self.host, port)}'` then `{keyscan(self.host, port)}` as the training "
                "user") from None
        except paramiko.SSHException as err:
            self.client.close()
            if "not found in known_hosts" not in str(err):
                raise
            raise HostKeyRefused(
                f"{self.host}'s host key is not in known_hosts ({known_as(self.host, port)}): check its "
                f"fingerprint, then `{keyscan(self.host, port)}` as the training user") from None
        self.ftp = self.client.open_sftp()
