"""A real cluster in-process for handler service tests: log nodes (tmp_path data dirs), the
purgatory, the replicator and a handler, each a gRPC server on 127.0.0.1 port 0, plus a
KafkaHandler stub to call the handler with."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kbroker.handler.v1 import kafka_handler_pb2_grpc
from kbroker.kafka.v1 import kafka_pb2 as k
from services.common.channels import insecure_channel
from services.handler import server as handler_server
from services.handler.clients import LogNodeClients
from services.handler.config import HandlerConfig
from services.log import server as log_server
from services.log.config import LogConfig
from services.purgatory import server as purgatory_server
from services.purgatory.config import PurgatoryConfig
from services.replicator import server as replicator_server
from services.replicator.config import ReplicatorConfig

ADVERTISED = ("kafka.test", 9092)
# Metadata for requests to the handler, as a frontend sends it.
FRONTEND_METADATA = (
    ("kafka-advertised", f"{ADVERTISED[0]}:{ADVERTISED[1]}"),
    ("kafka-client-id", "handler-tests"),
    ("kafka-client-host", "127.0.0.1"),
    ("kafka-frontend-id", "frontend-test"),
)
CALL_TIMEOUT = 15.0


@dataclass
class Cluster:
    handler: Any
    stub: kafka_handler_pb2_grpc.KafkaHandlerStub
    log_nodes: list[Any]
    purgatory: Any
    replicator: Any
    tmp_path: Path
    stopped: list[Any] = field(default_factory=list)

    async def metadata(self, *names: str, auto_create: bool = False) -> k.MetadataResponse:
        request = k.MetadataRequest(
            topics=[k.MetadataRequest.MetadataRequestTopic(name=n) for n in names],
            topics_is_null=not names,
            allow_auto_topic_creation=auto_create,
        )
        return await self.stub.Metadata(request, metadata=FRONTEND_METADATA,
                                        timeout=CALL_TIMEOUT)

    async def create_topic(self, name: str, partitions: int = 1,
                           replication_factor: int = 1) -> k.CreateTopicsResponse:
        response = await self.stub.CreateTopics(
            k.CreateTopicsRequest(
                topics=[k.CreateTopicsRequest.CreatableTopic(
                    name=name, num_partitions=partitions,
                    replication_factor=replication_factor)],
                timeout_ms=10_000, validate_only=False),
            timeout=CALL_TIMEOUT)
        assert response.topics[0].error_code == 0, response
        return response

    async def produce(self, topic: str, partition: int, records: bytes,
                      acks: int = 1) -> k.ProduceResponse.PartitionProduceResponse:
        response = await self.stub.Produce(
            k.ProduceRequest(acks=acks, timeout_ms=5000, topic_data=[
                k.ProduceRequest.TopicProduceData(name=topic, partition_data=[
                    k.ProduceRequest.PartitionProduceData(index=partition, records=records)])]),
            timeout=CALL_TIMEOUT)
        return response.responses[0].partition_responses[0]

    async def fetch(self, topic: str, partition: int, offset: int, *, max_wait_ms: int = 0,
                    min_bytes: int = 1, **fields: Any) -> k.FetchResponse:
        request = k.FetchRequest(
            replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=min_bytes,
            max_bytes=fields.pop("max_bytes", 50 * 1024 * 1024),
            isolation_level=fields.pop("isolation_level", 0),
            session_id=fields.pop("session_id", 0), session_epoch=fields.pop("session_epoch", -1),
            topics=[k.FetchRequest.FetchTopic(topic=topic, partitions=[
                k.FetchRequest.FetchPartition(
                    partition=partition, fetch_offset=offset,
                    partition_max_bytes=fields.pop("partition_max_bytes", 1024 * 1024),
                    current_leader_epoch=fields.pop("current_leader_epoch", -1))])],
            **fields,
        )
        return await self.stub.Fetch(request, timeout=CALL_TIMEOUT)

    async def list_offset(self, topic: str, partition: int, timestamp: int
                          ) -> k.ListOffsetsResponse.ListOffsetsPartitionResponse:
        response = await self.stub.ListOffsets(
            k.ListOffsetsRequest(replica_id=-1, isolation_level=0, topics=[
                k.ListOffsetsRequest.ListOffsetsTopic(name=topic, partitions=[
                    k.ListOffsetsRequest.ListOffsetsPartition(
                        partition_index=partition, timestamp=timestamp,
                        current_leader_epoch=-1)])]),
            timeout=CALL_TIMEOUT)
        return response.topics[0].partitions[0]

    async def wait_for_brokers(self, count: int, time_limit: float = 15.0) -> k.MetadataResponse:
        """Metadata once exactly ``count`` log nodes are brokers."""
        return await self.wait_for_metadata(
            lambda response: len(response.brokers) == count, time_limit=time_limit)

    async def wait_for_metadata(self, condition: Callable[[k.MetadataResponse], bool],
                                *names: str, time_limit: float = 15.0) -> k.MetadataResponse:
        """The first Metadata of ``names`` (every topic when none) that meets ``condition``."""
        deadline = time.monotonic() + time_limit
        while True:
            response = await self.metadata(*names)
            if condition(response):
                return response
            if time.monotonic() > deadline:
                raise AssertionError(f"metadata never as expected: {response}")
            await asyncio.sleep(0.05)

    async def stop_log_node(self, index: int) -> None:
        node = self.log_nodes[index]
        await node.stop(0)
        self.stopped.append(node)


@contextlib.asynccontextmanager
async def running_cluster(
    tmp_path: Path, nodes: int = 1, *, purgatory: bool = True,
    log_node_clients: Callable[[], LogNodeClients] | None = None, **handler_options: Any
) -> AsyncIterator[Cluster]:
    """Start everything, yield the cluster once every log node is a live broker, and stop
    everything afterwards whatever happened. ``log_node_clients`` makes the handler's log
    node clients."""
    async with contextlib.AsyncExitStack() as stack:
        purgatory_service = None
        purgatory_address = "127.0.0.1:1"  # nothing listens there
        if purgatory:
            purgatory_service = await purgatory_server.start(
                PurgatoryConfig(grpc_address="127.0.0.1:0"))
            stack.push_async_callback(purgatory_service.stop, 0)
            purgatory_address = f"127.0.0.1:{purgatory_service.port}"
        log_nodes: list[Any] = []
        stopped: list[Any] = []
        for node_id in range(nodes):
            node = await log_server.start(LogConfig(
                node_id=node_id, data_dir=str(tmp_path / f"log-{node_id}"),
                grpc_address="127.0.0.1:0",
                purgatory_address=purgatory_address if purgatory else ""))
            log_nodes.append(node)
        stack.push_async_callback(_stop_all, log_nodes, stopped)
        replicator = await replicator_server.start(ReplicatorConfig(
            grpc_address="127.0.0.1:0",
            data_dir=str(tmp_path / "replicator"),
            log_nodes=tuple(f"{i}=127.0.0.1:{n.port}" for i, n in enumerate(log_nodes)),
            cluster_id="handler-test-cluster",
            node_check_interval_ms=100,
        ))
        stack.push_async_callback(replicator.stop, 0)
        handler = await handler_server.start(HandlerConfig(
            grpc_address="127.0.0.1:0",
            replicator_address=f"127.0.0.1:{replicator.port}",
            purgatory_address=purgatory_address,
            advertised="default.test:9999",
            **handler_options,
        ), log_nodes=log_node_clients() if log_node_clients is not None else None)
        stack.push_async_callback(handler.stop, 0)
        channel = insecure_channel(f"127.0.0.1:{handler.port}")
        stack.push_async_callback(channel.close)
        cluster = Cluster(handler=handler, stub=kafka_handler_pb2_grpc.KafkaHandlerStub(channel),
                          log_nodes=log_nodes, purgatory=purgatory_service,
                          replicator=replicator, tmp_path=tmp_path, stopped=stopped)
        await cluster.wait_for_brokers(nodes)
        yield cluster


async def _stop_all(services: list[Any], stopped: list[Any]) -> None:
    for service in services:
        if service not in stopped:
            await service.stop(0)
