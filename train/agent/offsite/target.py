"""Where a run's checkpoint copies go off the cluster (`fab train --checkpoints-to URL`), parsed once.

    s3://BUCKET/PREFIX                 AWS S3, or an S3-compatible store (endpoint_url in ~/.aws/config)
    gs://BUCKET/PREFIX                 Google Cloud Storage (the VM's service account, gcloud ADC)
    /mnt/share/runs, file:///mnt/...   a directory on every host (an NFS mount)
    sftp://[user@]host[:port]/path     a machine reached over SSH with the hosts' own keys

Credentials come from the host alone (instance role, environment, ~/.aws, gcloud's ADC, ~/.ssh): a URL
goes into the run's spec and logs, so one holding a secret (a password, a query string with a key) is
refused. Pure: nothing here imports fsspec (the controller has none); `Target.filesystem` does, on a host.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import urlsplit


class BadTarget(ValueError):
    """A URL tandem will not write checkpoints to, and why."""


# Per kind of store: fsspec's protocol, and what to do when a host cannot write there (HOST: the host).
PROTOCOLS = {"s3": "s3", "gs": "gcs", "file": "file", "sftp": "sftp"}
FIXES = {
    "s3": "give the VM's role (instance profile) s3:PutObject, s3:GetObject, s3:DeleteObject and s3:ListBucket on "
          "{where}, or set credentials in ~/.aws on {host} (endpoint_url in ~/.aws/config for an S3-compatible store)",
    "gs": "give the VM's service account roles/storage.objectAdmin on {where}, or run `gcloud auth "
          "application-default login` as the training user on {host}",
    "file": "mount the share on {host} (the same path on every host) and let the training user write {where}",
    "sftp": "let {host}'s training user in with its SSH key (ssh-copy-id; the server's key in its known_hosts) "
            "and write {where}",
}
MISSING = {"s3": "create the bucket (`aws s3 mb s3://BUCKET`) or correct its name",
           "gs": "create the bucket (`gcloud storage buckets create gs://BUCKET`) or correct its name",
           "file": "create the directory on the share", "sftp": "create the directory on that machine"}
UNREACHABLE = ("make {where}'s endpoint reachable from {host} (its address or endpoint_url in ~/.aws/config, DNS, "
               "the VM's egress rules)")
UNREACHABLE_ERRORS = ("ConnectionError", "ConnectTimeout", "ConnectTimeoutError", "ReadTimeoutError",
                      "ClientConnectorError", "ServerTimeoutError", "TimeoutError", "ConnectionRefusedError",
                      "NoValidConnectionsError", "gaierror", "socket.timeout")
SAFE_PATH = re.compile(r"[A-Za-z0-9._/~+=@:-]*")  # no spaces, quotes, commas: it travels in shell lines and specs


@dataclass(frozen=True)
class Target:
    """A parsed URL: `url` as said (never a secret), fsspec's `protocol`, the `root` path in that store,
    and what opening it needs besides the host's credentials (`options`: sftp's host, port, user)."""

    url: str
    scheme: str
    root: str
    options: dict = field(default_factory=dict)

    @property
    def protocol(self) -> str:
        return PROTOCOLS[self.scheme]

    def path(self, *parts: str) -> str:
        """A path inside the store, under the root."""
        return "/".join([self.root.rstrip("/"), *(p.strip("/") for p in parts if p)])

    def url_of(self, *parts: str) -> str:
        """The URL of a path under the root, as a user would type it."""
        return "/".join([self.url.rstrip("/"), *(p.strip("/") for p in parts if p)])

    def fix(self, host: str, err: BaseException | None = None) -> str:
        """What to do when `host` could not use the target, by what went wrong (`err`)."""
        names = {type(e).__name__ for e in _causes(err)}
        if any(n.endswith(UNREACHABLE_ERRORS) for n in names):
            return UNREACHABLE.format(where=self.url, host=host)
        if "FileNotFoundError" in names or "NoSuchBucket" in names:
            return MISSING[self.scheme]
        return FIXES[self.scheme].format(where=self.url, host=host)

    def filesystem(self):
        """fsspec's filesystem for it (imported here: the hosts' environment has fsspec, s3fs, gcsfs)."""
        import fsspec

        if self.scheme == "file":
            return fsspec.filesystem("file", auto_mkdir=True)
        if self.scheme == "s3":  # endpoint, region, keys: botocore's chain on the host (env, ~/.aws, role)
            return fsspec.filesystem("s3", default_block_size=16 << 20, skip_instance_cache=True)
        if self.scheme == "gs":
            return fsspec.filesystem("gcs", skip_instance_cache=True)
        return fsspec.filesystem("sftp", skip_instance_cache=True, **self.options)


def _causes(err: BaseException | None) -> list[BaseException]:
    out = []
    while err is not None and err not in out:
        out.append(err)
        err = err.__cause__ or err.__context__
    return out


def parse(url: str) -> Target:
    """The target a URL names; BadTarget saying why not (a secret in it, a relative path, another scheme)."""
    text = str(url).strip()
    if not text:
        raise BadTarget("expected a URL: s3://BUCKET/PREFIX, gs://BUCKET/PREFIX, /a/directory or "
                        "sftp://[user@]host[:port]/path")
    if text.startswith("/"):
        text = "file://" + text
    parts = urlsplit(text)
    scheme = parts.scheme.lower()
    if scheme not in PROTOCOLS:
        raise BadTarget(f"{url!r}: not a URL tandem writes to (s3://, gs://, file:// or a path from /, sftp://)")
    if parts.password is not None or parts.query or parts.fragment:
        raise BadTarget(f"{redacted(text)}: holds a password or a query string; a URL goes into the run's spec "
                        "and logs, so credentials come from each host instead (~/.aws, the VM's role, gcloud ADC, "
                        "SSH keys)")
    if not SAFE_PATH.fullmatch(parts.path) or not SAFE_PATH.fullmatch(parts.netloc):
        raise BadTarget(f"{url!r}: only letters, digits and . _ / ~ + = @ : - in a target")
    if scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
            raise BadTarget(f"{url!r}: a directory by its absolute path (the same on every host), e.g. /mnt/share/runs")
        return Target(url=parts.path.rstrip("/") or "/", scheme="file", root=parts.path.rstrip("/") or "/")
    if scheme == "sftp":
        if not parts.hostname or not parts.path.startswith("/") or parts.path == "/":
            raise BadTarget(f"{url!r}: expected sftp://[user@]host[:port]/path (a directory on that machine)")
        try:
            port = parts.port or 22
        except ValueError:
            raise BadTarget(f"{url!r}: the port is not a number") from None
        options = {"host": parts.hostname, "port": port, **({"username": parts.username} if parts.username else {})}
        return Target(url=text.rstrip("/"), scheme="sftp", root=parts.path.rstrip("/"), options=options)
    if parts.username is not None or not parts.hostname or parts.port is not None:
        raise BadTarget(f"{url!r}: expected {scheme}://BUCKET/PREFIX (a bucket name, then the prefix)")
    prefix = parts.path.strip("/")
    return Target(url=f"{scheme}://{parts.netloc}" + (f"/{prefix}" if prefix else ""), scheme=scheme,
                  root=f"{parts.netloc}/{prefix}".rstrip("/"))


def redacted(url: str) -> str:
    """The URL with its password and query replaced by `***`: what an error may say of a refused one."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if parts.password is not None:
        netloc = netloc.replace(f":{parts.password}@", ":***@")
    return parts._replace(netloc=netloc, query="***" if parts.query else "",
                          fragment="***" if parts.fragment else "").geturl()
