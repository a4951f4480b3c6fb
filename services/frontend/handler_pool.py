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
import hashlib
import logging
from collections.abc import Callable, Sequence

import grpc
from google.protobuf import message_factory
from google.protobuf.message import DecodeError, Message

from kbroker.handler.v1 import handler_pb2, kafka_handler_pb2
from services.common import payloads
from services.common.call_streams import CallStream
from services.common.channels import PLAINTEXT, internal_channel
from services.common.discovery import Resolver, StaticResolver, changes, resolver_for
from services.common.envelopes import (
    EXCHANGE_BATCHES,
    decode_handler_reply,
    encode_handler_call,
)
from services.common.file_records import (
    CARRIED_AFTER_REFUSAL_SECONDS,
    SLICE_MIN_BYTES,
    FileRecordsReader,
    FileSlice,
)
from services.common.file_records import METADATA_KEY as FILE_RECORDS_METADATA_KEY
from services.common.metrics import REMOTE_TIME_METADATA_KEY
from services.common.payloads import Detached, PayloadPath
from services.common.tls import InternalTls, InternalTlsError, require_plaintext_allowed

from .metrics import FILE_RECORDS_BYTES, FILE_RECORDS_UNREADABLE, SPOOL_DECLINED, SPOOLED_BYTES
from .records_spool import RecordsSpool, Spooled

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


class StreamCallError(Exception):
    """A call over a handler stream failed: the stream broke (``broken``: whatever status it
    ended with, e.g. INTERNAL for a reset stream, the handler never answered this call), the
    call ran out of time, or the handler answered with this status."""

    def __init__(self, code: grpc.StatusCode, details: str, *, sent: bool = True,
                 broken: bool = False) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details
        self.sent = sent
        self.broken = broken

    @classmethod
    def not_sent(cls, code: grpc.StatusCode, details: str) -> StreamCallError:
        """The stream had failed before it took the request."""
        return cls(code, details, sent=False)

    @classmethod
    def on_stream(cls, code: grpc.StatusCode, details: str) -> StreamCallError:
        """The call's stream ended before the call was answered (or the call ran out of
        time: DEADLINE_EXCEEDED)."""
        return cls(code, details, broken=code != grpc.StatusCode.DEADLINE_EXCEEDED)

    @property
    def never_reached(self) -> bool:
        """The request was never sent: the stream refused it, or no connection could be
        made."""
        details = self.details.lower()
        return not self.sent or self.code == grpc.StatusCode.UNAVAILABLE and any(
            marker in details for marker in _NOT_CONNECTED_MARKERS)


_STATUS_CODES = {code.value[0]: code for code in grpc.StatusCode}
_RESPONSE_TYPES = {
    method.name: message_factory.GetMessageClass(method.output_type) for method in
    kafka_handler_pb2.DESCRIPTOR.services_by_name["KafkaHandler"].methods}
_EXCHANGE_METHOD = "/{}/Exchange".format(
    handler_pb2.DESCRIPTOR.services_by_name["KafkaHandlerStream"].full_name)


def _encode_call(call: tuple[str, Message | Detached, Metadata], call_id: int) -> bytes:
    rpc, request, metadata = call
    if not isinstance(request, Detached):
        return encode_handler_call(call_id, rpc, request.SerializeToString(), metadata)
    # A request with its record batches beside it is written around them (one copy, into the
    # call); those in a spool file are named instead.
    return encode_handler_call(call_id, rpc, request.serialized(), metadata, request.files)


def _decode_reply(data: bytes) -> tuple[int, tuple[handler_pb2.HandlerReply, memoryview]]:
    reply, response = decode_handler_reply(data)
    return reply.call_id, (reply, response)


