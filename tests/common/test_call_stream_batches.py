"""Calls and answers batched on a call stream (``services.common.call_streams``), on real gRPC
servers on port 0 speaking bytes: requests that are ready together go in one message once the
server said it takes batches, answers the same way when the caller asked for them, a peer that
does neither gets one message per call, large messages go alone, and a call is never lost or
sent late; the messages and the calls they carried are counted."""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import AsyncIterator

import grpc
import pytest
from google.protobuf.message import DecodeError
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import REGISTRY

from services.common.call_streams import BATCHED_MESSAGE_MAX_BYTES, CallStream, serve_calls
from services.common.channels import SERVER_OPTIONS, insecure_channel
from services.common.envelopes import APPEND_BATCHES, EXCHANGE_BATCHES, protobuf_batches

BATCHES = protobuf_batches(15)
METHOD = "/test.Echo/Stream"
TIMEOUT = 30.0


def _encode(payload: bytes, call_id: int) -> bytes:
    # A message of the test's own: the call id (8 bytes), then the payload. It begins with a
    # byte other than the batch field's key (0x7a) as long as call ids stay small.
    return struct.pack(">Q", call_id) + payload


def _decode(message: bytes | memoryview) -> tuple[int, bytes]:
    return struct.unpack(">Q", message[:8])[0], bytes(message[8:])


class EchoServer:
    """Answers each call with its payload reversed, after ``delay`` seconds; records every
    message it received and wrote."""

    def __init__(self, batches: bool, delay: float = 0.0, name: str = "echo") -> None:
        self.batches = BATCHES if batches else None
        self.name = name
        self.delay = delay
        self.received: list[bytes] = []
        self.written: list[bytes] = []
        self.server: grpc.aio.Server | None = None
        self.port = 0

    async def _stream(self, request_iterator, context) -> None:
        async def recorded() -> AsyncIterator[bytes]:
            async for message in request_iterator:
                self.received.append(message)
                yield message

        class Recording:
            def __init__(self, outer: EchoServer) -> None:
                self._outer = outer

            async def write(self, message: bytes) -> None:
                self._outer.written.append(message)
                await context.write(message)

            def __getattr__(self, name: str):
                return getattr(context, name)

        async def answer(message: memoryview) -> bytes:
            call_id, payload = _decode(message)
            await asyncio.sleep(self.delay)
            return _encode(payload[::-1], call_id)

        await serve_calls(recorded(), Recording(self), answer, batches=self.batches,
                          name=self.name)

    async def __aenter__(self) -> EchoServer:
        self.server = grpc.aio.server(options=SERVER_OPTIONS)
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            "test.Echo", {"Stream": grpc.stream_stream_rpc_method_handler(self._stream)}),))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self.server is not None
        await self.server.stop(0)


def _failure(code: grpc.StatusCode, details: str) -> Exception:
    return RuntimeError(f"{code.name}: {details}")


@contextlib.asynccontextmanager
async def _echo(server_batches: bool = True, client_batches: bool = True, delay: float = 0.0,
                name: str = "echo") -> AsyncIterator[tuple[EchoServer, CallStream]]:
    """An echo server and a call stream to it (both named ``name`` in metrics)."""
    async with EchoServer(server_batches, delay, name) as server:
        channel = insecure_channel(f"127.0.0.1:{server.port}")
        stream = CallStream(channel.stream_stream(METHOD), _failure, encode=_encode,
                            decode=_decode, batches=BATCHES if client_batches else None,
                            name=name)
        try:
            yield server, stream
        finally:
            await stream.close()
            await channel.close()


def _run(scenario) -> None:
    asyncio.run(asyncio.wait_for(scenario(), TIMEOUT))


async def _calls(stream: CallStream, payloads: list[bytes]) -> list[bytes]:
    return list(await asyncio.gather(*(stream.call(p, 10.0) for p in payloads)))


def _is_batch(message: bytes) -> bool:
    return BATCHES.split(message) is not None


@pytest.mark.parametrize("client_batches, server_batches", [
    (True, True), (True, False), (False, True), (False, False)])
def test_calls_are_batched_only_where_both_sides_take_batches(
        client_batches: bool, server_batches: bool) -> None:
    async def scenario() -> None:
        async with _echo(server_batches, client_batches, delay=0.01) as (server, stream):
            await stream.call(b"first", 10.0)  # the stream is open and negotiated
            payloads = [f"call {i}".encode() for i in range(200)]
            answers = await _calls(stream, payloads)
            assert answers == [p[::-1] for p in payloads]
            # Requests in batches only to a server that takes them.
            requests_batched = any(_is_batch(m) for m in server.received)
            assert requests_batched == (client_batches and server_batches)
            # Answers in batches only to a caller that asked for them.
            answers_batched = any(_is_batch(m) for m in server.written)
            assert answers_batched == (client_batches and server_batches)
            if client_batches and server_batches:
                assert len(server.received) < 100
                assert len(server.written) < 100
            else:
                assert len(server.received) == len(server.written) == 201

    _run(scenario)


def test_a_lone_call_goes_as_itself() -> None:
    async def scenario() -> None:
        async with _echo() as (server, stream):
            for _ in range(5):
                assert await stream.call(b"abc", 10.0) == b"cba"
            assert [_is_batch(m) for m in server.received] == [False] * 5
            assert [_is_batch(m) for m in server.written] == [False] * 5

    _run(scenario)


