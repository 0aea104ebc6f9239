"""A small SFTP server on loopback for the tests (paramiko's server side): one directory served, any
client key let in, its own host key. Enough for tandem's target: stat, list, open, mkdir, remove, rename."""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

import paramiko


class LetIn(paramiko.ServerInterface):
    def get_allowed_auths(self, username):
        return "publickey"

    def check_auth_publickey(self, username, key):
        return paramiko.AUTH_SUCCESSFUL

    def check_channel_request(self, kind, chanid):
        return paramiko.OPEN_SUCCEEDED if kind == "session" else paramiko.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED


class Handle(paramiko.SFTPHandle):
    def stat(self):
        return paramiko.SFTPAttributes.from_stat(os.fstat((self.readfile or self.writefile).fileno()))


def served(root: Path):
    class Folder(paramiko.SFTPServerInterface):
        def _real(self, path: str) -> Path:
            return root / self.canonicalize(path).lstrip("/")

        def _do(self, fn):
            try:
                return fn()
            except OSError as err:
                return paramiko.SFTPServer.convert_errno(err.errno)

        def stat(self, path):
            return self._do(lambda: paramiko.SFTPAttributes.from_stat(os.stat(self._real(path))))

        lstat = stat

        def list_folder(self, path):
            def ls():
                out = []
                for p in self._real(path).iterdir():
                    attr = paramiko.SFTPAttributes.from_stat(os.stat(p))
                    attr.filename = p.name
                    out.append(attr)
                return out
            return self._do(ls)

        def open(self, path, flags, attr):
            def opened():
                fd = os.open(self._real(path), flags, 0o644)
                mode = "rb" if flags & (os.O_WRONLY | os.O_RDWR) == 0 else "wb" if flags & os.O_WRONLY else "r+b"
                handle = Handle(flags)
                f = os.fdopen(fd, mode)
                handle.readfile, handle.writefile = (f, None) if mode == "rb" else (f, f)
                return handle
            return self._do(opened)

        def remove(self, path):
            return self._do(lambda: os.remove(self._real(path)) or paramiko.SFTP_OK)

        def rename(self, old, new):
            return self._do(lambda: os.rename(self._real(old), self._real(new)) or paramiko.SFTP_OK)

        def mkdir(self, path, attr):
            return self._do(lambda: os.mkdir(self._real(path)) or paramiko.SFTP_OK)

        def rmdir(self, path):
            return self._do(lambda: os.rmdir(self._real(path)) or paramiko.SFTP_OK)

    return Folder


class Server:
    """`with Server(root) as s`: s.port, s.key (its host key); each connection served on a thread."""

    def __init__(self, root: Path):
        self.root, self.key = root, paramiko.RSAKey.generate(2048)
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.transports: list[paramiko.Transport] = []

    def __enter__(self):
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            t = paramiko.Transport(conn)
            t.add_server_key(self.key)
            t.set_subsystem_handler("sftp", paramiko.SFTPServer, served(self.root))
            self.transports.append(t)
            try:
                t.start_server(server=LetIn())
            except (paramiko.SSHException, EOFError, OSError):
                continue

    def __exit__(self, *exc):
        self.sock.close()
        for t in self.transports:
            t.close()
