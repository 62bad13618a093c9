"""Development certificates: a CA of its own, a server certificate it signs, and client
certificates for tests, written as PEM files with the ``cryptography`` package.

``ensure_dev_certs(directory)`` is what ``headwater dev up`` calls on every start: the first
start makes the CA and the server certificate (for ``localhost`` and ``127.0.0.1``, plus any
names asked for), later starts find them and reuse them, so a client given the CA once keeps
trusting the cluster.  Keys are EC P-256 and written with mode 0600.  These are for a
developer's machine and for tests: production brings its own certificates (``--certfile``,
``--keyfile``, ``--cafile``).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID_DAYS = 825
"""The longest validity Apple's and browsers' TLS clients accept for a server certificate."""

DEV_HOSTS = ("localhost", "127.0.0.1")

CA_USAGE = x509.KeyUsage(
    digital_signature=True,
    key_cert_sign=True,
    crl_sign=True,
    content_commitment=False,
    key_encipherment=False,
    data_encipherment=False,
    key_agreement=False,
    encipher_only=False,
    decipher_only=False,
)


@dataclass(frozen=True, slots=True)
class Pair:
    """A certificate and its private key, as PEM files."""

    cert: Path
    key: Path


@dataclass(frozen=True, slots=True)
class DevCerts:
    ca: Pair
    server: Pair

    @property
    def cafile(self) -> Path:
        """What clients are given (``mosquitto_sub --cafile``)."""
        return self.ca.cert


def ensure_dev_certs(directory: Path, hosts: tuple[str, ...] = DEV_HOSTS) -> DevCerts:
    """The CA and server certificate in ``directory``, made on first call and reused after."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = Pair(directory / "ca.crt", directory / "ca.key")
    server = Pair(directory / "server.crt", directory / "server.key")
    if not (ca.cert.exists() and ca.key.exists()):
        make_ca(ca)
    if not (server.cert.exists() and server.key.exists()):
        issue(ca, server, "headwater", hosts=hosts)
    return DevCerts(ca, server)


def make_ca(pair: Pair, name: str = "Headwater development CA") -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    cert = (
        _builder(subject, subject, key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(CA_USAGE, critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .sign(key, hashes.SHA256())
    )
    _write(pair, cert, key)


def issue(ca: Pair, pair: Pair, common_name: str, hosts: tuple[str, ...] = ()) -> None:
    """A certificate signed by ``ca``: a server's for ``hosts`` (DNS names or IP addresses),
    or, without hosts, a client's whose CN is ``common_name``."""
    ca_cert = x509.load_pem_x509_certificate(ca.cert.read_bytes())
    ca_key = serialization.load_pem_private_key(ca.key.read_bytes(), None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    usage = ExtendedKeyUsageOID.SERVER_AUTH if hosts else ExtendedKeyUsageOID.CLIENT_AUTH
    builder = (
        _builder(subject, ca_cert.subject, key.public_key())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
    )
    if hosts:
        names = [_general_name(host) for host in hosts]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    _write(pair, builder.sign(ca_key, hashes.SHA256()), key)


def _builder(
    subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))  # a client's clock a little behind
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
    )


def _general_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _write(pair: Pair, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> None:
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    descriptor = os.open(pair.key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as out:
        out.write(key_pem)
    pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
