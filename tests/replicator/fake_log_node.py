"""A stand-in log node for replicator tests: a real gRPC LogService (with health) on
127.0.0.1 that records CreatePartitions/DeletePartitions/UpdatePartitionConfigs calls and can
be told to fail."""

from __future__ import annotations

import grpc

from kbroker.log.v1 import log_pb2, log_pb2_grpc
from services.common.server import ServiceBinding, create_server

SERVICE_NAME = log_pb2.DESCRIPTOR.services_by_name["LogService"].full_name


class RecordingLogService(log_pb2_grpc.LogServiceServicer):
    def __init__(self) -> None:
        self.created: list[log_pb2.PartitionSpec] = []
        self.deleted: list[tuple[str, int]] = []
        self.config_updates: list[log_pb2.PartitionSpec] = []
        # Set to make calls fail: a whole-call gRPC status, or a Kafka error per partition.
        self.fail_status: grpc.StatusCode | None = None
        self.partition_error = 0

    async def CreatePartitions(
        self, request: log_pb2.CreatePartitionsRequest, context: grpc.aio.ServicerContext
    ) -> log_pb2.CreatePartitionsResponse:
        if self.fail_status is not None:
            await context.abort(self.fail_status, "injected failure")
        if self.partition_error:
            return log_pb2.CreatePartitionsResponse(results=[
                log_pb2.PartitionError(topic=p.topic, partition=p.partition,
                                       error_code=self.partition_error, error_message="injected")
                for p in request.partitions
            ])
        self.created.extend(request.partitions)
        return log_pb2.CreatePartitionsResponse(results=[
            log_pb2.PartitionError(topic=p.topic, partition=p.partition)
            for p in request.partitions
        ])

    async def DeletePartitions(
        self, request: log_pb2.DeletePartitionsRequest, context: grpc.aio.ServicerContext
    ) -> log_pb2.DeletePartitionsResponse:
        if self.fail_status is not None:
            await context.abort(self.fail_status, "injected failure")
        self.deleted.extend((p.topic, p.partition) for p in request.partitions)
        return log_pb2.DeletePartitionsResponse(results=[
            log_pb2.PartitionError(topic=p.topic, partition=p.partition)
            for p in request.partitions
        ])

    async def UpdatePartitionConfigs(
        self, request: log_pb2.UpdatePartitionConfigsRequest, context: grpc.aio.ServicerContext
    ) -> log_pb2.UpdatePartitionConfigsResponse:
        if self.fail_status is not None:
            await context.abort(self.fail_status, "injected failure")
        self.config_updates.extend(request.partitions)
        return log_pb2.UpdatePartitionConfigsResponse(results=[
            log_pb2.PartitionError(topic=p.topic, partition=p.partition)
            for p in request.partitions
        ])

    def configs_of(self, topic: str, partition: int) -> dict[str, str] | None:
        """The configs last pushed to a replica (creation or update), None if never."""
        found = None
        for spec in self.created:
            if (spec.topic, spec.partition) == (topic, partition):
                found = dict(spec.configs)
        for spec in self.config_updates:
            if (spec.topic, spec.partition) == (topic, partition):
                found = dict(spec.configs)
        return found

    def created_partitions(self, topic: str | None = None) -> set[tuple[str, int]]:
        return {(p.topic, p.partition) for p in self.created if topic in (None, p.topic)}


class FakeLogNode:
    """One fake node; ``start`` binds port 0 the first time and the same port on restarts."""

    def __init__(self, node_id: int) -> None:
        self.node_id = node_id
        self.service = RecordingLogService()
        self.port = 0
        self._server: grpc.aio.Server | None = None

    @property
    def entry(self) -> str:
        return f"{self.node_id}=127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self._server is not None

    async def start(self) -> None:
        self._server, self.port, self.health = await create_server(
            f"log-{self.node_id}",
            [ServiceBinding(SERVICE_NAME, log_pb2_grpc.add_LogServiceServicer_to_server,
                            self.service)],
            f"127.0.0.1:{self.port}",
        )

    async def stop(self) -> None:
        if self._server is not None:
            server, self._server = self._server, None
            await server.stop(0)
