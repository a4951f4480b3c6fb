"""Many calls over one long-lived bidirectional gRPC stream, matched by call id.

A unary call costs a new HTTP/2 stream, a task on each side and the interceptors; on the
produce path that fixed cost is paid for every request and weighs as much as the bytes. A
:class:`CallStream` sends each request as one message on a stream that stays open and resolves
the caller's future when the answer carrying its id comes back, so answers may arrive in any
order and many calls share the stream at once. Used by frontends towards handlers and by
handlers towards log nodes; :func:`serve_calls` is the serving side.

Failure semantics match a unary call's, expressed through the caller's ``failure_of(code,
details)``: when the stream breaks, every call sent on it fails with the stream's status
(UNAVAILABLE with gRPC's "failed to connect" wording when the peer could not be reached at all,
so callers can tell a request that was never delivered); the next call opens a new stream. A
request the stream refused to take (it had already failed, e.g. on a connection the peer's
death closed, whatever the wording) was provably never sent: it fails through ``not_sent``. A
call not answered within its time limit fails with DEADLINE_EXCEEDED and its late answer is
dropped. Not thread-safe: one event loop.

Batches (:class:`Batches`, for streams of raw envelopes that define a batch message): each
message costs both sides a fixed amount of gRPC's work (a frame, a completion, a wake-up) that
a small request weighs more than its bytes. Requests that are ready while a write is under way
go together in the next one, as one batch message, once the peer said it takes them (its
initial metadata carries :attr:`Batches.metadata_key`); the serving side answers the same way
when the caller opened the stream with that key. A call that finds the stream idle is written
at once: batching adds no wait. Large messages always go alone (a batch would copy them).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from .metrics import CALL_STREAM_CALLS, CALL_STREAM_MESSAGES

log = logging.getLogger(__name__)


FailureOf = Callable[[grpc.StatusCode, str], Exception]
"""Turns a failed call's status code and details into the exception its caller raises."""

# Messages this large go alone; a batch holds at most BATCH_MAX_BYTES of messages.
BATCHED_MESSAGE_MAX_BYTES = 64 * 1024
BATCH_MAX_BYTES = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Batches:
    """How a stream of serialized envelopes carries several in one message: ``join(messages)``
    makes the batch, ``split(message)`` gives a batch's messages (None: a message that is not
    a batch); :func:`services.common.envelopes.protobuf_batches` makes them for protobuf
    messages. Each side says it takes batches with ``metadata_key``: the caller in the stream's
    request metadata (it takes batched answers), the server in its initial metadata (it takes
    batched requests)."""

    join: Callable[[Sequence[bytes]], bytes]
    split: Callable[[Any], Sequence[Any] | None]
    metadata_key: str = "kbroker-call-batches"


def _batches_of(messages: Sequence[bytes]) -> list[list[bytes]]:
    """``messages`` in the groups they are written in: the large ones alone, the others
    together up to BATCH_MAX_BYTES."""
    groups: list[list[bytes]] = []
    current: list[bytes] = []
    size = 0
    for message in messages:
        length = len(message)
        if length >= BATCHED_MESSAGE_MAX_BYTES:
            groups.append([message])
            continue
        if current and size + length > BATCH_MAX_BYTES:
            groups.append(current)
            current, size = [], 0
        current.append(message)
        size += length
    if current:
        groups.append(current)
    return groups


class _Queued:
    """A request waiting for a write, with its call id and its caller's answer."""

    __slots__ = ("answer", "call_id", "message", "sent")

    def __init__(self, call_id: int, message: Any, answer: asyncio.Future[Any]) -> None:
        self.call_id = call_id
        self.message = message
        self.answer = answer
        self.sent = False


def _set_call_id(request: Any, call_id: int) -> Any:
    request.call_id = call_id
    return request


def _by_call_id(message: Any) -> tuple[int, Any]:
    return message.call_id, message


