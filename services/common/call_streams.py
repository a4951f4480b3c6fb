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
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

log = logging.getLogger(__name__)


FailureOf = Callable[[grpc.StatusCode, str], Exception]
"""Turns a failed call's status code and details into the exception its caller raises."""


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
                 not_sent: FailureOf | None = None) -> None:
        self._open_stream = open_stream
        self._failure_of = failure_of
        self._not_sent = not_sent or failure_of
        self._encode = encode
        self._decode = decode
        self._ids = itertools.count(1)
        self._call: Any = None
        self._reader: asyncio.Task[None] | None = None
        # call id -> (the stream it was sent on, its answer)
        self._waiting: dict[int, tuple[Any, asyncio.Future[Any]]] = {}
        self._writing = asyncio.Lock()

    @property
    def in_flight(self) -> int:
        return len(self._waiting)

    async def call(self, request: Any, time_limit: float) -> Any:
        """Send ``request`` (with a call id given here) and return the matching answer."""
        call_id = next(self._ids)
        message = self._encode(request, call_id)
        answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout(time_limit):
                async with self._writing:
                    call = self._stream()
                    self._waiting[call_id] = (call, answer)
                    try:
                        await call.write(message)
                    except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as exc:
                        # The stream had failed before it took the request (InvalidStateError:
                        # it ended between the check and the write): never sent.
                        self._waiting.pop(call_id, None)
                        if answer.done():
                            answer.exception()  # failed by the reader too: seen here
                        if isinstance(exc, grpc.aio.AioRpcError):
                            raise self._not_sent(exc.code(), exc.details() or "") from exc
                        raise self._not_sent(grpc.StatusCode.UNAVAILABLE,
                                             "stream closed") from exc
                return await answer
        except TimeoutError as exc:
            raise self._failure_of(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"no answer within {time_limit:.1f}s") from exc
        finally:
            self._waiting.pop(call_id, None)

    def _stream(self) -> Any:
        if self._call is None or self._call.done():
            self._call = self._open_stream()
            self._reader = asyncio.create_task(self._read(self._call))
        return self._call

    async def _read(self, call: Any) -> None:
        failure: Exception
        try:
            while True:
                message = await call.read()
                if message is grpc.aio.EOF:
                    failure = self._failure_of(grpc.StatusCode.UNAVAILABLE, "stream ended")
                    break
                call_id, answer = self._decode(message)
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
                      cancel_at_end: bool = False) -> None:
    """The server side of a call stream: each request is answered by ``answer`` concurrently
    with the others, and its reply written as soon as it is ready. A call that started is
    finished even if the stream breaks meanwhile (its reply is then lost, as a unary call's
    would be); with ``cancel_at_end``, calls still running when the stream ends are cancelled
    instead, as a unary call is when its caller goes away (calls that only wait)."""
    writing = asyncio.Lock()
    pending: set[asyncio.Task[None]] = set()

    async def serve(request: Any) -> None:
        reply = await answer(request)
        try:
            async with writing:
                await context.write(reply)
        except Exception as exc:  # noqa: BLE001 - the caller went away
            log.debug("reply not delivered: %s", exc)

    try:
        async for request in request_iterator:
            task = asyncio.create_task(serve(request))
            pending.add(task)
            task.add_done_callback(pending.discard)
    finally:
        if pending:
            if cancel_at_end:
                for task in pending:
                    task.cancel()
            await asyncio.shield(asyncio.gather(*pending, return_exceptions=True))
