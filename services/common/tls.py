"""TLS between the services: gRPC with client certificates (mutual TLS) on every internal port.

Every service reads the same three settings, ``internal_tls_ca``, ``internal_tls_cert`` and
``internal_tls_key`` (PEM files; flags ``--internal-tls-*``, env ``KBROKER_INTERNAL_TLS_*``),
into one :class:`InternalTls`. With them set:

- its gRPC server (:func:`services.common.server.create_server`) accepts only TLS connections
  whose client presents a certificate signed by the CA (``require_client_auth``);
- every channel it opens to another service (:mod:`services.common.channels`) presents its own
  certificate and verifies the server's against the same CA.

Without them, gRPC is plaintext, which is allowed only on loopback: a server binding any other
address, or a channel to any other target, refuses with :class:`PlaintextNotAllowedError` (the
process stops at start-up with that message).

Identities and server names. A service's certificate names its kind in its common name:
``kbroker-frontend``, ``kbroker-handler``, ``kbroker-log``, ``kbroker-purgatory``,
``kbroker-replicator`` (:func:`service_identity`). Services are reached by pod IP (handlers and
log nodes found through discovery or the cluster metadata), by Kubernetes Service DNS names and
by 127.0.0.1, so the address a channel dials says nothing a certificate could be issued for
ahead of time. A channel therefore checks the server's certificate against the *kind* of peer
it means to reach, not its address: it overrides the TLS target name
(``grpc.ssl_target_name_override``) with that kind's identity. A certificate must match that
name: its CN is the identity and, if it carries DNS SANs at all (gRPC then checks SANs, not the
CN), one of them is the identity too. So one certificate per kind serves every replica of it,
whatever its address, and a service cannot pass for another kind (a handler's certificate does
not answer for a log node). On the server side any certificate from the CA may call; what a
caller may do by its identity (the handler trusting ``kafka-principal`` only from a
frontend) is read with :func:`peer_identity`.

Reloading. A server re-reads its certificate, key and CA when one of the files changes: the
credentials are dynamic (``grpc.dynamic_ssl_server_credentials``) and the check, a read of
the three files, runs at each new TLS handshake, never per call. Channels read the files when
they are created; a long-lived channel keeps presenting the certificate it started with when it
reconnects, so a rotated client certificate reaches existing channels only when the process
restarts (grpcio has no dynamic channel credentials): rotate before the old one expires.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import logging
import threading
import urllib.parse
from dataclasses import dataclass
from typing import Protocol

import grpc

log = logging.getLogger(__name__)

SERVICE_KINDS = ("frontend", "handler", "log", "purgatory", "replicator")


def service_identity(kind: str) -> str:
    """The certificate common name of a service kind: ``kbroker-<kind>``."""
    return f"kbroker-{kind}"


# Help of the three config fields every service declares (after its grpc_address).
CA_HELP = ("PEM file of the CA that signs every service's certificate (internal mutual TLS; "
           "empty: plaintext gRPC, loopback addresses only)")
CERT_HELP = "PEM file of this service's certificate, CN kbroker-<kind> (internal mutual TLS)"
KEY_HELP = "PEM file of the private key of internal_tls_cert"


class InternalTlsError(ValueError):
    """The internal TLS settings cannot be used: the service must not start."""


class PlaintextNotAllowedError(InternalTlsError):
    """Plaintext gRPC was asked for on an address that is not loopback."""


class TlsConfigured(Protocol):
    internal_tls_ca: str
    internal_tls_cert: str
    internal_tls_key: str


@dataclass(frozen=True, slots=True)
class InternalTls:
    """The TLS material of one process: paths of the CA, its certificate and its key (PEM).
    All three empty: plaintext (loopback only)."""

    ca: str = ""
    cert: str = ""
    key: str = ""

    def __post_init__(self) -> None:
        given = [bool(self.ca), bool(self.cert), bool(self.key)]
        if any(given) and not all(given):
            raise InternalTlsError(
                "internal TLS needs all of internal_tls_ca, internal_tls_cert and "
                "internal_tls_key (or none of them, for plaintext on loopback)")

    @classmethod
    def of(cls, config: TlsConfigured) -> InternalTls:
        """The settings of a service config (its ``internal_tls_*`` fields)."""
        return cls(config.internal_tls_ca, config.internal_tls_cert, config.internal_tls_key)

    @property
    def enabled(self) -> bool:
        return bool(self.ca)

    def describe(self) -> str:
        return "mTLS" if self.enabled else "plaintext"

    def _read(self) -> tuple[bytes, bytes, bytes]:
        """(CA, certificate, key) as bytes."""
        contents = []
        for what, path in (("CA", self.ca), ("certificate", self.cert), ("key", self.key)):
            try:
                with open(path, "rb") as f:
                    contents.append(f.read())
            except OSError as e:
                raise InternalTlsError(f"internal TLS {what} {path}: {e.strerror or e}") from e
        ca, cert, key = contents
        return ca, cert, key

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """Client credentials: this process's certificate, servers checked against the CA."""
        ca, cert, key = self._read()
        return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key,
                                            certificate_chain=cert)

    def server_credentials(self) -> grpc.ServerCredentials:
        """Server credentials requiring a client certificate signed by the CA, re-read when
        the files change (checked at each new handshake)."""
        source = _ReloadingCertificates(self)
        return grpc.dynamic_ssl_server_credentials(
            source.initial, source.fetch, require_client_authentication=True)

    def common_name(self) -> str | None:
        """The common name of this process's own certificate."""
        with open(self.cert, "rb") as f:
            return certificate_common_name(f.read())


