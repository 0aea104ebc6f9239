"""Mutual TLS between a run's hosts (the certificates: train.run.tls, sent with the spec into
RUN/keeper/tls/): the keepers' heartbeat and copies, and the run's etcd, answer only a peer that shows
a certificate of the run's CA, and ask only peers that do. A spec without `tls_dir` (a run started
before) speaks plain HTTP as it did."""

from __future__ import annotations

import functools
import ssl
from pathlib import Path


def folder(spec: dict) -> Path | None:
    where = spec.get("tls_dir")
    return Path(where) if where and (Path(where) / "host.key").exists() else None


def scheme(spec: dict) -> str:
    return "https" if folder(spec) else "http"


@functools.lru_cache(maxsize=4)
def _context(where: str, server: bool) -> ssl.SSLContext:
    tls = Path(where)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server else ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_verify_locations(cafile=str(tls / "ca.crt"))  # the run's CA only, not the system's
    context.load_cert_chain(str(tls / "host.crt"), str(tls / "host.key"))
    context.verify_mode = ssl.CERT_REQUIRED  # a server asks every client for its certificate too
    return context


def server_context(spec: dict) -> ssl.SSLContext | None:
    where = folder(spec)
    return _context(str(where), True) if where else None


def client_context(spec: dict) -> ssl.SSLContext | None:
    where = folder(spec)
    return _context(str(where), False) if where else None


def etcd_flags(spec: dict) -> list[str]:
    """etcd's flags for the run's TLS: clients and peers both show a certificate of the run's CA."""
    where = folder(spec)
    if where is None:
        return []
    ca, cert, key = (str(where / n) for n in ("ca.crt", "host.crt", "host.key"))
    return ["--cert-file", cert, "--key-file", key, "--trusted-ca-file", ca, "--client-cert-auth",
            "--peer-cert-file", cert, "--peer-key-file", key, "--peer-trusted-ca-file", ca, "--peer-client-cert-auth"]
