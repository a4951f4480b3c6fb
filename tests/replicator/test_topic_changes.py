"""Config changes and partition additions through the replicator service, against fake log
nodes on real ports."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import grpc
import pytest

from kbroker.replicator.v1 import replicator_pb2 as pb
from services.common.errors import ErrorCode, KafkaError
from services.replicator.topic_rules import apply_config_changes

from .harness import cluster, new_topic, wait_for

OK = ErrorCode.none.value
SET, DELETE, APPEND, SUBTRACT = (pb.ConfigChange.SET, pb.ConfigChange.DELETE,
                                 pb.ConfigChange.APPEND, pb.ConfigChange.SUBTRACT)


def change(name: str, op: int = SET, value: str = "") -> pb.ConfigChange:
    return pb.ConfigChange(name=name, operation=op, value=value)  # type: ignore[arg-type]


def test_apply_config_changes_follows_kafka_list_semantics() -> None:
    assert apply_config_changes({}, [change("cleanup.policy", APPEND, "compact")]) == {
        "cleanup.policy": "delete,compact"}
    assert apply_config_changes({"cleanup.policy": "delete,compact"},
                                [change("cleanup.policy", SUBTRACT, "delete")]) == {
        "cleanup.policy": "compact"}
    assert apply_config_changes({"retention.ms": "5"},
                                [change("retention.ms", DELETE, ""),
                                 change("no.such.config", DELETE, "")]) == {}
    assert apply_config_changes({"retention.ms": "5"}, [change("segment.ms", SET, "9")],
                                replace=True) == {"segment.ms": "9"}
    with pytest.raises(KafkaError) as info:
        apply_config_changes({}, [change("retention.ms", APPEND, "5")])
    assert info.value.code == ErrorCode.invalid_config
    with pytest.raises(KafkaError) as info:
        apply_config_changes({}, [change("retention.ms", SET, "soon")])
    assert info.value.code == ErrorCode.invalid_config


def test_alter_configs_persists_publishes_and_pushes_to_replicas(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with cluster(tmp_path) as c:
            (created,) = await c.create(new_topic("t", 3, 2, retention_ms="1000"))
            assert created.error_code == OK
            watch = c.stub.WatchMetadata(pb.WatchMetadataRequest())
            first = await watch.read()
            (result,) = await c.alter(pb.TopicConfigChanges(topic="t", changes=[
                change("retention.ms", DELETE), change("segment.ms", SET, "60000"),
                change("cleanup.policy", APPEND, "compact")]))
            assert result.error_code == OK, result.error_message
            expected = {"segment.ms": "60000", "cleanup.policy": "delete,compact"}
            assert dict(result.configs) == expected
            update = await asyncio.wait_for(watch.read(), 5)
            assert update.version > first.version
            assert dict(update.topics[0].configs) == expected
            watch.cancel()
            metadata = await c.metadata("t")
            for p in metadata.topics[0].partitions:
                for node_id in p.replicas:
                    assert c.nodes[node_id].service.configs_of("t", p.partition) == expected
            stored = json.loads((tmp_path / "replicator" / "metadata.json").read_text())
            assert json.dumps(expected, sort_keys=True)[1:-1] in json.dumps(stored,
                                                                            sort_keys=True)
            # AlterConfigs replaces the whole set.
            (result,) = await c.alter(pb.TopicConfigChanges(
                topic="t", replace=True, changes=[change("max.message.bytes", SET, "2048")]))
            assert dict(result.configs) == {"max.message.bytes": "2048"}
            await c.stop_replicator()
            await c.start_replicator()
            (topic,) = (await c.metadata("t")).topics
            assert dict(topic.configs) == {"max.message.bytes": "2048"}

    asyncio.run(scenario())


def test_alter_configs_rejects_bad_changes_and_honours_validate_only(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with cluster(tmp_path) as c:
            await c.create(new_topic("t", 1, 1))
            version = (await c.metadata()).version
            results = await c.alter(
                pb.TopicConfigChanges(topic="t", changes=[change("retention.ms", SET, "x")]),
                pb.TopicConfigChanges(topic="missing", changes=[change("retention.ms", SET, "1")]),
                pb.TopicConfigChanges(topic="t", changes=[change("bogus", SET, "1")]),
            )
            assert [r.error_code for r in results] == [ErrorCode.invalid_request.value,
                                                      ErrorCode.unknown_topic_or_partition.value,
                                                      ErrorCode.invalid_request.value]
            (bad,) = await c.alter(pb.TopicConfigChanges(
                topic="t", changes=[change("retention.ms", APPEND, "1")]))
            assert bad.error_code == ErrorCode.invalid_config.value
            assert "append" in bad.error_message
            (bad,) = await c.alter(pb.TopicConfigChanges(
                topic="t", changes=[change("min.insync.replicas", SET, "0")]))
            assert bad.error_code == ErrorCode.invalid_config.value
            assert "min.insync.replicas" in bad.error_message
            (ok,) = await c.alter(pb.TopicConfigChanges(
                topic="t", changes=[change("retention.ms", SET, "5")]), validate_only=True)
            assert ok.error_code == OK and dict(ok.configs) == {"retention.ms": "5"}
            after = await c.metadata()
            assert after.version == version and dict(after.topics[0].configs) == {}
            assert not c.nodes[0].service.config_updates

    asyncio.run(scenario())


def test_a_node_that_missed_a_config_change_gets_it_when_it_returns(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with cluster(tmp_path, nodes=2) as c:
            await c.create(new_topic("t", 2, 2))
            c.nodes[1].service.fail_status = grpc.StatusCode.UNAVAILABLE
            (result,) = await c.alter(pb.TopicConfigChanges(
                topic="t", changes=[change("retention.ms", SET, "77")]))
            assert result.error_code == OK
            assert c.nodes[0].service.configs_of("t", 1) == {"retention.ms": "77"}
            assert c.nodes[1].service.configs_of("t", 1) == {}
            c.nodes[1].service.fail_status = None

            async def caught_up() -> bool:
                return all(c.nodes[1].service.configs_of("t", p) == {"retention.ms": "77"}
                           for p in (0, 1))

            await wait_for(caught_up)

    asyncio.run(scenario())


def test_create_partitions_grows_a_topic_on_its_log_nodes(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with cluster(tmp_path) as c:
            (created,) = await c.create(new_topic("t", 2, 2, retention_ms="9"))
            (result,) = await c.grow(pb.PartitionIncrease(topic="t", count=5))
            assert result.error_code == OK, result.error_message
            assert (result.num_partitions, result.replication_factor) == (5, 2)
            (topic,) = (await c.metadata("t")).topics
            assert topic.topic_id == created.topic_id
            assert [p.partition for p in topic.partitions] == [0, 1, 2, 3, 4]
            leaders = [p.leader for p in topic.partitions]
            # The ring continues: partition p is led by node (first leader + p) % 3.
            assert leaders == [(leaders[0] + p) % 3 for p in range(5)]
            for p in topic.partitions:
                assert len(set(p.replicas)) == 2 and list(p.isr) == list(p.replicas)
                for node_id in p.replicas:
                    assert ("t", p.partition) in c.nodes[node_id].service.created_partitions()
                    assert c.nodes[node_id].service.configs_of("t", p.partition) == {
                        "retention.ms": "9"}
            # Explicit assignments.
            (result,) = await c.grow(pb.PartitionIncrease(
                topic="t", count=6, assignments=[pb.Replicas(node_ids=[2, 0])]))
            assert result.error_code == OK, result.error_message
            (topic,) = (await c.metadata("t")).topics
            assert list(topic.partitions[5].replicas) == [2, 0]
            await c.stop_replicator()
            await c.start_replicator()
            assert len((await c.metadata("t")).topics[0].partitions) == 6

    asyncio.run(scenario())


def test_create_partitions_rejects_what_kafka_rejects(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with cluster(tmp_path) as c:
            await c.create(new_topic("t", 2, 2))
            version = (await c.metadata()).version
            cases = [
                (pb.PartitionIncrease(topic="t", count=2), ErrorCode.invalid_partitions),
                (pb.PartitionIncrease(topic="t", count=1), ErrorCode.invalid_partitions),
                (pb.PartitionIncrease(topic="nope", count=3),
                 ErrorCode.unknown_topic_or_partition),
                (pb.PartitionIncrease(topic="t", count=4, assignments=[
                    pb.Replicas(node_ids=[0, 1])]), ErrorCode.invalid_replica_assignment),
                (pb.PartitionIncrease(topic="t", count=3, assignments=[
                    pb.Replicas(node_ids=[0])]), ErrorCode.invalid_replica_assignment),
                (pb.PartitionIncrease(topic="t", count=3, assignments=[
                    pb.Replicas(node_ids=[0, 7])]), ErrorCode.invalid_replica_assignment),
                (pb.PartitionIncrease(topic="t", count=3, assignments=[
                    pb.Replicas(node_ids=[1, 1])]), ErrorCode.invalid_replica_assignment),
            ]
            for increase, code in cases:
                (result,) = await c.grow(increase)
                assert result.error_code == code.value, (increase, result)
            (ok,) = await c.grow(pb.PartitionIncrease(topic="t", count=4), validate_only=True)
            assert ok.error_code == OK and ok.num_partitions == 4
            assert (await c.metadata()).version == version
            assert len((await c.metadata("t")).topics[0].partitions) == 2

    asyncio.run(scenario())


def test_partitions_a_log_node_refuses_are_not_committed(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with cluster(tmp_path, nodes=2) as c:
            await c.create(new_topic("t", 1, 2))
            c.nodes[1].service.partition_error = ErrorCode.kafka_storage_error.value
            (result,) = await c.grow(pb.PartitionIncrease(topic="t", count=3))
            assert result.error_code == ErrorCode.kafka_storage_error.value
            assert len((await c.metadata("t")).topics[0].partitions) == 1
            # What node 0 created is removed again.
            assert {("t", 1), ("t", 2)} <= set(c.nodes[0].service.deleted)

    asyncio.run(scenario())