class CallStream:
    """One stream opened with ``open_stream`` (e.g. a stub's stream-stream method); answers are
    matched to requests by their ``call_id``. By default requests and answers are messages with
    a ``call_id`` field; ``encode(request, call_id)`` (the stream message) and ``decode(message)``
    (its call id and the caller's answer) let a stream of raw bytes carry its own envelopes
    (see :mod:`.envelopes`)."""

    def __init__(self, open_stream: Callable[[], Any], failure_of: FailureOf,
                 encode: Callable[[Any, int], Any] = _set_call_id,
                 decode: Callable[[Any], tuple[int, Any]] = _by_call_id,
                 not_sent: FailureOf | None = None, batches: Batches | None = None,
                 name: str = "") -> None:
        self._open_stream = open_stream
        self._failure_of = failure_of
        self._not_sent = not_sent or failure_of
        self._encode = encode
        self._decode = decode
        self._batches = batches
        self._ids = itertools.count(1)
        self._call: Any = None
        self._reader: asyncio.Task[None] | None = None
        # call id -> (the stream it was sent on, its answer)
        self._waiting: dict[int, tuple[Any, asyncio.Future[Any]]] = {}
        self._writing = asyncio.Lock()
        # Requests waiting for the write under way, and the stream whose peer said it takes
        # batches.
        self._queue: list[_Queued] = []
        self._batching_on: Any = None
        # Messages written, and the calls they carried (``name``: the stream's, in metrics).
        self._messages = CALL_STREAM_MESSAGES.labels(name, "caller")
        self._calls = CALL_STREAM_CALLS.labels(name, "caller")

    @property
    def in_flight(self) -> int:
        return len(self._waiting)

    @property
    def batching(self) -> bool:
        """Whether the open stream's peer said it takes batches (see :class:`Batches`)."""
        return self._call is not None and self._batching_on is self._call

    async def call(self, request: Any, time_limit: float) -> Any:
        """Send ``request`` (with a call id given here) and return the matching answer."""
        call_id = next(self._ids)
        message = self._encode(request, call_id)
        queued = _Queued(call_id, message, asyncio.get_running_loop().create_future())
        # The request joins the queue; whoever takes the write lock next writes everything
        # queued (one message each, or batches).
        self._queue.append(queued)
        try:
            async with asyncio.timeout(time_limit):
                async with self._writing:
                    if not queued.sent:
                        await self._write_queue(queued)
                return await queued.answer
        except TimeoutError as exc:
            raise self._failure_of(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"no answer within {time_limit:.1f}s") from exc
        finally:
            if not queued.sent:
                self._queue.remove(queued)
            self._waiting.pop(queued.call_id, None)

    async def _write_queue(self, own: _Queued) -> None:
        """Write every queued request (the write lock held), batched if the peer takes
        batches. A request the stream refused fails through ``not_sent``: raised for ``own``,
        set on the others' answers."""
        call = self._stream()
        queued, self._queue = self._queue, []
        for entry in queued:
            entry.sent = True
            self._waiting[entry.call_id] = (call, entry.answer)
        batches = self._batches
        messages = [entry.message for entry in queued]
        groups = (_batches_of(messages) if batches is not None and self._batching_on is call
                  and len(queued) > 1 else [[message] for message in messages])
        written = 0
        try:
            for group in groups:
                if len(group) == 1:
                    await call.write(group[0])
                else:
                    assert batches is not None
                    await call.write(batches.join(group))
                written += len(group)
                self._messages.inc()
                self._calls.inc(len(group))
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as exc:
            # The stream had failed before it took these requests: never sent.
            if isinstance(exc, grpc.aio.AioRpcError):
                failure = self._not_sent(exc.code(), exc.details() or "")
            else:
                failure = self._not_sent(grpc.StatusCode.UNAVAILABLE, "stream closed")
            for entry in queued[written:]:
                self._waiting.pop(entry.call_id, None)
                if entry.answer.done():
                    entry.answer.exception()  # failed by the reader too: seen here
                elif entry is not own:
                    entry.answer.set_exception(failure)
            if own in queued[written:]:
                raise failure from exc

    def _stream(self) -> Any:
        if self._call is None or self._call.done():
            if self._batches is None:
                self._call = self._open_stream()
            else:
                self._call = self._open_stream(metadata=((self._batches.metadata_key, "1"),))
            self._reader = asyncio.create_task(self._read(self._call))
        return self._call

    async def _read(self, call: Any) -> None:
        failure: Exception
        batches = self._batches
        try:
            if batches is not None:
                initial = await call.initial_metadata()
                if any(key == batches.metadata_key for key, _ in initial or ()):
                    self._batching_on = call
            while True:
                message = await call.read()
                if message is grpc.aio.EOF:
                    failure = self._failure_of(grpc.StatusCode.UNAVAILABLE, "stream ended")
                    break
                parts = batches.split(message) if batches is not None else None
                for part in (message,) if parts is None else parts:
                    call_id, answer = self._decode(part)
                    entry = self._waiting.get(call_id)
                    if entry is not None and entry[0] is call and not entry[1].done():
                        entry[1].set_result(answer)
        except grpc.aio.AioRpcError as exc:
            failure = self._failure_of(exc.code(), exc.details() or "")
        except DecodeError as exc:
            failure = self._failure_of(grpc.StatusCode.INTERNAL, f"undecodable answer: {exc}")
            call.cancel()
        except asyncio.CancelledError:
            failure = self._failure_of(grpc.StatusCode.CANCELLED, "stream closed")
        if self._call is call:
            self._call = None
        if self._batching_on is call:
            self._batching_on = None
        for sent_on, waiter in self._waiting.values():
            if sent_on is call and not waiter.done():
                waiter.set_exception(failure)
        log.debug("call stream closed: %s", failure)

    async def close(self) -> None:
        call, reader = self._call, self._reader
        self._call = None
        if call is not None:
            call.cancel()
        if reader is not None:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader


