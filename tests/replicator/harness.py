"""A replicator under test: real fake log nodes, the real replicator on port 0, and a stub."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from kbroker.replicator.v1 import replicator_pb2 as pb
from kbroker.replicator.v1 import replicator_pb2_grpc
from services.common.channels import insecure_channel
from services.replicator.config import ReplicatorConfig
from services.replicator.server import ReplicatorService, start

from .fake_log_node import FakeLogNode

CHECK_INTERVAL_MS = 50


@dataclass
class Cluster:
    data_dir: Path
    nodes: list[FakeLogNode]
    defaults: dict[str, object] = field(default_factory=dict)
    service: ReplicatorService | None = None
    channel: grpc.aio.Channel | None = None
    stub: replicator_pb2_grpc.ReplicatorStub = None  # type: ignore[assignment]

    def config(self, **overrides: object) -> ReplicatorConfig:
        values: dict[str, object] = {
            "grpc_address": "127.0.0.1:0",
            "data_dir": str(self.data_dir),
            "log_nodes": tuple(n.entry for n in self.nodes),
            "node_check_interval_ms": CHECK_INTERVAL_MS,
            # Fake log nodes keep no partitions: the metadata lives in metadata.json here.
            "metadata_store": "file",
            **self.defaults,
            **overrides,
        }
        return ReplicatorConfig(**values)  # type: ignore[arg-type]

    async def start_replicator(self, **overrides: object) -> None:
        self.service = await start(self.config(**overrides))
        self.channel = insecure_channel(f"127.0.0.1:{self.service.port}")
        self.stub = replicator_pb2_grpc.ReplicatorStub(self.channel)

    async def stop_replicator(self) -> None:
        if self.channel is not None:
            await self.channel.close()
            self.channel = None
        if self.service is not None:
            service, self.service = self.service, None
            await service.stop(0)

    async def metadata(self, *topics: str) -> pb.ClusterMetadata:
        return await self.stub.GetMetadata(pb.GetMetadataRequest(topics=topics))

    async def create(self, *topics: pb.NewTopic, validate_only: bool = False
                     ) -> list[pb.TopicResult]:
        reply = await self.stub.CreateTopics(
            pb.CreateTopicsRequest(topics=topics, validate_only=validate_only))
        return list(reply.topics)

    async def delete(self, names: tuple[str, ...] = (), ids: tuple[str, ...] = ()
                     ) -> list[pb.TopicResult]:
        reply = await self.stub.DeleteTopics(pb.DeleteTopicsRequest(names=names, topic_ids=ids))
        return list(reply.topics)

    async def alter(self, *topics: pb.TopicConfigChanges, validate_only: bool = False
                    ) -> list[pb.TopicResult]:
        reply = await self.stub.AlterTopicConfigs(
            pb.AlterTopicConfigsRequest(topics=topics, validate_only=validate_only))
        return list(reply.topics)

    async def grow(self, *topics: pb.PartitionIncrease, validate_only: bool = False
                   ) -> list[pb.TopicResult]:
        reply = await self.stub.CreatePartitions(
            pb.CreatePartitionsRequest(topics=topics, validate_only=validate_only))
        return list(reply.topics)

    async def node_alive(self, node_id: int) -> bool:
        metadata = await self.metadata()
        return next(n.alive for n in metadata.log_nodes if n.node_id == node_id)


def new_topic(name: str, partitions: int = 1, replication: int = 1, **configs: str) -> pb.NewTopic:
    return pb.NewTopic(name=name, num_partitions=partitions, replication_factor=replication,
                       configs={k.replace("_", "."): v for k, v in configs.items()})


@contextlib.asynccontextmanager
async def cluster(tmp_path: Path, nodes: int = 3, **defaults: object) -> AsyncIterator[Cluster]:
    fakes = [FakeLogNode(i) for i in range(nodes)]
    c = Cluster(data_dir=tmp_path / "replicator", nodes=fakes, defaults=defaults)
    try:
        for fake in fakes:
            await fake.start()
        await c.start_replicator()
        yield c
    finally:
        await c.stop_replicator()
        for fake in fakes:
            await fake.stop()


async def wait_for(condition: Callable[[], Awaitable[bool]], within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not await condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)
