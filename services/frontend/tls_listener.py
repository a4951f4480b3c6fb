"""The TLS side of an SSL or SASL_SSL listener (Kafka's SslTransportLayer handshake): the
frontend accepts the TCP connections itself and runs each one's handshake, so that

- every connection starts with the latest certificate (:meth:`.ssl_context.
  ReloadingSslContext.current`, checked at each accept);
- a handshake that fails (no client certificate where one is required, one from another CA,
  not TLS at all) or does not finish within ``authentication_timeout_ms`` is counted as a
  failed authentication, as Kafka counts it.

A connection whose handshake succeeded is handed to its protocol (a
:class:`~.network_receive.FrameChannel`) with the TLS transport, as ``create_server`` would.
Not thread-safe (one event loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Callable

log = logging.getLogger(__name__)

# Pending connections the kernel queues before they are accepted (asyncio's default).
_BACKLOG = 100


class TlsListener:
    """One listening socket whose connections speak TLS."""

    def __init__(self, sock: socket.socket, context: Callable[[], ssl.SSLContext],
                 protocol_factory: Callable[[], asyncio.BaseProtocol],
                 handshake_seconds: float, on_failure: Callable[[], None]) -> None:
        self._sock = sock
        self._context = context
        self._protocol_factory = protocol_factory
        self._handshake_seconds = handshake_seconds
        self._on_failure = on_failure
        self._accepting: asyncio.Task[None] | None = None
        self._handshakes: set[asyncio.Task[None]] = set()

    @classmethod
    def bind(cls, host: str | None, port: int, context: Callable[[], ssl.SSLContext],
             protocol_factory: Callable[[], asyncio.BaseProtocol], handshake_seconds: float,
             on_failure: Callable[[], None]) -> TlsListener:
        if not host and socket.has_dualstack_ipv6():  # every interface, IPv4 and IPv6
            sock = socket.create_server(("", port), family=socket.AF_INET6, backlog=_BACKLOG,
                                        dualstack_ipv6=True)
        else:
            family = socket.AF_INET6 if host and ":" in host else socket.AF_INET
            sock = socket.create_server((host or "", port), family=family, backlog=_BACKLOG)
        sock.setblocking(False)
        return cls(sock, context, protocol_factory, handshake_seconds, on_failure)

    @property
    def port(self) -> int:
        return int(self._sock.getsockname()[1])

    def start_serving(self) -> None:
        if self._accepting is None:
            self._accepting = asyncio.get_running_loop().create_task(self._accept())

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, _ = await loop.sock_accept(self._sock)
            except OSError as e:  # out of file descriptors, say: keep accepting
                log.warning("accepting a TLS connection failed: %s", e)
                await asyncio.sleep(0.1)
                continue
            task = loop.create_task(self._handshake(conn))
            self._handshakes.add(task)
            task.add_done_callback(self._handshakes.discard)

    async def _handshake(self, conn: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        try:
            peer = conn.getpeername()
        except OSError:
            peer = "?"
        try:
            await loop.connect_accepted_socket(
                self._protocol_factory, conn, ssl=self._context(),
                ssl_handshake_timeout=self._handshake_seconds)
        except (OSError, TimeoutError) as e:  # ssl.SSLError and ConnectionError are OSErrors
            log.info("TLS handshake with %s failed: %s", peer, e or type(e).__name__)
            self._on_failure()
            conn.close()

    def close(self) -> None:
        """Stop accepting and abandon handshakes in progress."""
        if self._accepting is not None:
            self._accepting.cancel()
        for task in list(self._handshakes):
            task.cancel()
        self._sock.close()

    async def wait_closed(self) -> None:
        tasks = [t for t in (self._accepting, *self._handshakes) if t is not None]
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
