"""Replication under test: real log nodes (data in tmp_path), a real purgatory and the real
replicator, each a gRPC server on 127.0.0.1 in this process. Log nodes keep their port across
restarts, so the replicator finds them again."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from kbroker.log.v1 import log_pb2, log_pb2_grpc
from kbroker.purgatory.v1 import purgatory_pb2, purgatory_pb2_grpc
from kbroker.replicator.v1 import replicator_pb2 as pb
from kbroker.replicator.v1 import replicator_pb2_grpc
from services.common.channels import insecure_channel
from services.common.records.record_batch import iter_batches
from services.log.config import LogConfig
from services.log.server import LogService
from services.log.server import start as start_log
from services.purgatory.config import PurgatoryConfig
from services.purgatory.server import PurgatoryService
from services.purgatory.server import start as start_purgatory
from services.replicator.config import ReplicatorConfig
from services.replicator.server import ReplicatorService
from services.replicator.server import start as start_replicator

LAG_MS = 600
FETCH_WAIT_MS = 200
SESSION_TIMEOUT_MS = 400
CHECK_INTERVAL_MS = 100


@dataclass
class Node:
    node_id: int
    data_dir: Path
    purgatory_address: str
    port: int = 0
    # Further LogConfig fields.
    settings: dict[str, object] = field(default_factory=dict)
    service: LogService | None = None
    channel: grpc.aio.Channel | None = None
    stub: log_pb2_grpc.LogServiceStub = None  # type: ignore[assignment]

    @property
    def entry(self) -> str:
        return f"{self.node_id}=127.0.0.1:{self.port}"

    async def start(self) -> None:
        self.service = await start_log(LogConfig(
            node_id=self.node_id, data_dir=str(self.data_dir),
            grpc_address=f"127.0.0.1:{self.port}", purgatory_address=self.purgatory_address,
            **self.settings))  # type: ignore[arg-type]
        self.port = self.service.port
        self.channel = insecure_channel(f"127.0.0.1:{self.port}")
        self.stub = log_pb2_grpc.LogServiceStub(self.channel)

    async def stop(self) -> None:
        if self.channel is not None:
            await self.channel.close()
            self.channel = None
        if self.service is not None:
            service, self.service = self.service, None
            await service.stop(0)

    async def describe(self, topic: str, partition: int = 0) -> log_pb2.PartitionState:
        response = await self.stub.DescribePartitions(log_pb2.DescribePartitionsRequest(
            partitions=[log_pb2.TopicPartition(topic=topic, partition=partition)]))
        return response.partitions[0]

    async def read_all(self, topic: str, partition: int = 0) -> bytes:
        """Every batch of the replica, up to its log end."""
        out = b""
        offset = 0
        for _ in range(10_000):
            response = await self.stub.Read(log_pb2.ReadRequest(
                limit=log_pb2.READ_LIMIT_LOG_END, partitions=[log_pb2.PartitionRead(
                    topic=topic, partition=partition, offset=offset, max_bytes=1 << 20)]))
            result = response.results[0]
            assert result.error_code == 0, result
            if not result.records:
                return out
            out += result.records
            offset = _next_offset(result.records)
        raise AssertionError("read did not end")

    async def append(self, topic: str, records: bytes,
                     partition: int = 0) -> log_pb2.PartitionAppendResult:
        response = await self.stub.Append(log_pb2.AppendRequest(partitions=[
            log_pb2.PartitionAppend(topic=topic, partition=partition, records=records)]))
        return response.results[0]


def _next_offset(records: bytes) -> int:
    last = None
    for batch in iter_batches(records):
        last = batch.header
    assert last is not None
    return last.next_offset


@dataclass
class Replication:
    tmp_path: Path
    nodes: list[Node]
    purgatory: PurgatoryService
    purgatory_stub: purgatory_pb2_grpc.PurgatoryStub
    settings: dict[str, object] = field(default_factory=dict)
    replicator: ReplicatorService | None = None
    channel: grpc.aio.Channel | None = None
    stub: replicator_pb2_grpc.ReplicatorStub = None  # type: ignore[assignment]

    async def start_replicator(self) -> None:
        values: dict[str, object] = {
            "grpc_address": "127.0.0.1:0",
            "data_dir": str(self.tmp_path / "replicator"),
            "log_nodes": tuple(n.entry for n in self.nodes),
            "node_check_interval_ms": CHECK_INTERVAL_MS,
            "replica_lag_time_max_ms": LAG_MS,
            "replica_fetch_backoff_ms": 50,
            "replica_fetch_wait_max_ms": FETCH_WAIT_MS,
            "node_session_timeout_ms": SESSION_TIMEOUT_MS,
            # Tests that want leadership to move back turn it on.
            "auto_leader_rebalance_enable": False,
            "purgatory_address": f"127.0.0.1:{self.purgatory.port}",
            **self.settings,
        }
        self.replicator = await start_replicator(ReplicatorConfig(**values))  # type: ignore[arg-type]
        self.channel = insecure_channel(f"127.0.0.1:{self.replicator.port}")
        self.stub = replicator_pb2_grpc.ReplicatorStub(self.channel)

    async def stop_replicator(self) -> None:
        if self.channel is not None:
            await self.channel.close()
            self.channel = None
        if self.replicator is not None:
            replicator, self.replicator = self.replicator, None
            await replicator.stop(0)

    async def create_topic(self, name: str, partitions: int = 1, replication: int = 3,
                           **configs: str) -> None:
        reply = await self.stub.CreateTopics(pb.CreateTopicsRequest(topics=[pb.NewTopic(
            name=name, num_partitions=partitions, replication_factor=replication,
            configs={k.replace("_", "."): v for k, v in configs.items()})]))
        assert reply.topics[0].error_code == 0, reply

    async def partition(self, topic: str, partition: int = 0) -> pb.PartitionMetadata:
        metadata = await self.stub.GetMetadata(pb.GetMetadataRequest(topics=[topic]))
        return metadata.topics[0].partitions[partition]

    def node(self, node_id: int) -> Node:
        return next(n for n in self.nodes if n.node_id == node_id)

    async def await_produce(self, key: str, threshold: int, timeout_ms: int
                            ) -> purgatory_pb2.AwaitResponse:
        return await self.purgatory_stub.Await(purgatory_pb2.AwaitRequest(
            kind=purgatory_pb2.OPERATION_KIND_PRODUCE, require_all=True, timeout_ms=timeout_ms,
            keys=[purgatory_pb2.WatchedKey(key=key, threshold=threshold)]))


@contextlib.asynccontextmanager
async def replication(tmp_path: Path, nodes: int = 3, **settings: object
                      ) -> AsyncIterator[Replication]:
    purgatory = await start_purgatory(PurgatoryConfig(grpc_address="127.0.0.1:0"))
    purgatory_channel = insecure_channel(f"127.0.0.1:{purgatory.port}")
    address = f"127.0.0.1:{purgatory.port}"
    log_nodes = [Node(i, tmp_path / f"log-{i}", address) for i in range(nodes)]
    r = Replication(tmp_path, log_nodes, purgatory,
                    purgatory_pb2_grpc.PurgatoryStub(purgatory_channel), settings)
    try:
        for node in log_nodes:
            await node.start()
        await r.start_replicator()
        yield r
    finally:
        await r.stop_replicator()
        for node in log_nodes:
            await node.stop()
        await purgatory_channel.close()
        await purgatory.stop(0)


async def wait_for(condition: Callable[[], Awaitable[bool]], within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while not await condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)
