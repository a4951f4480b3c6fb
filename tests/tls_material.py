"""Certificates for tests, made on the spot with ``cryptography`` (no key is ever committed):
the one place every test gets its CAs, server and client certificates from.

    ca = CertificateAuthority.create(tmp_path, "test-ca")
    leaf = ca.issue(tmp_path, "kbroker-log", dns_names=["localhost"], ip_addresses=["127.0.0.1"])
    leaf.cert, leaf.key, ca.cert  # PEM files
    client = ca.issue(tmp_path, "alice", unit="eng", organization="kbroker tests", country="US")
    # subject CN=alice,OU=eng,O=kbroker tests,C=US (RFC 2253 order), for mTLS principals

:func:`localhost_server` is a Kafka listener's certificate for 127.0.0.1 and localhost, and
:func:`client_certificate` a Kafka client's, both written beside the CA's certificate.

:func:`internal_tls_dir` fills a directory in the layout ``ClusterSpec.internal_tls`` reads: the
CA and one certificate per service kind, named for the kind (CN ``kbroker-<kind>``).
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from services.common.tls import SERVICE_KINDS, service_identity

_VALIDITY = datetime.timedelta(days=1)


@dataclass(frozen=True, slots=True)
class Leaf:
    """A certificate and its key, as PEM files."""

    cert: Path
    key: Path


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    path.chmod(0o600)


def _name(common_name: str, *, unit: str = "", organization: str = "",
          country: str = "") -> x509.Name:
    """The subject, most significant first: C, O, OU, CN (those given)."""
    attributes = [x509.NameAttribute(oid, value) for oid, value in (
        (NameOID.COUNTRY_NAME, country), (NameOID.ORGANIZATION_NAME, organization),
        (NameOID.ORGANIZATIONAL_UNIT_NAME, unit)) if value]
    return x509.Name([*attributes, x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


@dataclass(frozen=True, slots=True)
class CertificateAuthority:
    """A self-signed CA whose certificate is ``cert`` (PEM) and that issues leaves."""

    cert: Path
    key: Path
    _certificate: x509.Certificate
    _private_key: ec.EllipticCurvePrivateKey

    @classmethod
    def create(cls, directory: Path, common_name: str = "kbroker-test-ca",
               stem: str = "ca") -> CertificateAuthority:
        directory.mkdir(parents=True, exist_ok=True)
        key = _key()
        now = datetime.datetime.now(datetime.UTC)
        certificate = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name))
            .issuer_name(_name(common_name))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True,
                content_commitment=False, key_encipherment=False, data_encipherment=False,
                key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                           critical=False)
            .sign(key, hashes.SHA256())
        )
        cert_path, key_path = directory / f"{stem}.crt", directory / f"{stem}.key"
        cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
        _write_key(key, key_path)
        return cls(cert_path, key_path, certificate, key)

    def issue(self, directory: Path, common_name: str, *, dns_names: Iterable[str] = (),
              ip_addresses: Iterable[str] = (), stem: str | None = None,
              valid_for: datetime.timedelta = _VALIDITY, unit: str = "",
              organization: str = "", country: str = "") -> Leaf:
        """A leaf certificate for ``common_name`` with these SANs (none: CN only), usable by
        servers and clients, written to ``<stem>.crt`` and ``<stem>.key`` (stem: the CN).
        ``unit``, ``organization`` and ``country`` add OU, O and C to the subject."""
        directory.mkdir(parents=True, exist_ok=True)
        key = _key()
        now = datetime.datetime.now(datetime.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name, unit=unit, organization=organization,
                                 country=country))
            .issuer_name(self._certificate.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + valid_for)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                self._private_key.public_key()), critical=False)
        )
        sans: list[x509.GeneralName] = [x509.DNSName(name) for name in dns_names]
        sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        certificate = builder.sign(self._private_key, hashes.SHA256())
        stem = stem or common_name
        cert_path, key_path = directory / f"{stem}.crt", directory / f"{stem}.key"
        cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
        _write_key(key, key_path)
        return Leaf(cert_path, key_path)


def localhost_server(ca: CertificateAuthority, stem: str = "server", unit: str = "") -> Leaf:
    """A server certificate (CN and DNS name localhost, IP 127.0.0.1) for a listener."""
    return ca.issue(ca.cert.parent, "localhost", dns_names=["localhost"],
                    ip_addresses=["127.0.0.1"], stem=stem, unit=unit)


def client_certificate(ca: CertificateAuthority, common_name: str, unit: str = "") -> Leaf:
    """A Kafka client's certificate, subject ``CN=<name>[,OU=<unit>],O=kbroker tests,C=US``."""
    return ca.issue(ca.cert.parent, common_name, unit=unit, organization="kbroker tests",
                    country="US", stem=f"client-{common_name}")


def internal_tls_dir(directory: Path, ca: CertificateAuthority | None = None
                     ) -> CertificateAuthority:
    """Fill ``directory`` with ``ca.crt`` and, per service kind, ``<kind>.crt`` and
    ``<kind>.key`` (CN and DNS SAN ``kbroker-<kind>``): the layout of
    ``ClusterSpec.internal_tls``. Returns the CA."""
    ca = ca or CertificateAuthority.create(directory)
    for kind in SERVICE_KINDS:
        identity = service_identity(kind)
        ca.issue(directory, identity, dns_names=[identity], stem=kind)
    return ca