def test_large_messages_go_alone() -> None:
    async def scenario() -> None:
        async with _echo(delay=0.01) as (server, stream):
            await stream.call(b"first", 10.0)
            large = [bytes([i]) * BATCHED_MESSAGE_MAX_BYTES for i in range(1, 11)]
            small = [f"small {i}".encode() for i in range(100)]
            interleaved = [p for pair in zip(large, small[:10], strict=True) for p in pair]
            payloads = interleaved + small[10:]
            answers = await _calls(stream, payloads)
            assert answers == [p[::-1] for p in payloads]
            for messages in (server.received, server.written):
                assert any(_is_batch(m) for m in messages)
                for message in messages:
                    parts = BATCHES.split(message) or []
                    assert all(len(p) < BATCHED_MESSAGE_MAX_BYTES for p in parts)
                alone = [m for m in messages if len(m) >= BATCHED_MESSAGE_MAX_BYTES]
                assert len(alone) == 10 and not any(_is_batch(m) for m in alone)

    _run(scenario)


class _HeldStream:
    """A stream whose writes wait until released; the server takes batches."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.written: list[bytes] = []
        self.refuse = False

    async def initial_metadata(self):
        return ((BATCHES.metadata_key, "1"),)

    async def write(self, message: bytes) -> None:
        await self.release.wait()
        if self.refuse:
            raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(),
                                       grpc.aio.Metadata(), "Socket closed")
        self.written.append(message)

    async def read(self):
        await asyncio.Event().wait()  # never answers

    def done(self) -> bool:
        return False

    def cancel(self) -> None:
        pass


def test_a_call_out_of_time_while_queued_is_never_sent() -> None:
    async def scenario() -> None:
        held = _HeldStream()
        stream = CallStream(lambda metadata=None: held, _failure, encode=_encode,
                            decode=_decode, batches=BATCHES)
        try:
            first = asyncio.ensure_future(stream.call(b"first", 10.0))
            await asyncio.sleep(0.05)  # its write is under way, held
            with pytest.raises(RuntimeError, match="DEADLINE_EXCEEDED"):
                await stream.call(b"late", 0.1)
            third = asyncio.ensure_future(stream.call(b"third", 10.0))
            await asyncio.sleep(0.05)
            held.release.set()
            await asyncio.sleep(0.05)
            sent = [_decode(m)[1] for message in held.written
                    for m in (BATCHES.split(message) or [message])]
            assert sent == [b"first", b"third"]
            first.cancel()
            third.cancel()
            await asyncio.gather(first, third, return_exceptions=True)
        finally:
            await stream.close()

    _run(scenario)


def test_every_call_of_a_refused_batch_fails_as_not_sent() -> None:
    async def scenario() -> None:
        held = _HeldStream()
        held.refuse = True

        def not_sent(code: grpc.StatusCode, details: str) -> Exception:
            return LookupError(f"not sent: {details}")

        stream = CallStream(lambda metadata=None: held, _failure, encode=_encode,
                            decode=_decode, not_sent=not_sent, batches=BATCHES)
        try:
            calls = [asyncio.ensure_future(stream.call(f"{i}".encode(), 10.0))
                     for i in range(5)]
            await asyncio.sleep(0.05)
            held.release.set()
            outcomes = await asyncio.gather(*calls, return_exceptions=True)
            assert all(isinstance(o, LookupError) for o in outcomes), outcomes
            assert stream.in_flight == 0
        finally:
            await stream.close()

    _run(scenario)


def test_batches_split_as_they_were_joined() -> None:
    for batches in (BATCHES, EXCHANGE_BATCHES, APPEND_BATCHES):
        messages = [b"\x08\x01", b"", b"x" * 300, bytes(range(256))]
        joined = batches.join(messages)
        assert [bytes(m) for m in batches.split(joined)] == messages
        assert batches.split(b"\x08\x01\x12\x00") is None  # one message, not a batch
        assert batches.split(b"") is None
        with pytest.raises(DecodeError):
            batches.split(joined[:-1])  # truncated
        with pytest.raises(DecodeError):
            batches.split(joined + b"\x08\x01")  # another field in a batch


def test_the_messages_and_the_calls_they_carried_are_counted() -> None:
    def counted(side: str) -> tuple[float, float]:
        labels = {"stream": "echo-counted", "side": side}
        return (REGISTRY.get_sample_value("kbroker_call_stream_messages_total", labels) or 0.0,
                REGISTRY.get_sample_value("kbroker_call_stream_calls_total", labels) or 0.0)

    async def scenario() -> None:
        async with _echo(delay=0.01, name="echo-counted") as (server, stream):
            await stream.call(b"first", 10.0)
            await _calls(stream, [f"{i}".encode() for i in range(100)])
        assert counted("caller") == (len(server.received), 101)
        assert counted("server") == (len(server.written), 101)
        assert counted("caller")[0] < 50

    _run(scenario)


@given(st.lists(st.binary(max_size=300), min_size=1, max_size=20),
       st.integers(min_value=1, max_value=2**29 - 1))
def test_any_messages_split_as_they_were_joined(messages: list[bytes], field: int) -> None:
    batches = protobuf_batches(field)
    assert [bytes(m) for m in batches.split(batches.join(messages))] == messages
