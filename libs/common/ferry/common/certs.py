"""A cluster's own certificate authority and the certificates it signs (``cryptography``).

``ferry up --tls`` and ``ferry keys init --tls`` make, in <secrets>/tls: ``ca.pem`` (+ its key,
kept for issuing more), ``server.pem``/``server.key`` (NATS, the API, the page servers of live
moves: every address of the cluster as a subject alternative name) and ``client.pem``/
``client.key`` (for mutual TLS). ECDSA P-256, valid for a year; operators with their own PKI bring
their files instead (FERRY_TLS_*, FERRY_NATS_CA, FERRY_PAGE_TLS_*).
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID_DAYS = 365


@dataclass(frozen=True)
class TlsFiles:
    """The files of one cluster's TLS, under ``folder``."""

    folder: Path

    @property
    def ca(self) -> Path:
        return self.folder / "ca.pem"

    @property
    def ca_key(self) -> Path:
        return self.folder / "ca.key"

    @property
    def cert(self) -> Path:
        return self.folder / "server.pem"

    @property
    def key(self) -> Path:
        return self.folder / "server.key"

    @property
    def client_cert(self) -> Path:
        return self.folder / "client.pem"

    @property
    def client_key(self) -> Path:
        return self.folder / "client.key"


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Ferry"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _sans(hosts: list[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def _issue(subject: str, key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate | None,
           ca_key: ec.EllipticCurvePrivateKey, *, hosts: list[str], ca: bool, usage: list[x509.ObjectIdentifier]
           ) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder().subject_name(_name(subject))
               .issuer_name(ca_cert.subject if ca_cert else _name(subject))
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=0 if ca else None), critical=True))
    if ca:
        builder = builder.add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                                      content_commitment=False, key_encipherment=False,
                                                      data_encipherment=False, key_agreement=False,
                                                      encipher_only=False, decipher_only=False), critical=True)
    else:
        builder = builder.add_extension(x509.ExtendedKeyUsage(usage), critical=False)
        if hosts:
            builder = builder.add_extension(x509.SubjectAlternativeName(_sans(hosts)), critical=False)
    return builder.sign(ca_key, hashes.SHA256())


def make_tls(folder: Path, hosts: list[str]) -> TlsFiles:
    """A CA and the server and client certificates it signs, into ``folder`` (kept if there)."""
    from ferry.store.keys import write_private  # a private file, atomically

    files = TlsFiles(folder)
    if files.ca.exists() and files.cert.exists() and files.client_cert.exists():
        return files
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = _issue("Ferry cluster CA", ca_key, None, ca_key, hosts=[], ca=True, usage=[])
    server_key, client_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    server = _issue(hosts[0] if hosts else "localhost", server_key, ca_cert, ca_key, hosts=hosts, ca=False,
                    usage=[ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH])
    client = _issue("ferry-client", client_key, ca_cert, ca_key, hosts=[], ca=False,
                    usage=[ExtendedKeyUsageOID.CLIENT_AUTH])
    pem = serialization.Encoding.PEM
    write_private(files.ca_key, _key_pem(ca_key).decode())
    write_private(files.key, _key_pem(server_key).decode())
    write_private(files.client_key, _key_pem(client_key).decode())
    write_private(files.cert, server.public_bytes(pem).decode())
    write_private(files.client_cert, client.public_bytes(pem).decode())
    write_private(files.ca, ca_cert.public_bytes(pem).decode())  # last: its presence says the set is whole
    return files
