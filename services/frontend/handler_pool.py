"""Client-side load balancing over the handlers: one long-lived channel per handler, requests
spread round-robin (starting with the first address), channels in TRANSIENT_FAILURE skipped
while another is usable.

Retries follow what a failure proves. A call that failed to connect never reached a handler and
is retried on another for any API. A call that reached a handler and then failed (the handler
died, the stream was cut) is retried only when the API is safe to repeat (it only reads); for
the others the outcome is unknown and the caller is told so. Errors the handler itself returned
are never retried. Attempts are bounded: every handler once, plus one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import grpc
from google.protobuf.message import Message

from kbroker.handler.v1 import handler_pb2_grpc
from services.common.channels import insecure_channel

log = logging.getLogger(__name__)

# gRPC's wording when no connection could be made: the request was never sent.
_NOT_CONNECTED_MARKERS = (
    "failed to connect", "connections to all backends failing", "dns resolution failed",
    "connection refused", "no route to host",
)

_MID_REQUEST_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED})

Metadata = tuple[tuple[str, str], ...]


class HandlerCallError(Exception):
    """No handler answered a request.

    ``reached`` is False when no attempt got as far as a handler (every connect failed), so
    the request had no effect; True when the last attempt reached one and its outcome is
    unknown (``availability``) or the handler answered with an error status (not
    ``availability``: a failure of the handler itself, e.g. INTERNAL).
    """

    def __init__(self, rpc: str, status: grpc.StatusCode, details: str, *, reached: bool,
                 availability: bool) -> None:
        super().__init__(f"{rpc}: {status.name}: {details}")
        self.status = status
        self.reached = reached
        self.availability = availability


def _never_reached(error: grpc.aio.AioRpcError) -> bool:
    if error.code() != grpc.StatusCode.UNAVAILABLE:
        return False
    details = (error.details() or "").lower()
    return any(marker in details for marker in _NOT_CONNECTED_MARKERS)


class HandlerPool:
    """The handlers, seen as one service. Not thread-safe: used from one event loop."""

    def __init__(self, addresses: Sequence[str]) -> None:
        if not addresses:
            raise ValueError("at least one handler address is needed")
        self.addresses = tuple(addresses)
        self._channels = [insecure_channel(a) for a in self.addresses]
        self._stubs = [handler_pb2_grpc.KafkaHandlerStub(c) for c in self._channels]
        self._next = 0
        self.max_attempts = len(self._channels) + 1

    def _pick(self, tried: set[int]) -> int:
        """Next channel in turn, preferring untried ones not known to be failing."""
        n = len(self._channels)
        start = self._next
        self._next = (start + 1) % n
        fallback = None
        for step in range(n):
            i = (start + step) % n
            if i in tried:
                continue
            state = self._channels[i].get_state(try_to_connect=False)
            if state != grpc.ChannelConnectivity.TRANSIENT_FAILURE:
                return i
            if fallback is None:
                fallback = i
        return start if fallback is None else fallback

    async def call(self, rpc: str, request: Message, *, metadata: Metadata,
                   time_limit: float, retry_safe: bool) -> Message:
        """Send ``request`` to the handler RPC ``rpc``; the whole call, retries included, ends
        within ``time_limit`` seconds. Raises :class:`HandlerCallError` when no answer came."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + time_limit
        tried: set[int] = set()
        reached = False
        last: grpc.aio.AioRpcError | None = None
        for attempt in range(self.max_attempts):
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            i = self._pick(tried)
            tried.add(i)
            try:
                return await getattr(self._stubs[i], rpc)(
                    request, metadata=metadata, timeout=remaining)
            except grpc.aio.AioRpcError as e:
                last = e
                if _never_reached(e):
                    log.debug("%s: handler %s unreachable: %s", rpc, self.addresses[i],
                              e.details())
                    continue
                reached = True
                if e.code() in _MID_REQUEST_CODES:
                    log.warning("%s: handler %s failed mid-request (attempt %d): %s", rpc,
                                self.addresses[i], attempt + 1, e.details())
                    if retry_safe:
                        continue
                    raise HandlerCallError(rpc, e.code(), e.details() or "", reached=True,
                                           availability=True) from None
                availability = e.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                raise HandlerCallError(rpc, e.code(), e.details() or "", reached=True,
                                       availability=availability) from None
        if last is None:
            raise HandlerCallError(rpc, grpc.StatusCode.DEADLINE_EXCEEDED, "no time left",
                                   reached=False, availability=True)
        raise HandlerCallError(rpc, last.code(), last.details() or "", reached=reached,
                               availability=True)

    async def close(self) -> None:
        await asyncio.gather(*(c.close() for c in self._channels), return_exceptions=True)
