"""Whose request a handler serves: the principal a frontend names in the call metadata
(``kafka-principal``, with the client's address in ``kafka-client-host``), trusted only from a
caller that is a frontend.

A caller is trusted when it presented a TLS client certificate whose common name is one of
``frontend_identities``, or when it reached the handler over plaintext from a loopback address
(plaintext gRPC is allowed only on loopback, where every process is the operator's). Any other
caller (another service's certificate, TLS without a certificate, plaintext from elsewhere)
cannot claim a principal: its requests run as ``User:ANONYMOUS`` from its own address.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from services.common.acls import ANONYMOUS
from services.common.tls import is_loopback, peer_identity

PRINCIPAL_KEY = "kafka-principal"
CLIENT_HOST_KEY = "kafka-client-host"


@dataclass(frozen=True, slots=True)
class Caller:
    """The gRPC peer of a call: its address (host) and whether it may name a principal."""

    host: str
    trusted: bool

    def principal_and_host(self, metadata: Mapping[str, Any]) -> tuple[str, str]:
        """The (principal, client host) a request runs as, from its call ``metadata``."""
        if not self.trusted:
            return ANONYMOUS, self.host
        # Percent-encoded by the frontend, as the client id.
        principal = unquote(str(metadata.get(PRINCIPAL_KEY) or "")) or ANONYMOUS
        return principal, str(metadata.get(CLIENT_HOST_KEY) or self.host)


def caller_of(context: Any, frontend_identities: Iterable[str]) -> Caller:
    """The caller of ``context`` (a gRPC servicer context, or anything with its ``peer()`` and
    ``auth_context()``)."""
    host = peer_host(context.peer() or "")
    auth = context.auth_context() or {}
    if _uses_tls(auth):
        identity = peer_identity(context)
        return Caller(host, identity is not None and identity in frozenset(frontend_identities))
    return Caller(host, is_loopback(context.peer() or ""))


def _uses_tls(auth: Mapping[str, Any]) -> bool:
    kinds = auth.get("transport_security_type") or []
    return any(kind not in (b"insecure", "insecure") for kind in kinds)


@functools.lru_cache(maxsize=1024)
def peer_host(peer: str) -> str:
    """The host of a gRPC peer string (``ipv4:127.0.0.1:5000``, ``ipv6:[::1]:5000``); the
    string itself when it is not an address."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return rest.rpartition(":")[0]
    if kind == "ipv6":
        host = rest.rpartition(":")[0]
        return host[1:-1] if host.startswith("[") else host
    return peer
