"""Test certificates, made with ``cryptography`` into a folder (never committed): a CA, and
server and client certificates it signs, as PEM files."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass(frozen=True)
class Pem:
    cert: Path
    key: Path


def _name(common_name: str, unit: str = "") -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.COUNTRY_NAME, "US"),
                  x509.NameAttribute(NameOID.ORGANIZATION_NAME, "kbroker tests")]
    if unit:
        attributes.append(x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, unit))
    attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attributes)


class CertificateAuthority:
    """A CA writing its files under ``folder``."""

    def __init__(self, folder: Path, name: str = "ca") -> None:
        self.folder = folder
        self.name = name
        folder.mkdir(parents=True, exist_ok=True)
        self._key = ec.generate_private_key(ec.SECP256R1())
        self._subject = _name(f"kbroker test {name}")
        self._cert = self._build(self._subject, self._key.public_key(), ca=True)
        self.cert = folder / f"{name}.pem"
        self.cert.write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))

    def _build(self, subject: x509.Name, public_key: ec.EllipticCurvePublicKey, *, ca: bool,
               hosts: tuple[str, ...] = ()) -> x509.Certificate:
        now = datetime.datetime.now(datetime.UTC)
        builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(self._subject)
                   .public_key(public_key).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if hosts:
            names: list[x509.GeneralName] = []
            for host in hosts:
                try:
                    names.append(x509.IPAddress(ipaddress.ip_address(host)))
                except ValueError:
                    names.append(x509.DNSName(host))
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        return builder.sign(self._key, hashes.SHA256())

    def issue(self, common_name: str, unit: str = "", file_name: str | None = None,
              hosts: tuple[str, ...] = ("127.0.0.1", "localhost")) -> Pem:
        """A leaf certificate (server or client) with its key."""
        key = ec.generate_private_key(ec.SECP256R1())
        cert = self._build(_name(common_name, unit), key.public_key(), ca=False, hosts=hosts)
        stem = file_name or f"{self.name}-{common_name}"
        pem = Pem(self.folder / f"{stem}.pem", self.folder / f"{stem}.key")
        pem.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        pem.key.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                              serialization.PrivateFormat.PKCS8,
                                              serialization.NoEncryption()))
        return pem
