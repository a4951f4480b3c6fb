"""``kbroker.handler.v1.KafkaHandlerStream``: KafkaHandler calls multiplexed over one stream.

Each ``HandlerCall`` is served by the same servicer method a unary call reaches, with a
small stand-in for the gRPC context that carries the call's request metadata in and its
trailing metadata out, so the API code cannot tell the two paths apart. Calls run
concurrently (:func:`services.common.call_streams.serve_calls`). An unknown
method is answered UNIMPLEMENTED, a request that does not parse INVALID_ARGUMENT, a call the
servicer aborts with its status, and a servicer that raises INTERNAL (the servicer itself
turns API failures into Kafka errors).

The stream's messages stay bytes here: requests and responses are read and written around their
envelopes without extra copies (:mod:`services.common.envelopes`), so the stream is registered
by :func:`add_exchange_to_server` rather than the generated function, which would (de)serialize
every envelope whole.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import grpc
from google.protobuf import message_factory
from google.protobuf.message import DecodeError

from kbroker.handler.v1 import handler_pb2, handler_pb2_grpc, kafka_handler_pb2
from kbroker.kafka.v1 import kafka_pb2
from services.common import payloads
from services.common.call_streams import serve_calls
from services.common.envelopes import (
    EXCHANGE_BATCHES,
    decode_handler_call,
    encode_handler_reply,
)
from services.common.file_records import METADATA_KEY as FILE_RECORDS_METADATA_KEY
from services.common.file_records import SpooledRecords, SpoolReads, is_local
from services.common.payloads import Detached, PayloadPath

STREAM_SERVICE_NAME = handler_pb2.DESCRIPTOR.services_by_name["KafkaHandlerStream"].full_name

log = logging.getLogger(__name__)

Method = Callable[[Any, Any], Awaitable[Any]]

# Requests whose record batches are read as views of the received call, beside the message.
REQUEST_RECORDS = {
    "Produce": PayloadPath(kafka_pb2.ProduceRequest.DESCRIPTOR,
                           "topic_data.partition_data.records"),
}


class CallAbortedError(Exception):
    """A servicer method failed its call on purpose (:meth:`CallContext.abort`)."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


class CallContext:
    """What the servicer methods use of a ``grpc.aio.ServicerContext``, for one call: its
    own metadata, and the stream's peer (address and credentials, which say whether the
    caller may name a principal); and beyond it, the request's record batches when they came
    beside it, and that the answer's may stay beside it (``detached_payloads``: the reply is
    written around them)."""

    __slots__ = ("_auth", "_metadata", "_peer", "record_payloads", "trailing_metadata")

    detached_payloads = True

    def __init__(self, metadata: Sequence[tuple[str, str]], peer: str = "",
                 auth: Mapping[str, Any] | None = None,
                 record_payloads: Sequence[Any] | None = None) -> None:
        self._metadata = tuple(metadata)
        self._peer = peer
        self._auth = auth or {}
        self.record_payloads = record_payloads
        self.trailing_metadata: tuple[tuple[str, str], ...] = ()

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def peer(self) -> str:
        return self._peer

    def auth_context(self) -> Mapping[str, Any]:
        return self._auth

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        """Fail the call with ``code`` (as ``grpc.aio.ServicerContext.abort``)."""
        raise CallAbortedError(code, details)

    def set_trailing_metadata(self, metadata: Sequence[tuple[str, str]]) -> None:
        self.trailing_metadata = tuple(metadata)


