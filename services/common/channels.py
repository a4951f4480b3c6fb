"""Long-lived gRPC channels with the limits Kafka traffic needs (large record batches).

Every channel one service opens to another is made by :func:`internal_channel` (asyncio) or
:func:`internal_sync_channel` (blocking: probes, the local cluster launcher): mutual TLS when
the process has internal TLS material, the server's certificate checked against the identity of
the kind of service the channel means to reach (see :mod:`services.common.tls` for why the
kind and not the address); plaintext otherwise, to loopback targets only.
"""

from __future__ import annotations

import grpc

from .tls import PLAINTEXT, InternalTls, require_plaintext_allowed, service_identity

__all__ = ["CHANNEL_OPTIONS", "PLAINTEXT", "SERVER_OPTIONS", "insecure_channel",
           "internal_channel", "internal_sync_channel"]

# A produce request may carry up to socket.request.max.bytes (100 MiB); leave headroom.
MAX_MESSAGE_BYTES = 256 * 1024 * 1024

# Record batches travel in messages of hundreds of KB to tens of MB: large HTTP/2 frames and
# windows cut the per-frame work (and wake-ups) per message.
_BULK = [
    ("grpc.http2.max_frame_size", 16 * 1024 * 1024 - 1),
    ("grpc.http2.lookahead_bytes", 16 * 1024 * 1024),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]

CHANNEL_OPTIONS = [
    *_BULK,
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    # Reconnect quickly after a peer restarts.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2_000),
    ("grpc.enable_retries", 0),
    # Each channel its own connections: gRPC otherwise shares them between the channels of a
    # process that dial one address, and a new channel to a service restarted there inherits
    # the old connection's failure and backoff (its first call fails at once, "connection
    # refused", though the service is up).
    ("grpc.use_local_subchannel_pool", 1),
]

SERVER_OPTIONS = [
    *_BULK,
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.so_reuseport", 0),
    # Bursts of parked operations (thousands of long-poll fetches) must queue, not be cancelled.
    ("grpc.server.max_pending_requests", 100_000),
]


def _options(server_name: str) -> list[tuple[str, object]]:
    # The name the server's certificate must match, whatever address is dialled.
    return [*CHANNEL_OPTIONS, ("grpc.ssl_target_name_override", server_name)]


def internal_channel(address: str, tls: InternalTls, peer: str) -> grpc.aio.Channel:
    """An asyncio channel to ``address``, a service of kind ``peer`` ("log", "handler", ...);
    create once and keep it. Raises PlaintextNotAllowedError without TLS to a non-loopback
    address, InternalTlsError when the TLS files cannot be read (they are read here, so a
    channel made after a certificate rotation presents the new certificate)."""
    if not tls.enabled:
        require_plaintext_allowed(tls, address, f"channel to the {peer}")
        return grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
    return grpc.aio.secure_channel(address, tls.channel_credentials(),
                                   options=_options(service_identity(peer)))


def internal_sync_channel(address: str, tls: InternalTls, peer: str, *,
                          server_name: str = "") -> grpc.Channel:
    """:func:`internal_channel` for blocking code; ``server_name`` replaces the identity of
    ``peer`` as the name the server's certificate must match."""
    if not tls.enabled:
        require_plaintext_allowed(tls, address, f"channel to the {peer}")
        return grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
    return grpc.secure_channel(address, tls.channel_credentials(),
                               options=_options(server_name or service_identity(peer)))


def insecure_channel(address: str) -> grpc.aio.Channel:
    """A plaintext asyncio channel to a loopback ``host:port`` (tests, tools)."""
    require_plaintext_allowed(PLAINTEXT, address, "channel")
    return grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
