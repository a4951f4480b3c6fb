"""Every service's gRPC server: health, reflection, the Metrics service and gRPC server metrics
for unary and client-streaming calls, on a real server on port 0."""

from __future__ import annotations

import asyncio

from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from kbroker.metrics.v1 import metrics_pb2, metrics_pb2_grpc
from kbroker.purgatory.v1 import purgatory_pb2, purgatory_pb2_grpc
from services.common.channels import insecure_channel
from services.common.metrics import GRPC_HANDLED, GRPC_STARTED
from services.common.runtime import tune_allocator
from services.common.server import ServiceBinding, create_server

SERVICE = "kbroker.purgatory.v1.Purgatory"


class Counting(purgatory_pb2_grpc.PurgatoryServicer):
    def __init__(self) -> None:
        self.reported = 0

    async def CheckAndComplete(self, request, context):
        self.reported += len(request.keys)
        return purgatory_pb2.CheckAndCompleteResponse(completed=0)

    async def ReportProgress(self, request_iterator, context):
        async for request in request_iterator:
            self.reported += len(request.keys)
        return purgatory_pb2.CheckAndCompleteResponse(completed=0)


def handled(method: str, kind: str) -> float:
    return GRPC_HANDLED.labels(SERVICE, method, kind, "OK")._value.get()


def test_server_serves_health_reflection_metrics_and_counts_calls():
    async def main() -> None:
        servicer = Counting()
        server, port, _ = await create_server("test", [ServiceBinding(
            SERVICE, purgatory_pb2_grpc.add_PurgatoryServicer_to_server, servicer)])
        channel = insecure_channel(f"127.0.0.1:{port}")
        try:
            for name in ("", SERVICE):
                reply = await health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(service=name))
                assert reply.status == health_pb2.HealthCheckResponse.SERVING

            stream = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
            listed = {s.name async for answer in stream
                      for s in answer.list_services_response.service}
            assert {SERVICE, "kbroker.metrics.v1.Metrics", "grpc.health.v1.Health"} <= listed

            unary_before = handled("CheckAndComplete", "unary")
            stream_before = handled("ReportProgress", "client_stream")
            started_before = GRPC_STARTED.labels(SERVICE, "ReportProgress", "client_stream")
            started_before = started_before._value.get()
            stub = purgatory_pb2_grpc.PurgatoryStub(channel)
            state = purgatory_pb2.KeyState(key="t-0", position=1)
            await stub.CheckAndComplete(purgatory_pb2.CheckAndCompleteRequest(keys=[state]))
            call = stub.ReportProgress()
            for _ in range(3):
                await call.write(purgatory_pb2.CheckAndCompleteRequest(keys=[state]))
            await call.done_writing()
            await call
            assert servicer.reported == 4
            assert handled("CheckAndComplete", "unary") == unary_before + 1
            assert handled("ReportProgress", "client_stream") == stream_before + 1
            assert GRPC_STARTED.labels(SERVICE, "ReportProgress", "client_stream")._value.get() \
                == started_before + 1

            snapshot = await metrics_pb2_grpc.MetricsStub(channel).Snapshot(
                metrics_pb2.SnapshotRequest(prefixes=["grpc_server_handled"]))
            assert [f.name for f in snapshot.families] == ["grpc_server_handled"]
            assert any(s.labels.get("grpc_method") == "ReportProgress"
                       for s in snapshot.families[0].samples)
        finally:
            await channel.close()
            await server.stop(0)

    asyncio.run(asyncio.wait_for(main(), 30))


def test_allocator_tuning_applies_on_glibc():
    assert tune_allocator() is True
