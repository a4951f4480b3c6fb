"""Create a gRPC server for a service: its servicers plus health checking, server reflection
and the metrics service, which every port serves (so grpcurl ``list``/``describe`` work).

``create_server`` binds and starts; tests use port 0 and read the bound port back. It is the one
place a service's gRPC port is bound: with mutual TLS when the service has internal TLS
material (client certificates required, see :mod:`services.common.tls`), else plaintext, on a
loopback address only.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from kbroker.metrics.v1 import metrics_pb2, metrics_pb2_grpc

from .channels import SERVER_OPTIONS
from .metrics import METRICS_ENABLED, MetricsInterceptor, MetricsServicer
from .tls import PLAINTEXT, InternalTls, require_plaintext_allowed


@dataclass(frozen=True, slots=True)
class ServiceBinding:
    """One gRPC service to serve: its full name (for health and reflection), the generated
    ``add_XServicer_to_server`` function and the servicer instance."""

    full_name: str
    add_to_server: Callable[[object, grpc.aio.Server], None]
    servicer: object


class StoppingHealthServicer(HealthServicer):
    """gRPC's health service, except that a watch ends once the server enters its graceful
    shutdown (after its watcher was told NOT_SERVING): an open watch would otherwise hold the
    server's stop for the whole grace period. The watcher sees the stream end and the port
    close soon after."""

    def __init__(self) -> None:
        super().__init__()
        self._stopping = asyncio.Event()

    async def enter_graceful_shutdown(self) -> None:
        await super().enter_graceful_shutdown()
        self._stopping.set()

    async def Watch(self, request: health_pb2.HealthCheckRequest,
                    context: grpc.aio.ServicerContext) -> None:
        watching = asyncio.ensure_future(super().Watch(request, context))
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({watching, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if not watching.done():
                # Let the last status (NOT_SERVING) go out, then end the stream.
                await asyncio.wait({watching}, timeout=_LAST_STATUS_WAIT_S)
        finally:
            stopping.cancel()
            if not watching.done():
                watching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watching


# How long a watch that is ended by a graceful shutdown gets to send its last status.
_LAST_STATUS_WAIT_S = 0.05


async def create_server(
    service: str,
    bindings: Sequence[ServiceBinding],
    address: str = "127.0.0.1:0",
    instance: str = "",
    tls: InternalTls = PLAINTEXT,
) -> tuple[grpc.aio.Server, int, HealthServicer]:
    """Start a server for ``service`` on ``address``; returns (server, bound port, health).

    Health reports SERVING for the overall server ("") and for each binding's name. Raises
    PlaintextNotAllowedError without ``tls`` on a non-loopback address (before binding anything),
    InternalTlsError when the TLS files cannot be read.
    """
    require_plaintext_allowed(tls, address, f"{service} gRPC server on")
    credentials = tls.server_credentials() if tls.enabled else None
    server = grpc.aio.server(
        options=SERVER_OPTIONS, interceptors=[MetricsInterceptor()] if METRICS_ENABLED else [])
    health = StoppingHealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    metrics_pb2_grpc.add_MetricsServicer_to_server(MetricsServicer(service, instance), server)
    names = [b.full_name for b in bindings]
    for binding in bindings:
        binding.add_to_server(binding.servicer, server)
    reflection.enable_server_reflection(
        [
            *names,
            metrics_pb2.DESCRIPTOR.services_by_name["Metrics"].full_name,
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            reflection.SERVICE_NAME,
        ],
        server,
    )
    if credentials is not None:
        port = server.add_secure_port(address, credentials)
    else:
        port = server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"{service}: cannot bind gRPC port {address}")
    await server.start()
    for name in ["", *names]:
        await health.set(name, health_pb2.HealthCheckResponse.SERVING)
    return server, port, health
