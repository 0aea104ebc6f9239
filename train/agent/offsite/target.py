"""Where a run's checkpoint copies go off the cluster (`fab train --checkpoints-to URL`), parsed once.

    s3://BUCKET/PREFIX                 AWS S3, or an S3-compatible store (endpoint_url in ~/.aws/config)
    gs://BUCKET/PREFIX                 Google Cloud Storage (the VM's service account, gcloud ADC)
    /mnt/share/runs, file:///mnt/...   a directory on every host (an NFS mount)
    sftp://[user@]host[:port]/path     a machine reached over SSH with the hosts' own keys (its host key
                                       checked against their known_hosts: train.agent.offsite.sftp)

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
    "s3": "give the VM's role (instance profile) s3:PutObject, s3:GetObject, s3:DeleteObject, s3:ListBucket, "
          "s3:ListBucketMultipartUploads and s3:AbortMultipartUpload on {where}, or set credentials in ~/.aws on "
          "{host} (endpoint_url in ~/.aws/config for an S3-compatible store)",
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
        if "HostKeyRefused" in names:  # its message says the fix, naming the server
            return f"do that on {host} (nothing goes to a server whose key its known_hosts does not hold)"
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
        from train.agent.offsite.sftp import KnownHostsSFTP  # paramiko: on a host

        return KnownHostsSFTP(skip_instance_cache=True, **self.options)


def _causes(err: BaseException | None) -> list[BaseException]:
    out = []
    while err is not None and err not in out:
        out.append(err)
        err = err.__cause__ or err.__context__
    return out


def parse(url: str) -> Target:
    """The target a URL names; BadTarget saying why not (a secret in it, a relative path, another scheme),
    never repeating the secret."""
    text = str(url).strip()
    if not text:
        raise BadTarget("expected a URL: s3://BUCKET/PREFIX, gs://BUCKET/PREFIX, /a/directory or "
                        "sftp://[user@]host[:port]/path")
    if text.startswith("/"):
        text = "file://" + text
    shown = redacted(text)
    if shown != text:
        raise BadTarget(f"{shown}: holds a password, a query string or a port that is not a number; a URL goes into "
                        "the run's spec and logs, so credentials come from each host instead (~/.aws, the VM's role, "
                        "gcloud ADC, SSH keys)")
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as err:  # "Invalid IPv6 URL", a port out of range: said without the URL's text
        raise BadTarget(f"{shown}: not a URL ({err})") from None
    scheme = parts.scheme.lower()
    if scheme not in PROTOCOLS:
        raise BadTarget(f"{shown!r}: not a URL tandem writes to (s3://, gs://, file:// or a path from /, sftp://)")
    if not SAFE_PATH.fullmatch(parts.path) or not SAFE_PATH.fullmatch(parts.netloc):
        raise BadTarget(f"{shown!r}: only letters, digits and . _ / ~ + = @ : - in a target")
    if scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
            raise BadTarget(f"{shown!r}: a directory by its absolute path (the same on every host), "
                            "e.g. /mnt/share/runs")
        return Target(url=parts.path.rstrip("/") or "/", scheme="file", root=parts.path.rstrip("/") or "/")
    if scheme == "sftp":
        if not parts.hostname or not parts.path.startswith("/") or parts.path == "/":
            raise BadTarget(f"{shown!r}: expected sftp://[user@]host[:port]/path (a directory on that machine)")
        options = {"host": parts.hostname, "port": port or 22,
                   **({"username": parts.username} if parts.username else {})}
        return Target(url=text.rstrip("/"), scheme="sftp", root=parts.path.rstrip("/"), options=options)
    if parts.username is not None or not parts.hostname or port is not None:
        raise BadTarget(f"{shown!r}: expected {scheme}://BUCKET/PREFIX (a bucket name, then the prefix)")
    prefix = parts.path.strip("/")
    return Target(url=f"{scheme}://{parts.netloc}" + (f"/{prefix}" if prefix else ""), scheme=scheme,
                  root=f"{parts.netloc}/{prefix}".rstrip("/"))


NOT_A_PORT = re.compile(r"([^/@]*):(?!\d*(?:/|$))")  # host:wJalr...: a secret whose '/' or '@' went missing


def redacted(url: object) -> str:
    """The URL as anything may print it: a password (whatever it holds, '/' included: the last '@' ends it),
    a query string or fragment (X-Amz-Signature=..., a session token) and what follows a port that is not a
    number each replaced by `***`; a user name kept. The one function for every URL a host or the CLI says."""
    text = str(url).strip()
    scheme, sep, rest = text.partition("://")
    if not sep:
        scheme, rest = "", text
    cut = min([i for i in (rest.find("?"), rest.find("#")) if i >= 0], default=len(rest))
    rest, tail = rest[:cut], "?***" if cut < len(rest) else ""
    user, at, host = rest.rpartition("@")
    if at and ":" in user:
        name = user.split(":", 1)[0]
        rest = f"{name if '/' not in name else '***'}:***@{host}"
    elif sep and (odd := NOT_A_PORT.match(rest)):
        rest = f"{odd.group(1)}:***"
    return scheme + sep + rest + tail


URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"]+")


def scrubbed(text: object) -> str:
    """Free text (an exception's message, a host's answer) with every URL in it redacted."""
    return URL_IN_TEXT.sub(lambda m: redacted(m.group(0)), str(text))
