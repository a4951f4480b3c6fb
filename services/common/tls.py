"""TLS between the services (gRPC with client certificates)."""

from __future__ import annotations

import grpc


def peer_identity(context: grpc.aio.ServicerContext) -> str | None:
    """The common name of the certificate the calling service presented, or None when the call
    came without one (plaintext, or TLS without a client certificate)."""
    auth = context.auth_context()
    names = auth.get("x509_common_name") or []
    return names[0].decode("utf-8", "replace") if names else None
