"""The run's own certificate authority, made on the controller: every host of the run gets a certificate
of it (its cluster address and name), which its keeper's heartbeat, its copies and its etcd member
present and ask of every peer (mutual TLS). A stranger on the cluster network, or one of another run,
can neither read a keeper's state or checkpoint nor write to etcd.

The CA's key stays on this controller, in reports/RUN/tls/ (0600 in a 0700 folder): a later start of
the run from here signs its new hosts with it (a host that misses a start still talks to the others).
A start from another checkout, which lacks it, makes a new CA and gives every host it starts a
certificate of that one.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ..recipe import record

VALID = datetime.timedelta(days=3 * 365)  # a run's life and then some: certificates never end a run
FILES = ("ca.crt", "host.crt", "host.key")  # what each host gets, in RUN/keeper/tls/


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _name(text: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, text)])


def folder(run_id: str) -> Path:
    return record.REPORTS / run_id / "tls"


def run_ca(run_id: str, where: Path | None = None) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """The run's CA: the one this controller made for it before, else a new one (kept 0600)."""
    home = where or folder(run_id)
    key_file, cert_file = home / "ca.key", home / "ca.crt"
    if key_file.exists() and cert_file.exists():
        key = serialization.load_pem_private_key(key_file.read_bytes(), password=None)
        return key, x509.load_pem_x509_certificate(cert_file.read_bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    subject = _name(f"tandem run {run_id}")
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + VALID)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(home, 0o700)
    fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(_pem_key(key))
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return key, cert


def _alt_names(name: str, address: str) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = [x509.DNSName(name)]
    for text in {address, name}:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(text)))
        except ValueError:
            if text != name:
                names.append(x509.DNSName(text))
    return names


def host_files(ca: tuple[ec.EllipticCurvePrivateKey, x509.Certificate], name: str, address: str) -> dict[str, bytes]:
    """The files host `name` (at `address` on the cluster network) gets: the CA's certificate, its own
    certificate (server and client: it answers its peers and asks them) and its key."""
    ca_key, ca_cert = ca
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(_name(name)).issuer_name(ca_cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + VALID)
            .add_extension(x509.SubjectAlternativeName(_alt_names(name, address)), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    return {"ca.crt": ca_cert.public_bytes(pem), "host.crt": cert.public_bytes(pem), "host.key": _pem_key(key)}
