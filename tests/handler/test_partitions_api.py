"""CreatePartitions through a handler against the real replicator and log nodes."""

from __future__ import annotations

import asyncio
from pathlib import Path

from kbroker.kafka.v1 import kafka_pb2 as k

from .batches import record_batch
from .harness import CALL_TIMEOUT, Cluster, running_cluster

Topic = k.CreatePartitionsRequest.CreatePartitionsTopic
Assignment = k.CreatePartitionsRequest.CreatePartitionsAssignment


async def grow(cluster: Cluster, *topics: Topic, validate_only: bool = False
               ) -> list[tuple[str, int]]:
    response = await cluster.stub.CreatePartitions(
        k.CreatePartitionsRequest(topics=topics, timeout_ms=10_000, validate_only=validate_only),
        timeout=CALL_TIMEOUT)
    return [(r.name, r.error_code) for r in response.results]


def test_new_partitions_are_in_metadata_and_take_records(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with running_cluster(tmp_path, nodes=2) as cluster:
            await cluster.create_topic("t", partitions=1)
            assert await grow(cluster, Topic(name="t", count=3, assignments_is_null=True)) == [
                ("t", 0)]
            (topic,) = (await cluster.metadata("t")).topics
            assert [p.partition_index for p in topic.partitions] == [0, 1, 2]
            assert {p.leader_id for p in topic.partitions} == {0, 1}
            for partition in (1, 2):
                produced = await cluster.produce("t", partition, record_batch([b"v"]))
                assert (produced.error_code, produced.base_offset) == (0, 0)
            # Explicit assignment of one more partition to node 1.
            assert await grow(cluster, Topic(name="t", count=4, assignments=[
                Assignment(broker_ids=[1])])) == [("t", 0)]
            (topic,) = (await cluster.metadata("t")).topics
            assert list(topic.partitions[3].replica_nodes) == [1]
            produced = await cluster.produce("t", 3, record_batch([b"v"]))
            assert produced.error_code == 0

    asyncio.run(scenario())


def test_create_partitions_errors(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with running_cluster(tmp_path) as cluster:
            await cluster.create_topic("t", partitions=2)
            results = await grow(
                cluster,
                Topic(name="t", count=2, assignments_is_null=True),
                Topic(name="missing", count=3, assignments_is_null=True),
                Topic(name="dup", count=3, assignments_is_null=True),
                Topic(name="dup", count=4, assignments_is_null=True),
                Topic(name="bad name", count=3, assignments_is_null=True),
            )
            # INVALID_PARTITIONS, UNKNOWN_TOPIC_OR_PARTITION, INVALID_REQUEST,
            # INVALID_TOPIC_EXCEPTION
            assert results == [("t", 37), ("missing", 3), ("dup", 42), ("bad name", 17)]
            assert await grow(cluster, Topic(name="t", count=3, assignments=[
                Assignment(broker_ids=[5])])) == [("t", 39)]
            assert await grow(cluster, Topic(name="t", count=4, assignments=[
                Assignment(broker_ids=[0])])) == [("t", 39)]
            assert await grow(cluster, Topic(name="t", count=5, assignments_is_null=True),
                              validate_only=True) == [("t", 0)]
            (topic,) = (await cluster.metadata("t")).topics
            assert len(topic.partitions) == 2

    asyncio.run(scenario())