PLAINTEXT = InternalTls()
"""No TLS material: plaintext gRPC, loopback only."""


class _ReloadingCertificates:
    """Certificate configurations for dynamic server credentials: a new one whenever the files'
    contents change and the new files load; the old one stays otherwise (a half-written
    rotation is retried at the next handshake). Contents, not modification times: a rotation
    within the file system's time granularity, to files of the same size, is still seen, and
    reading three small files at a TLS handshake (channels are long-lived) costs nothing."""

    def __init__(self, tls: InternalTls) -> None:
        self._tls = tls
        self._lock = threading.Lock()
        self._loaded = self._tls._read()
        self._rejected: tuple[bytes, bytes, bytes] | None = None
        self.initial = self._load(self._loaded)

    def _contents(self) -> tuple[bytes, bytes, bytes] | None:
        try:
            return self._tls._read()
        except InternalTlsError:
            return None

    def _load(self, contents: tuple[bytes, bytes, bytes]) -> grpc.ServerCertificateConfiguration:
        ca, cert, key = contents
        # gRPC parses the PEM only at the next handshake: a truncated file (a rotation caught
        # half-way) must be noticed here, while the old material can still be kept.
        for what, pem, end in (("CA", ca, b"-----END CERTIFICATE-----"),
                               ("certificate", cert, b"-----END CERTIFICATE-----"),
                               ("key", key, b"PRIVATE KEY-----")):
            if b"-----BEGIN " not in pem or end not in pem.rstrip()[-40:]:
                raise InternalTlsError(f"internal TLS {what} is not complete PEM")
        return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """Called by gRPC at each new TLS handshake (on one of its threads)."""
        with self._lock:
            contents = self._contents()
            if contents is None or contents in (self._loaded, self._rejected):
                return None
            try:
                configuration = self._load(contents)
            except InternalTlsError as e:
                self._rejected = contents
                log.warning("internal TLS files changed but do not load (keeping the old "
                            "ones): %s", e)
                return None
            self._loaded = contents
            log.info("internal TLS certificate reloaded from %s", self._tls.cert)
            return configuration


def peer_identity(context: grpc.aio.ServicerContext) -> str | None:
    """The common name of the certificate the calling service presented, or None when the call
    came without one (plaintext, or TLS without a client certificate)."""
    auth = context.auth_context()
    names = auth.get("x509_common_name") or []
    return names[0].decode("utf-8", "replace") if names else None


# --- addresses ------------------------------------------------------------------------------

_SCHEMES = ("dns:///", "dns:", "ipv4:", "ipv6:", "k8s:///")


def _host(address: str) -> str:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        host = address  # no port: the whole thing is the host
    return host.removeprefix("[").removesuffix("]")