class _Handler:
    """One handler: its channel and the long-lived KafkaHandlerStream/Exchange stream its
    calls go over (cheaper than a unary call each). Bytes in and out: the envelopes are
    written and read by hand (no extra copies of the request or response inside them, see
    services.common.envelopes)."""

    def __init__(self, address: str, tls: InternalTls) -> None:
        self.address = address
        self.channel = internal_channel(address, tls, "handler")
        self.stream: CallStream | None = None  # set up by the first call
        # Until when this handler is sent Produce batches carried (it could not read them).
        self.spool_declined_until = 0.0

    async def call(self, rpc: str, request: Message | Detached, metadata: Metadata,
                   time_limit: float, response_batches: PayloadPath | None = None,
                   spool: RecordsSpool | None = None) -> tuple[Message | Detached, float]:
        """One attempt on this handler: the response (with ``response_batches``, its record
        batches beside it as views of the reply) and the seconds the handler reports the
        request spent parked in the purgatory (trailing metadata ``kbroker-remote-ms``). An
        answer naming ranges of segment files that no longer read as named is asked for again,
        within the same time limit, without ``kbroker-local-files``: with its batches. With a
        ``spool``, a request's batches are written there and named, if large enough; a handler
        that cannot read them (it did nothing) is sent them carried, within the same limit."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        if self.stream is None:
            self.stream = CallStream(self.channel.stream_stream(_EXCHANGE_METHOD),
                                     StreamCallError.on_stream, encode=_encode_call,
                                     decode=_decode_reply,
                                     not_sent=StreamCallError.not_sent,
                                     batches=EXCHANGE_BATCHES, name="exchange")
        spooled = spool.write(request.payloads) if spool is not None and isinstance(
            request, Detached) and _local_files(metadata) and (
            started >= self.spool_declined_until) else None
        if spooled is None:
            reply, response = await self.stream.call((rpc, request, metadata), time_limit)
        else:
            settled = False
            try:
                reply, response = await self.stream.call(
                    (rpc, _named(request, spooled), metadata), time_limit)
                settled = reply.file_records_settled
            finally:
                spool.release(spooled, settled)
            if reply.request_files_unreadable:
                SPOOL_DECLINED.inc()
                self.spool_declined_until = loop.time() + CARRIED_AFTER_REFUSAL_SECONDS
                left = time_limit - (loop.time() - started)
                return await self.call(rpc, request, _without_local_files(metadata), left,
                                       response_batches)
            SPOOLED_BYTES.inc(spooled.size)
        if reply.status_code:
            raise StreamCallError(_STATUS_CODES.get(reply.status_code, grpc.StatusCode.UNKNOWN),
                                  reply.status_details)
        remote = 0.0
        for entry in reply.trailing_metadata:
            if entry.key == REMOTE_TIME_METADATA_KEY:
                with contextlib.suppress(ValueError):
                    remote = max(float(entry.value), 0.0) / 1000
        if reply.file_records:
            answer = _with_file_records(rpc, reply, response, response_batches is not None)
            if answer is not None:
                return answer, remote
            without = _without_local_files(metadata)
            if len(without) == len(metadata):
                raise StreamCallError(grpc.StatusCode.INTERNAL,
                                      f"{rpc}: file records in an answer that did not ask")
            left = time_limit - (loop.time() - started)
            return await self.call(rpc, request, without, left, response_batches)
        if response_batches is not None:
            message, batches = payloads.parse_message(response, _RESPONSE_TYPES[rpc],
                                                      response_batches)
            if batches is not None:
                return Detached(message, response_batches, batches), remote
            return message, remote
        return _RESPONSE_TYPES[rpc].FromString(response), remote

    async def close(self, grace: float | None = None) -> None:
        if self.stream is not None:
            await self.stream.close()
        await self.channel.close(grace)


# The answers that may name their record batches as segment file ranges, and where the
# batches go (services.common.file_records).
_FILE_RECORDS_PATHS = {"Fetch": PayloadPath(_RESPONSE_TYPES["Fetch"].DESCRIPTOR,
                                            "responses.partitions.records")}
_FILES = FileRecordsReader()


def _without_local_files(metadata: Metadata) -> Metadata:
    return tuple(entry for entry in metadata if entry[0] != FILE_RECORDS_METADATA_KEY)


def _local_files(metadata: Metadata) -> bool:
    return any(entry[0] == FILE_RECORDS_METADATA_KEY for entry in metadata)


def _named(request: Detached, spooled: Spooled) -> Detached:
    """``request`` carrying only its payloads' heads, naming where the batches were spooled.
    A copy: its heads go into the message (serialized whole), and ``request`` may be sent
    again with its batches."""
    message = type(request.message)()
    message.CopyFrom(request.message)
    return Detached(message, request.path, spooled.heads, spooled.ranges)


def _with_file_records(rpc: str, reply: handler_pb2.HandlerReply, response: memoryview,
                       detached: bool) -> Message | Detached | None:
    """The answer with the batches its ``file_records`` name: beside it when ``detached``
    (a large range as a FileSlice, which the client's connection sends from the file), else
    read into it. None when a range no longer reads as named (the segment deleted, replaced or
    cut meanwhile)."""
    path = _FILE_RECORDS_PATHS.get(rpc)
    if path is None:
        raise StreamCallError(grpc.StatusCode.INTERNAL, f"file records in a {rpc} answer")
    try:
        message, batches = payloads.parse(response, _RESPONSE_TYPES[rpc], path)
    except DecodeError as exc:
        raise StreamCallError(grpc.StatusCode.INTERNAL, f"bad {rpc} answer: {exc}") from None
    size = 0
    for files in reply.file_records:
        data: FileSlice | bytes | None = None
        if files.payload < len(batches):
            data = (_FILES.slice if detached and files.size >= SLICE_MIN_BYTES else _FILES.read)(
                files.path, files.inode, files.position, files.size)
        if data is None:
            FILE_RECORDS_UNREADABLE.inc()
            log.debug("%s answer: %d bytes at %d of %s (inode %d) unreadable; asking again",
                      rpc, files.size, files.position, files.path, files.inode)
            for piece in batches:
                if isinstance(piece, FileSlice):
                    piece.close()
            return None
        batches[files.payload] = data if isinstance(data, FileSlice) else memoryview(data)
        size += files.size
    FILE_RECORDS_BYTES.inc(size)
    if detached:
        return Detached(message, path, batches)
    return payloads.fill(message, path, batches)


def _rank(affinity: str, address: str) -> int:
    """A handler's rendezvous score for ``affinity``: a stable hash (every frontend agrees)."""
    return int.from_bytes(hashlib.blake2b(f"{affinity}|{address}".encode(),
                                          digest_size=8).digest(), "big")


class HandlerPool:
    """The handlers, seen as one service. Not thread-safe: used from one event loop.

    Create, then ``await start()`` (the first resolution); ``close()`` ends it."""

    def __init__(self, targets: Sequence[str] | str,
                 resolve_interval: float = RESOLVE_INTERVAL_SECONDS,
                 resolver: Resolver | None = None, tls: InternalTls = PLAINTEXT,
                 spool: RecordsSpool | None = None) -> None:
        if resolver is None:
            # Refused at start-up rather than at the first resolution.
            for target in [targets] if isinstance(targets, str) else targets:
                require_plaintext_allowed(tls, target, "handlers at")
        self._tls = tls
        # Where large Produce requests' batches go for the log nodes of this host to read.
        self.spool = spool
        self._resolver: Resolver = resolver or resolver_for(targets)
        self._resolve_interval = resolve_interval
        self._handlers: list[_Handler] = []
        self._next = 0
        self._watch: asyncio.Task[None] | None = None
        self._closing: set[asyncio.Task[None]] = set()

    @property
    def addresses(self) -> tuple[str, ...]:
        return tuple(h.address for h in self._handlers)

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
            self.update(addresses, strict=False)

    def update(self, addresses: Sequence[str], *, strict: bool = True) -> None:
        """Open channels to new handlers, close those of handlers no longer listed. Unusable
        TLS files raise, unless not ``strict`` (a later resolution): then the new handlers
        are left out until the next one."""
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
                try:
                    handler = _Handler(address, self._tls)
                except InternalTlsError as e:
                    if strict:
                        raise
                    log.error("no channel to handler %s: %s", address, e)
                    continue
            handlers.append(handler)
        if [h.address for h in handlers] != [h.address for h in self._handlers]:
            log.info("handlers: %s", ", ".join(wanted) or "none")
        self._handlers = handlers
        self._next = self._next % len(handlers) if handlers else 0

    def _pick(self, tried: set[str], affinity: str | None = None) -> _Handler | None:
        """Next handler in turn, preferring untried ones not known to be failing; with an
        ``affinity``, the untried one it ranks first (rendezvous hashing: the same on every
        frontend, and only the requests of a handler that left move) unless it is failing."""
        handlers = self._handlers
        n = len(handlers)
        if n == 0:
            return None
        if affinity is not None:
            ranked = sorted((h for h in handlers if h.address not in tried),
                            key=lambda h: _rank(affinity, h.address), reverse=True)
            healthy = [h for h in ranked if h.channel.get_state(try_to_connect=False)
                       != grpc.ChannelConnectivity.TRANSIENT_FAILURE]
            if healthy or ranked:
                return (healthy or ranked)[0]
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

    async def call(self, rpc: str, request: Message | Detached, *, metadata: Metadata,
                   time_limit: float, retry_safe: bool | Callable[[], bool],
                   response_batches: PayloadPath | None = None, affinity: str | None = None,
                   ) -> tuple[Message | Detached, float]:
        """Send ``request`` (a message, or one with its record batches beside it) to the
        handler RPC ``rpc`` (the handler ``affinity`` ranks first, if given: see
        :meth:`_pick`); the whole call, retries included, ends within ``time_limit``
        seconds. A request that failed mid-request goes to another handler if ``retry_safe``
        is true, or returns true when called (it is asked only then). Returns the response and
        the seconds the answering handler reports the request spent parked in the purgatory
        (0 if none). Raises :class:`HandlerCallError` when no answer came."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + time_limit
        tried: set[str] = set()
        reached = False
        last: StreamCallError | None = None
        for attempt in range(len(self._handlers) + 1):  # every handler once, plus one
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            handler = self._pick(tried, affinity)
            if handler is None:
                raise HandlerCallError(rpc, grpc.StatusCode.UNAVAILABLE, "no handler is known",
                                       reached=reached, availability=True)
            tried.add(handler.address)
            try:
                return await handler.call(rpc, request, metadata, remaining, response_batches,
                                          self.spool if rpc == "Produce" else None)
            except StreamCallError as e:
                last = e
                if e.never_reached:
                    log.debug("%s: handler %s unreachable: %s", rpc, handler.address, e.details)
                    continue
                reached = True
                mid_request = e.broken or e.code in _MID_REQUEST_CODES
                if mid_request:
                    log.warning("%s: handler %s failed mid-request (attempt %d): %s", rpc,
                                handler.address, attempt + 1, e.details)
                    if retry_safe if isinstance(retry_safe, bool) else retry_safe():
                        continue
                raise HandlerCallError(
                    rpc, e.code, e.details, reached=True,
                    availability=mid_request or e.code == grpc.StatusCode.DEADLINE_EXCEEDED,
                ) from None
        if last is None:
            raise HandlerCallError(rpc, grpc.StatusCode.DEADLINE_EXCEEDED, "no time left",
                                   reached=False, availability=True)
        raise HandlerCallError(rpc, last.code, last.details, reached=reached, availability=True)

    async def close(self) -> None:
        if self.spool is not None:
            self.spool.close()
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        channels = [h.close() for h in self._handlers]
        self._handlers = []
        await asyncio.gather(*channels, *self._closing, return_exceptions=True)
