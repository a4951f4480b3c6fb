"""Client-side load balancing over the handlers: one long-lived channel per handler, requests
spread round-robin (starting with the first address), channels in TRANSIENT_FAILURE skipped
while another is usable.

The handlers are found through ``services.common.discovery``: a static list stays as given; a
``dns:///`` or ``k8s:///`` address is re-resolved every few seconds, channels opening for new
handlers and closing (after the calls in flight, within a grace period) for those that left.

Retries follow what a failure proves. A call that failed to connect never reached a handler and
is retried on another for any API. A call that reached a handler and then failed (the handler
died, the stream was cut) is retried only when the API is safe to repeat (it only reads); for
the others the outcome is unknown and the caller is told so. Errors the handler itself returned
are never retried. Attempts are bounded: every handler once, plus one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import message_factory
from google.protobuf.message import Message

from kbroker.handler.v1 import handler_pb2, kafka_handler_pb2
from services.common.call_streams import CallStream
from services.common.channels import insecure_channel
from services.common.discovery import Resolver, StaticResolver, changes, resolver_for
from services.common.envelopes import decode_handler_reply, encode_handler_call
from services.common.metrics import REMOTE_TIME_METADATA_KEY

log = logging.getLogger(__name__)

# gRPC's wording when no connection could be made: the request was never sent.
_NOT_CONNECTED_MARKERS = (
    "failed to connect", "connections to all backends failing", "dns resolution failed",
    "connection refused", "no route to host",
)

_MID_REQUEST_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED})

Metadata = tuple[tuple[str, str], ...]

# How often a DNS or Kubernetes address is resolved again, and how long a channel to a handler
# that left may finish its calls.
RESOLVE_INTERVAL_SECONDS = 5.0
CLOSE_GRACE_SECONDS = 30.0


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


def _never_reached(error: grpc.aio.AioRpcError | StreamCallError) -> bool:
    if error.code() != grpc.StatusCode.UNAVAILABLE:
        return False
    details = (error.details() or "").lower()
    return any(marker in details for marker in _NOT_CONNECTED_MARKERS)


class StreamCallError(Exception):
    """A call over a handler stream failed; shaped like ``grpc.aio.AioRpcError`` (``code()``,
    ``details()``) so both paths share one retry policy. ``answered``: the handler itself
    answered with this status (as opposed to the stream failing)."""

    def __init__(self, code: grpc.StatusCode, details: str, *, answered: bool = False) -> None:
        super().__init__(f"{code.name}: {details}")
        self._code = code
        self._details = details
        self.answered = answered

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


_STATUS_CODES = {code.value[0]: code for code in grpc.StatusCode}
_KAFKA_METHODS = kafka_handler_pb2.DESCRIPTOR.services_by_name["KafkaHandler"].methods_by_name
_RESPONSE_TYPES: dict[str, Any] = {}


def _response_type(rpc: str) -> Any:
    response_type = _RESPONSE_TYPES.get(rpc)
    if response_type is None:
        response_type = message_factory.GetMessageClass(_KAFKA_METHODS[rpc].output_type)
        _RESPONSE_TYPES[rpc] = response_type
    return response_type


_EXCHANGE_METHOD = "/{}/Exchange".format(
    handler_pb2.DESCRIPTOR.services_by_name["KafkaHandlerStream"].full_name)


def _encode_call(call: tuple[str, bytes, Metadata], call_id: int) -> bytes:
    rpc, request, metadata = call
    return encode_handler_call(call_id, rpc, request, metadata)


def _decode_reply(data: bytes) -> tuple[int, tuple[handler_pb2.HandlerReply, memoryview]]:
    reply, response = decode_handler_reply(data)
    return reply.call_id, (reply, response)


@dataclass(slots=True)
class _Handler:
    """One handler: its channel and the long-lived KafkaHandlerStream/Exchange stream its
    calls go over (cheaper than a unary call each)."""

    address: str
    channel: grpc.aio.Channel
    stream: CallStream | None = None

    def call_stream(self) -> CallStream:
        if self.stream is None:
            # Bytes in and out: the envelopes are written and read by hand (no extra copies of
            # the request or response inside them, see services.common.envelopes).
            exchange = self.channel.stream_stream(_EXCHANGE_METHOD)
            self.stream = CallStream(exchange, StreamCallError, encode=_encode_call,
                                     decode=_decode_reply)
        return self.stream

    async def call(self, rpc: str, request: Message, metadata: Metadata,
                   time_limit: float) -> tuple[Message, Sequence[tuple[str, Any]]]:
        """One attempt on this handler: the response and its trailing metadata."""
        reply, response = await self.call_stream().call(
            (rpc, request.SerializeToString(), metadata), time_limit)
        if reply.status_code:
            raise StreamCallError(
                _STATUS_CODES.get(reply.status_code, grpc.StatusCode.UNKNOWN),
                reply.status_details, answered=True)
        trailers = [(m.key, m.value) for m in reply.trailing_metadata]
        return _response_type(rpc).FromString(response), trailers

    async def close(self, grace: float | None = None) -> None:
        if self.stream is not None:
            await self.stream.close()
        await self.channel.close(grace)


class HandlerPool:
    """The handlers, seen as one service. Not thread-safe: used from one event loop.

    Create, then ``await start()`` (the first resolution); ``close()`` ends it."""

    def __init__(self, targets: Sequence[str] | str,
                 resolve_interval: float = RESOLVE_INTERVAL_SECONDS,
                 resolver: Resolver | None = None) -> None:
        self._resolver: Resolver = resolver or resolver_for(targets)
        self._resolve_interval = resolve_interval
        self._handlers: list[_Handler] = []
        self._next = 0
        self._watch: asyncio.Task[None] | None = None
        self._closing: set[asyncio.Task[None]] = set()

    @property
    def addresses(self) -> tuple[str, ...]:
        return tuple(h.address for h in self._handlers)

    @property
    def max_attempts(self) -> int:
        """Every handler once, plus one."""
        return len(self._handlers) + 1

    async def start(self) -> None:
        """Resolve the handlers once; DNS or Kubernetes addresses are then followed."""
        if isinstance(self._resolver, StaticResolver):
            # In the order given: round-robin starts with the first address.
            self.update(self._resolver.addresses)
            return
        updates = changes(self._resolver, self._resolve_interval)
        self.update(await anext(updates))
        self._watch = asyncio.get_running_loop().create_task(
            self._follow(updates), name="handler-discovery")

    async def _follow(self, updates) -> None:
        async for addresses in updates:
            self.update(addresses)

    def update(self, addresses: Sequence[str]) -> None:
        """Open channels to new handlers, close those of handlers no longer listed."""
        wanted = list(dict.fromkeys(addresses))
        known = {h.address: h for h in self._handlers}
        for gone in set(known) - set(wanted):
            task = asyncio.get_running_loop().create_task(
                known[gone].close(CLOSE_GRACE_SECONDS))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)
        handlers = []
        for address in wanted:
            handler = known.get(address)
            if handler is None:
                channel = insecure_channel(address)
                handler = _Handler(address, channel)
            handlers.append(handler)
        if [h.address for h in handlers] != [h.address for h in self._handlers]:
            log.info("handlers: %s", ", ".join(wanted) or "none")
        self._handlers = handlers
        self._next = self._next % len(handlers) if handlers else 0

    def _pick(self, tried: set[str]) -> _Handler | None:
        """Next handler in turn, preferring untried ones not known to be failing."""
        handlers = self._handlers
        n = len(handlers)
        if n == 0:
            return None
        start = self._next % n
        self._next = (start + 1) % n
        fallback = None
        for step in range(n):
            handler = handlers[(start + step) % n]
            if handler.address in tried:
                continue
            state = handler.channel.get_state(try_to_connect=False)
            if state != grpc.ChannelConnectivity.TRANSIENT_FAILURE:
                return handler
            if fallback is None:
                fallback = handler
        return handlers[start] if fallback is None else fallback

    async def call(self, rpc: str, request: Message, *, metadata: Metadata,
                   time_limit: float, retry_safe: bool) -> Message:
        """Send ``request`` to the handler RPC ``rpc``; the whole call, retries included, ends
        within ``time_limit`` seconds. Raises :class:`HandlerCallError` when no answer came."""
        response, _remote = await self.call_timed(
            rpc, request, metadata=metadata, time_limit=time_limit, retry_safe=retry_safe)
        return response

    async def call_timed(self, rpc: str, request: Message, *, metadata: Metadata,
                         time_limit: float, retry_safe: bool) -> tuple[Message, float]:
        """:meth:`call`, also returning the seconds the answering handler reports the request
        spent parked in the purgatory (trailing metadata ``kbroker-remote-ms``; 0 if none)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + time_limit
        tried: set[str] = set()
        reached = False
        last: grpc.aio.AioRpcError | StreamCallError | None = None
        for attempt in range(self.max_attempts):
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            handler = self._pick(tried)
            if handler is None:
                raise HandlerCallError(rpc, grpc.StatusCode.UNAVAILABLE, "no handler is known",
                                       reached=reached, availability=True)
            tried.add(handler.address)
            try:
                response, trailers = await handler.call(rpc, request, metadata, remaining)
                return response, _remote_seconds(trailers)
            except (grpc.aio.AioRpcError, StreamCallError) as e:
                last = e
                if _never_reached(e):
                    log.debug("%s: handler %s unreachable: %s", rpc, handler.address,
                              e.details())
                    continue
                reached = True
                if e.code() in _MID_REQUEST_CODES:
                    log.warning("%s: handler %s failed mid-request (attempt %d): %s", rpc,
                                handler.address, attempt + 1, e.details())
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
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        channels = [h.close() for h in self._handlers]
        self._handlers = []
        await asyncio.gather(*channels, *self._closing, return_exceptions=True)


def _remote_seconds(trailers: Sequence[tuple[str, str | bytes]] | None) -> float:
    for key, value in trailers or ():
        if key == REMOTE_TIME_METADATA_KEY:
            try:
                return max(float(value), 0.0) / 1000
            except ValueError:
                return 0.0
    return 0.0