@functools.lru_cache(maxsize=4096)  # asked for every call a handler serves (its peer)
def is_loopback(target: str) -> bool:
    """Whether a bind address or channel target (``host:port``, ``[v6]:port``, a
    ``dns:///``/``ipv4:``/``ipv6:`` target, a comma-separated list of them, ``unix:``) stays on
    this machine: 127.0.0.0/8, ::1, ``localhost`` or a Unix socket. A wildcard bind address
    (0.0.0.0, ::) is not loopback: it accepts connections from anywhere. Also answers for a
    caller's ``context.peer()`` (``ipv4:127.0.0.1:40730``, ``ipv6:%5B::1%5D:38946``)."""
    target = urllib.parse.unquote(target)
    if target.startswith(("unix:", "unix-abstract:")):
        return True
    for scheme in _SCHEMES:
        if target.startswith(scheme):
            target = target[len(scheme):]
            break
    parts = [p.strip() for p in target.split(",") if p.strip()]
    return bool(parts) and all(_host_is_loopback(_host(p)) for p in parts)


def _host_is_loopback(host: str) -> bool:
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def require_plaintext_allowed(tls: InternalTls, target: str, what: str) -> None:
    """Raise :class:`PlaintextNotAllowedError` when ``tls`` is off and ``target`` is not loopback.
    ``what`` names the server or channel in the message."""
    if not tls.enabled and not is_loopback(target):
        raise PlaintextNotAllowedError(
            f"{what} {target}: plaintext gRPC is allowed only on loopback addresses; set "
            "internal_tls_ca, internal_tls_cert and internal_tls_key (--internal-tls-*, "
            "KBROKER_INTERNAL_TLS_*) for mutual TLS, or use 127.0.0.1")


# --- certificates ---------------------------------------------------------------------------

_COMMON_NAME_OID = bytes([0x06, 0x03, 0x55, 0x04, 0x03])  # 2.5.4.3


def _der_item(data: bytes, at: int) -> tuple[int, int, int]:
    """(tag, start of contents, end of contents) of the DER item at ``at``."""
    tag = data[at]
    length = data[at + 1]
    at += 2
    if length & 0x80:
        count = length & 0x7F
        length = int.from_bytes(data[at:at + count], "big")
        at += count
    if at + length > len(data):
        raise ValueError("truncated DER")
    return tag, at, at + length


def certificate_common_name(pem: bytes) -> str | None:
    """The subject common name of the first certificate in ``pem``; None if it has none.

    Certificate ::= SEQUENCE { tbsCertificate SEQUENCE { [0] version OPTIONAL, serialNumber,
    signature, issuer Name, validity, subject Name, ... }, ... } (RFC 5280); a Name is a
    SEQUENCE of SETs of SEQUENCE { type OID, value }."""
    import base64

    text = pem.decode("ascii", "replace")
    begin, end = "-----BEGIN CERTIFICATE-----", "-----END CERTIFICATE-----"
    start = text.find(begin)
    stop = text.find(end, start)
    if start < 0 or stop < 0:
        raise ValueError("no PEM certificate")
    der = base64.b64decode("".join(text[start + len(begin):stop].split()))
    _, at, _ = _der_item(der, 0)  # Certificate
    _, at, _ = _der_item(der, at)  # tbsCertificate
    if der[at] == 0xA0:  # [0] version
        at = _der_item(der, at)[2]
    for _ in range(4):  # serialNumber, signature, issuer, validity
        at = _der_item(der, at)[2]
    _, at, subject_end = _der_item(der, at)
    name = None
    while at < subject_end:
        _, set_at, set_end = _der_item(der, at)
        while set_at < set_end:
            _, attr_at, attr_end = _der_item(der, set_at)
            if der[attr_at:attr_at + len(_COMMON_NAME_OID)] == _COMMON_NAME_OID:
                _, value_at, value_end = _der_item(der, attr_at + len(_COMMON_NAME_OID))
                with contextlib.suppress(UnicodeDecodeError):
                    name = der[value_at:value_end].decode("utf-8")
            set_at = attr_end
        at = set_end
    return name