class ExchangeServicer(handler_pb2_grpc.KafkaHandlerStreamServicer):
    def __init__(self, servicer: object) -> None:
        # Every KafkaHandler method of ``servicer``, with its request message class.
        service = kafka_handler_pb2.DESCRIPTOR.services_by_name["KafkaHandler"]
        self._methods: dict[str, tuple[Method, Any]] = {
            method.name: (getattr(servicer, method.name),
                          message_factory.GetMessageClass(method.input_type))
            for method in service.methods}

    async def Exchange(self, request_iterator, context):
        # The peer is the stream's: read once, for every call it carries.
        peer, auth = context.peer(), dict(context.auth_context() or {})
        await serve_calls(request_iterator, context,
                          lambda data: self.serve_one(data, peer, auth),
                          batches=EXCHANGE_BATCHES, name="exchange")

    async def serve_one(self, data: bytes, peer: str = "",
                        auth: Mapping[str, Any] | None = None) -> bytes:
        """Answer one serialized ``HandlerCall`` (arrived on a stream from ``peer`` with the
        credentials ``auth``) with a serialized ``HandlerReply``."""
        try:
            call, request_bytes = decode_handler_call(data)
        except DecodeError as exc:
            return _failed(0, grpc.StatusCode.INVALID_ARGUMENT, f"bad call envelope: {exc}")
        entry = self._methods.get(call.method)
        if entry is None:
            return _failed(call.call_id, grpc.StatusCode.UNIMPLEMENTED,
                           f"no handler method {call.method!r}")
        method, request_type = entry
        path = REQUEST_RECORDS.get(call.method)
        records = None
        try:
            if path is None:
                request = request_type.FromString(request_bytes)
            else:
                request, records = payloads.parse_message(request_bytes, request_type, path)
        except DecodeError as exc:
            return _failed(call.call_id, grpc.StatusCode.INVALID_ARGUMENT,
                           f"{call.method}: bad request: {exc}")
        metadata = [(m.key, m.value) for m in call.metadata]
        reads = None
        if call.file_records:
            if path is None:
                return _failed(call.call_id, grpc.StatusCode.INVALID_ARGUMENT,
                               f"{call.method}: file records in a call that takes none")
            if not is_local(dict(metadata).get(FILE_RECORDS_METADATA_KEY, "")):
                # Another host's spool: nothing done, the caller sends the batches carried.
                return encode_handler_reply(handler_pb2.HandlerReply(
                    call_id=call.call_id, request_files_unreadable=True,
                    file_records_settled=True))
            records = list(payloads.take(request, path) if records is None else records)
            reads = SpoolReads()
            for files in call.file_records:
                if files.payload >= len(records) or records[files.payload] is None:
                    return _failed(call.call_id, grpc.StatusCode.INVALID_ARGUMENT,
                                   f"{call.method}: file records for payload {files.payload}")
                records[files.payload] = SpooledRecords(
                    records[files.payload], files.path, files.inode, files.position,
                    files.size, reads)
        context = CallContext(metadata, peer, auth, records)
        try:
            response = await method(request, context)
        except CallAbortedError as exc:
            return _failed(call.call_id, exc.code, exc.details)
        except Exception as exc:
            log.exception("%s failed", call.method)
            return _failed(call.call_id, grpc.StatusCode.INTERNAL, f"{call.method}: {exc}")
        # Answered: the spooled ranges may be written over unless a read of them is still out.
        reply = handler_pb2.HandlerReply(call_id=call.call_id, file_records_settled=(
            reads is not None and not reads.unsettled))
        for key, value in context.trailing_metadata:
            reply.trailing_metadata.add(key=key, value=str(value))
        try:
            if isinstance(response, Detached):
                for leaf, files in response.files:
                    reply.file_records.add(payload=leaf, path=files.path, inode=files.inode,
                                           position=files.position, size=files.size)
                return encode_handler_reply(reply, response.serialized())
            return encode_handler_reply(reply, response.SerializeToString())
        except Exception as exc:
            # Answered all the same: an unanswered call would hold its caller to its deadline.
            log.exception("%s: cannot encode the answer", call.method)
            return _failed(call.call_id, grpc.StatusCode.INTERNAL, f"{call.method}: {exc}")


def _failed(call_id: int, code: grpc.StatusCode, details: str) -> bytes:
    return encode_handler_reply(handler_pb2.HandlerReply(
        call_id=call_id, status_code=code.value[0], status_details=details))


def add_exchange_to_server(servicer: ExchangeServicer, server: grpc.aio.Server) -> None:
    """Serve ``KafkaHandlerStream.Exchange`` with bytes in and out (no (de)serializers)."""
    handler = grpc.stream_stream_rpc_method_handler(servicer.Exchange)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(STREAM_SERVICE_NAME, {"Exchange": handler}),))
