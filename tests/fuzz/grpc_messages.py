"""The internal gRPC services as fuzz targets: arbitrary (but parseable) protobuf requests,
generated from the message descriptors, sent to every unary RPC of the log node, purgatory,
replicator and handler services of a real in-process cluster (gRPC servers on 127.0.0.1 port
0, tests/handler/harness.py) running in a thread of its own.

A crash is a call that ends in UNKNOWN or INTERNAL (an exception escaped the servicer), or a
traceback logged while serving (the servicers turn unexpected exceptions into
UNKNOWN_SERVER_ERROR with ``log.exception``; each is a bug). Refusals the services choose
(INVALID_ARGUMENT, Kafka error codes, a deadline for a request that waits) are fine."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor
from hypothesis import strategies as st

from kbroker.handler.v1 import kafka_handler_pb2
from kbroker.log.v1 import log_pb2
from kbroker.purgatory.v1 import purgatory_pb2
from kbroker.replicator.v1 import replicator_pb2

from ..handler.harness import FRONTEND_METADATA, running_cluster
from .mutations import mutated
from .record_batches import valid_batches

CALL_TIMEOUT = 1.0
_MAX_DEPTH = 3
# Strings a service knows (the fuzz topic, internal topics, a group) mixed with any text.
TOPIC = "fuzz"
_NAMES = ("", TOPIC, "__consumer_offsets", "__transaction_state", "group", "txn", "*",
          "cleanup.policy", "compact", "User:alice", "0")
_INT32 = (0, 1, -1, 2, 3, 100, 1000, 0x7FFFFFFF, -0x80000000)
_INT64 = (*_INT32, 1 << 40, (1 << 63) - 1, -(1 << 63))

_SCALARS: dict[int, st.SearchStrategy[Any]] = {
    FieldDescriptor.TYPE_INT32: st.sampled_from(_INT32) | st.integers(-(1 << 31), (1 << 31) - 1),
    FieldDescriptor.TYPE_SINT32: st.sampled_from(_INT32),
    FieldDescriptor.TYPE_SFIXED32: st.sampled_from(_INT32),
    FieldDescriptor.TYPE_INT64: st.sampled_from(_INT64) | st.integers(-(1 << 63), (1 << 63) - 1),
    FieldDescriptor.TYPE_SINT64: st.sampled_from(_INT64),
    FieldDescriptor.TYPE_SFIXED64: st.sampled_from(_INT64),
    FieldDescriptor.TYPE_UINT32: st.sampled_from((0, 1, 2, 100, (1 << 32) - 1)),
    FieldDescriptor.TYPE_FIXED32: st.sampled_from((0, 1, (1 << 32) - 1)),
    FieldDescriptor.TYPE_UINT64: st.sampled_from((0, 1, 2, 100, (1 << 64) - 1)),
    FieldDescriptor.TYPE_FIXED64: st.sampled_from((0, 1, (1 << 64) - 1)),
    FieldDescriptor.TYPE_BOOL: st.booleans(),
    FieldDescriptor.TYPE_DOUBLE: st.floats(),
    FieldDescriptor.TYPE_FLOAT: st.floats(width=32),
    FieldDescriptor.TYPE_STRING: st.sampled_from(_NAMES) | st.text(max_size=8),
}


def _bytes() -> st.SearchStrategy[bytes]:
    return (st.sampled_from(valid_batches()) | mutated(valid_batches())
            | st.binary(max_size=24))


def messages(descriptor: Descriptor, depth: int = 0) -> st.SearchStrategy[Any]:
    """Messages of ``descriptor``'s type with any subset of fields set, nested messages to a
    depth of three, repeated fields and maps of up to three entries."""
    cls = message_factory.GetMessageClass(descriptor)
    if depth > _MAX_DEPTH:
        return st.just(cls())
    fields = {field.name: _field(field, depth) for field in descriptor.fields}
    return st.fixed_dictionaries({}, optional=fields).map(lambda values: cls(**values))


def _field(field: FieldDescriptor, depth: int) -> st.SearchStrategy[Any]:
    repeated = field.is_repeated
    if field.type == FieldDescriptor.TYPE_MESSAGE and field.message_type.GetOptions().map_entry:
        key, value = (field.message_type.fields_by_name[n] for n in ("key", "value"))
        return st.dictionaries(_single(key, depth + 1), _single(value, depth + 1), max_size=3)
    one = _single(field, depth)
    return st.lists(one, max_size=3) if repeated else one


def _single(field: FieldDescriptor, depth: int) -> st.SearchStrategy[Any]:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return st.deferred(lambda: messages(field.message_type, depth + 1))
    if field.type == FieldDescriptor.TYPE_ENUM:
        return st.sampled_from([v.number for v in field.enum_type.values] + [99, -1])
    if field.type == FieldDescriptor.TYPE_BYTES:
        return _bytes()
    return _SCALARS[field.type]


SERVICES = {
    "log": log_pb2.DESCRIPTOR.services_by_name["LogService"],
    "purgatory": purgatory_pb2.DESCRIPTOR.services_by_name["Purgatory"],
    "replicator": replicator_pb2.DESCRIPTOR.services_by_name["Replicator"],
    "handler": kafka_handler_pb2.DESCRIPTOR.services_by_name["KafkaHandler"],
}


def unary_methods(service: str) -> list[MethodDescriptor]:
    return [m for m in SERVICES[service].methods
            if not m.client_streaming and not m.server_streaming]


def calls(service: str) -> st.SearchStrategy[tuple[str, Any]]:
    """(the name of an RPC of ``service``, a request for it)."""
    return st.one_of(*(st.tuples(st.just(m.name), messages(m.input_type))
                       for m in unary_methods(service)))


class _Tracebacks(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info:
            self.records.append(record)


class FuzzCluster:
    """A whole cluster (one log node) serving in a thread; :meth:`check_call` sends one
    request and fails on a crash."""

    def __init__(self, ports: dict[str, int], tracebacks: _Tracebacks) -> None:
        self._channels = {name: grpc.insecure_channel(f"127.0.0.1:{port}")
                          for name, port in ports.items()}
        self._tracebacks = tracebacks

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()

    def call(self, service: str, name: str, request: Any) -> Any:
        method = SERVICES[service].methods_by_name[name]
        response_cls = message_factory.GetMessageClass(method.output_type)
        rpc = self._channels[service].unary_unary(
            f"/{SERVICES[service].full_name}/{method.name}",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=response_cls.FromString)
        metadata = FRONTEND_METADATA if service == "handler" else None
        return rpc(request, timeout=CALL_TIMEOUT, metadata=metadata)

    def check_call(self, service: str, name: str, request: Any) -> None:
        del self._tracebacks.records[:]
        try:
            self.call(service, name, request)
        except grpc.RpcError as e:
            code = e.code()  # type: ignore[attr-defined]
            assert code not in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL), (
                f"{service}.{name} crashed: {code} {e.details()}")  # type: ignore[attr-defined]
        crashes = [f"{r.name}: {r.getMessage()}: {r.exc_info[1]!r}"
                   for r in self._tracebacks.records if r.exc_info]
        assert not crashes, f"{service}.{name} logged a traceback: {crashes}"


@contextlib.contextmanager
def fuzz_cluster(time_limit: float = 60.0) -> Iterator[FuzzCluster]:
    """A running cluster with topic ``fuzz`` (2 partitions), stopped on exit."""
    ready = threading.Event()
    stop: asyncio.Event | None = None
    loop: asyncio.AbstractEventLoop | None = None
    ports: dict[str, int] = {}
    failure: list[BaseException] = []

    async def serve(data: Path) -> None:
        nonlocal stop, loop
        stop, loop = asyncio.Event(), asyncio.get_running_loop()
        async with running_cluster(data, nodes=1) as cluster:
            await cluster.create_topic(TOPIC, partitions=2)
            ports.update(log=cluster.log_nodes[0].port, purgatory=cluster.purgatory.port,
                         replicator=cluster.replicator.port, handler=cluster.handler.port)
            ready.set()
            await stop.wait()

    def run() -> None:
        with tempfile.TemporaryDirectory(prefix="kbroker-fuzz-") as data:
            try:
                asyncio.run(serve(Path(data)))
            except BaseException as e:  # noqa: BLE001 - reported to the test
                failure.append(e)
            finally:
                ready.set()

    tracebacks = _Tracebacks()
    logging.getLogger().addHandler(tracebacks)
    thread = threading.Thread(target=run, name="fuzz-cluster", daemon=True)
    thread.start()
    try:
        assert ready.wait(time_limit), "the cluster did not start"
        if failure:
            raise failure[0]
        cluster = FuzzCluster(ports, tracebacks)
        try:
            yield cluster
        finally:
            cluster.close()
    finally:
        if loop is not None and stop is not None:
            loop.call_soon_threadsafe(stop.set)
        thread.join(time_limit)
        logging.getLogger().removeHandler(tracebacks)
        assert not thread.is_alive(), "the cluster did not stop"
