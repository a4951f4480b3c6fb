"""Metrics, in one place: the process's Prometheus registry, its HTTP exposition, the gRPC
``Metrics`` service over the same registry, and gRPC server metrics in the usual names
(grpc_server_started_total, grpc_server_handled_total, grpc_server_handling_seconds).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator

import grpc
from prometheus_client import REGISTRY, Counter, Histogram, start_http_server

from kbroker.metrics.v1 import metrics_pb2, metrics_pb2_grpc

LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)

GRPC_STARTED = Counter(
    "grpc_server_started_total", "RPCs started on the server.",
    ["grpc_service", "grpc_method", "grpc_type"],
)
GRPC_HANDLED = Counter(
    "grpc_server_handled_total", "RPCs completed on the server, by status code.",
    ["grpc_service", "grpc_method", "grpc_type", "grpc_code"],
)
GRPC_SECONDS = Histogram(
    "grpc_server_handling_seconds", "Time to handle an RPC on the server.",
    ["grpc_service", "grpc_method", "grpc_type"], buckets=LATENCY_BUCKETS,
)


def serve_prometheus(port: int, host: str = "127.0.0.1") -> int:
    """Serve Prometheus text on http://host:port/metrics; port 0 picks one. Returns the port."""
    server, _thread = start_http_server(port, addr=host)
    return int(server.server_port)


class MetricsServicer(metrics_pb2_grpc.MetricsServicer):
    """gRPC view of this process's Prometheus registry."""

    def __init__(self, service: str, instance: str) -> None:
        self._service = service
        self._instance = instance

    async def Snapshot(self, request, context):
        return snapshot(self._service, self._instance, list(request.prefixes))


def snapshot(service: str, instance: str, prefixes: list[str]) -> metrics_pb2.MetricsSnapshot:
    out = metrics_pb2.MetricsSnapshot(
        service=service, instance=instance, timestamp_ms=int(time.time() * 1000)
    )
    for family in REGISTRY.collect():
        if prefixes and not any(family.name.startswith(p) for p in prefixes):
            continue
        fam = out.families.add(name=family.name, type=family.type, help=family.documentation)
        for s in family.samples:
            fam.samples.add(name=s.name, labels=dict(s.labels), value=float(s.value))
    return out


def _split_method(full: str) -> tuple[str, str]:
    # "/package.Service/Method"
    _, service, method = full.split("/", 2)
    return service, method


def grpc_server_interceptor(service_name: str) -> grpc.aio.ServerInterceptor:
    return _MetricsInterceptor()


@contextlib.contextmanager
def _observed(labels: tuple[str, str, str], context: grpc.aio.ServicerContext,
              failure_code: str) -> Iterator[None]:
    """Count and time one RPC under ``labels``; its code is the context's, or ``failure_code``
    when the handler raised without setting one."""
    GRPC_STARTED.labels(*labels).inc()
    start = time.perf_counter()
    failed = False
    try:
        yield
    except BaseException:
        failed = True
        raise
    finally:
        code = _code_of(context, failure_code if failed else "OK")
        GRPC_HANDLED.labels(*labels, code).inc()
        GRPC_SECONDS.labels(*labels).observe(time.perf_counter() - start)


class _MetricsInterceptor(grpc.aio.ServerInterceptor):
    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None:
            return handler
        service, method = _split_method(details.method)
        codec = {"request_deserializer": handler.request_deserializer,
                 "response_serializer": handler.response_serializer}
        if handler.unary_unary is not None:
            unary_inner = handler.unary_unary
            unary_labels = (service, method, "unary")

            async def unary(request, context):
                with _observed(unary_labels, context, "UNKNOWN"):
                    return await unary_inner(request, context)

            return grpc.unary_unary_rpc_method_handler(unary, **codec)
        if handler.unary_stream is not None:
            stream_inner = handler.unary_stream
            stream_labels = (service, method, "server_stream")

            async def server_stream(request, context):
                with _observed(stream_labels, context, "CANCELLED"):
                    async for item in stream_inner(request, context):
                        yield item

            return grpc.unary_stream_rpc_method_handler(server_stream, **codec)
        if handler.stream_unary is not None:
            client_inner = handler.stream_unary
            client_labels = (service, method, "client_stream")

            async def client_stream(request_iterator, context):
                with _observed(client_labels, context, "CANCELLED"):
                    return await client_inner(request_iterator, context)

            return grpc.stream_unary_rpc_method_handler(client_stream, **codec)
        return handler


def _code_of(context: grpc.aio.ServicerContext, default: str) -> str:
    try:
        code = context.code()
    except Exception:  # noqa: BLE001 - the context may already be finished
        code = None
    if code is None:
        return default
    if isinstance(code, grpc.StatusCode):
        return code.name
    return str(code)
