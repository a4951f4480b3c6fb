"""Long-lived gRPC channels with the limits Kafka traffic needs (large record batches)."""

from __future__ import annotations

import grpc

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


def insecure_channel(address: str) -> grpc.aio.Channel:
    """An asyncio channel to ``host:port``; create once and keep it."""
    return grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