async def serve_calls(request_iterator: Any, context: Any,
                      answer: Callable[[Any], Awaitable[Any]],
                      cancel_at_end: bool = False, batches: Batches | None = None,
                      name: str = "") -> None:
    """The server side of a call stream: each request is answered by ``answer`` concurrently
    with the others, and its reply written as soon as it is ready. A call that started is
    finished even if the stream breaks meanwhile (its reply is then lost, as a unary call's
    would be); with ``cancel_at_end``, calls still running when the stream ends are cancelled
    instead, as a unary call is when its caller goes away (calls that only wait). With
    ``batches`` the stream takes batched requests (and says so in its initial metadata), and
    answers in batches a caller that takes them. ``name``: the stream's, in metrics."""
    writing = asyncio.Lock()
    pending: set[asyncio.Task[None]] = set()
    replies: list[Any] = []  # ready, waiting for the write under way
    messages = CALL_STREAM_MESSAGES.labels(name, "server")
    calls = CALL_STREAM_CALLS.labels(name, "server")
    batched = False
    if batches is not None:
        batched = any(key == batches.metadata_key
                      for key, _ in context.invocation_metadata() or ())
        await context.send_initial_metadata(((batches.metadata_key, "1"),))

    async def write_replies() -> None:
        ready = replies[:]
        replies.clear()
        for group in _batches_of(ready) if batched and len(ready) > 1 else [[r] for r in ready]:
            if len(group) == 1:
                await context.write(group[0])
            else:
                assert batches is not None
                await context.write(batches.join(group))
            messages.inc()
            calls.inc(len(group))

    async def serve(request: Any) -> None:
        reply = await answer(request)
        replies.append(reply)
        try:
            async with writing:
                if replies:  # else written with an earlier one's
                    await write_replies()
        except Exception as exc:  # noqa: BLE001 - the caller went away
            log.debug("reply not delivered: %s", exc)

    try:
        async for request in request_iterator:
            parts = batches.split(request) if batches is not None else None
            for part in (request,) if parts is None else parts:
                task = asyncio.create_task(serve(part))
                pending.add(task)
                task.add_done_callback(pending.discard)
    finally:
        if pending:
            if cancel_at_end:
                for task in pending:
                    task.cancel()
            await asyncio.shield(asyncio.gather(*pending, return_exceptions=True))
