"""The replicator service over real gRPC, against fake log nodes on real ports."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2

from kbroker.replicator.v1 import replicator_pb2 as pb
from services.common.errors import ErrorCode

from .fake_log_node import SERVICE_NAME, FakeLogNode
from .harness import Cluster, cluster, new_topic, wait_for

OK = ErrorCode.none.value


def partitions_of(metadata: pb.ClusterMetadata, name: str) -> list[pb.PartitionMetadata]:
    (topic,) = [t for t in metadata.topics if t.name == name]
    return list(topic.partitions)


def test_create_topic_places_replicas_and_publishes_metadata(tmp_path: Path):
    async def scenario() -> None:
        async with cluster(tmp_path) as c:
            before = await c.metadata()
            assert len(before.cluster_id) == 22 and before.controller_id == 0
            assert [(n.node_id, n.alive) for n in before.log_nodes] == [
                (0, True), (1, True), (2, True)]
            (result,) = await c.create(new_topic("orders", 6, 2, retention_ms="1000"))
            assert result.error_code == OK, result.error_message
            assert (result.num_partitions, result.replication_factor) == (6, 2)
            assert dict(result.configs) == {"retention.ms": "1000"}
            assert str(uuid.UUID(result.topic_id)) == result.topic_id

            after = await c.metadata()
            assert after.version > before.version
            (topic,) = after.topics
            assert topic.topic_id == result.topic_id and not topic.internal
            assert dict(topic.configs) == {"retention.ms": "1000"}
            for index, p in enumerate(topic.partitions):
                assert p.partition == index
                assert len(set(p.replicas)) == 2
                assert p.leader == p.replicas[0] and list(p.isr) == list(p.replicas)
                assert p.leader_epoch == 0 and not p.offline_replicas
            leaders = Counter(p.leader for p in topic.partitions)
            assert leaders == {0: 2, 1: 2, 2: 2}
            # Each replica was created on its own log node, with the topic's id and configs.
            for node in c.nodes:
                expected = {("orders", p.partition) for p in topic.partitions
                            if node.node_id in p.replicas}
                assert node.service.created_partitions() == expected
                for spec in node.service.created:
                    assert spec.topic_id == topic.topic_id
                    assert dict(spec.configs) == {"retention.ms": "1000"}

    asyncio.run(scenario())


def test_defaults_apply_to_minus_one(tmp_path: Path):
    async def scenario() -> None:
        async with cluster(tmp_path, num_partitions=4, default_replication_factor=3) as c:
            (result,) = await c.create(new_topic("t", -1, -1))
            assert result.error_code == OK
            assert (result.num_partitions, result.replication_factor) == (4, 3)
            parts = partitions_of(await c.metadata(), "t")
            assert len(parts) == 4 and all(len(p.replicas) == 3 for p in parts)

    asyncio.run(scenario())


def test_internal_topics_are_flagged(tmp_path: Path):
    async def scenario() -> None:
        async with cluster(tmp_path) as c:
            await c.create(new_topic("__consumer_offsets", 3, 1), new_topic("plain"))
            flags = {t.name: t.internal for t in (await c.metadata()).topics}
            assert flags == {"__consumer_offsets": True, "plain": False}

    asyncio.run(scenario())


def test_invalid_requests_get_kafkas_error_codes_and_change_nothing(tmp_path: Path):
    async def scenario() -> None:
        async with cluster(tmp_path) as c:
            (ok,) = await c.create(new_topic("exists"))
            assert ok.error_code == OK
            version = (await c.metadata()).version
            created = {n.node_id: len(n.service.created) for n in c.nodes}
            cases = [
                (new_topic(""), ErrorCode.invalid_topic_exception),
                (new_topic("."), ErrorCode.invalid_topic_exception),
                (new_topic(".."), ErrorCode.invalid_topic_exception),
                (new_topic("x" * 250), ErrorCode.invalid_topic_exception),
                (new_topic("white space"), ErrorCode.invalid_topic_exception),
                (new_topic("exists"), ErrorCode.topic_already_exists),
                (new_topic("exist_s"), ErrorCode.none),
                (new_topic("exist.s"), ErrorCode.invalid_topic_exception),  # collides
                (new_topic("p0", 0), ErrorCode.invalid_partitions),
                (new_topic("p-2", -2), ErrorCode.invalid_partitions),
                (new_topic("r0", 1, 0), ErrorCode.invalid_replication_factor),
                (new_topic("r-2", 1, -2), ErrorCode.invalid_replication_factor),
                (new_topic("r4", 1, 4), ErrorCode.invalid_replication_factor),
                (new_topic("cfg", unknown_config="1"), ErrorCode.invalid_config),
                (new_topic("cfg2", retention_ms="soon"), ErrorCode.invalid_config),
                (new_topic("cfg3", cleanup_policy="sometimes"), ErrorCode.invalid_config),
                (pb.NewTopic(name="a1", num_partitions=-1, replication_factor=-1,
                             assignments={0: pb.Replicas(node_ids=[0, 0])}),
                 ErrorCode.invalid_replica_assignment),
                (pb.NewTopic(name="a2", num_partitions=-1, replication_factor=-1,
                             assignments={0: pb.Replicas(node_ids=[5])}),
                 ErrorCode.invalid_replica_assignment),
                (pb.NewTopic(name="a3", num_partitions=-1, replication_factor=-1,
                             assignments={1: pb.Replicas(node_ids=[0])}),
                 ErrorCode.invalid_replica_assignment),
                (pb.NewTopic(name="a4", num_partitions=1, replication_factor=-1,
                             assignments={0: pb.Replicas(node_ids=[0])}),
                 ErrorCode.invalid_request),
                (new_topic("twice"), ErrorCode.invalid_request),
                (new_topic("twice"), ErrorCode.invalid_request),
            ]
            results = await c.create(*(topic for topic, _ in cases))
            assert [r.name for r in results] == [topic.name for topic, _ in cases]
            for (topic, code), result in zip(cases, results, strict=True):
                assert result.error_code == code.value, (
                    topic.name, result.error_code, result.error_message)
                if result.error_code != OK:
                    assert result.error_message and not result.topic_id
                    assert (result.num_partitions, result.replication_factor) == (-1, -1)
            r4 = results[[t.name for t, _ in cases].index("r4")]
            assert "replication factor of 4" in r4.error_message and "only 3" in r4.error_message
            # Only the one valid topic was created, on one node, in one new version.
            metadata = await c.metadata()
            assert sorted(t.name for t in metadata.topics) == ["exist_s", "exists"]
            assert metadata.version == version + 1
            assert sum(len(n.service.created) for n in c.nodes) == sum(created.values()) + 1

    asyncio.run(scenario())


def test_validate_only_creates_nothing(tmp_path: Path):
    async def scenario() -> None:
        async with cluster(tmp_path) as c:
            version = (await c.metadata()).version
            good, bad = await c.create(new_topic("t", 3, 2, segment_bytes="1048576"),
                                       new_topic("u", 1, 5), validate_only=True)
            assert good.error_code == OK and not good.topic_id
            assert (good.num_partitions, good.replication_factor) == (3, 2)
            assert dict(good.configs) == {"segment.bytes": "1048576"}
            assert bad.error_code == ErrorCode.invalid_replication_factor.value
            metadata = await c.metadata()
            assert not metadata.topics and metadata.version == version
            assert all(not n.service.created for n in c.nodes)

    asyncio.run(scenario())


def test_manual_assignment_is_followed(tmp_path: Path):
    async def scenario() -> None:
        async with cluster(tmp_path) as c:
            (result,) = await c.create(pb.NewTopic(
                name="manual", num_partitions=-1, replication_factor=-1,
                assignments={0: pb.Replicas(node_ids=[2, 0]), 1: pb.Replicas(node_ids=[1, 2])}))
            assert result.error_code == OK
            assert (result.num_partitions, result.replication_factor) == (2, 2)
            parts = partitions_of(await c.metadata(), "manual")
            assert [(p.leader, list(p.replicas)) for p in parts] == [(2, [2, 0]), (1, [1, 2])]
            assert c.nodes[0].service.created_partitions() == {("manual", 0)}
            assert c.nodes[2].service.created_partitions() == {("manual", 0), ("manual", 1)}

    asyncio.run(scenario())


def test_leaders_of_successive_topics_rotate(tmp_path: Path):
    async def scenario() -> None:
        async with cluster(tmp_path) as c:
            names = [f"single-{i}" for i in range(6)]
            for name in names:
                (result,) = await c.create(new_topic(name, 1, 1))
                assert result.error_code == OK
            metadata = await c.metadata()
            leaders = [partitions_of(metadata, n)[0].leader for n in names]
            assert leaders == [0, 1, 2, 0, 1, 2]

    asyncio.run(scenario())


def test_metadata_survives_a_restart(tmp_path: Path):
    async def scenario() -> None:
        async with cluster(tmp_path) as c:
            await c.create(new_topic("kept", 3, 2, cleanup_policy="compact"), new_topic("gone"))
            await c.delete(names=("gone",))
            before = await c.metadata()
            await c.stop_replicator()
            doc = json.loads((c.data_dir / "metadata.json").read_text())
            assert [t["name"] for t in doc["topics"]] == ["kept"]

            await c.start_replicator()
            after = await c.metadata()
            assert after.cluster_id == before.cluster_id
            assert after.version > before.version
            assert [n.alive for n in after.log_nodes] == [True, True, True]
            assert list(after.topics) == list(before.topics)
            # The round-robin continues where it left off.
            (result,) = await c.create(new_topic("next", 1, 1))
            assert result.error_code == OK
            assert partitions_of(await c.metadata(), "next")[0].leader == 2
            (again,) = await c.create(new_topic("kept"))
            assert again.error_code == ErrorCode.topic_already_exists.value

    asyncio.run(scenario())


def test_cluster_id_is_configurable_and_must_match_the_data(tmp_path: Path):
    async def scenario() -> None:
        async with cluster(tmp_path, cluster_id="MyClusterId0123456789a") as c:
            assert (await c.metadata()).cluster_id == "MyClusterId0123456789a"
            await c.stop_replicator()
            with pytest.raises(ValueError, match="MyClusterId"):
                await c.start_replicator(cluster_id="AnotherCluster")
            await c.start_replicator(cluster_id="")
            assert (await c.metadata()).cluster_id == "MyClusterId0123456789a"

    asyncio.run(scenario())


def test_get_metadata_for_named_topics(tmp_path: Path):
    async def scenario() -> None:
        async with cluster(tmp_path) as c:
            await c.create(new_topic("a"), new_topic("b"), new_topic("c"))
            named = await c.metadata("c", "missing", "a", "c")
            assert [t.name for t in named.topics] == ["c", "a"]
            assert len(named.log_nodes) == 3

    asyncio.run(scenario())


def test_watch_metadata_streams_every_change(tmp_path: Path):
    async def scenario() -> None:
        async with cluster(tmp_path) as c:
            streams = [c.stub.WatchMetadata(pb.WatchMetadataRequest()) for _ in range(20)]
            firsts = [await asyncio.wait_for(s.read(), 5) for s in streams]
            start = firsts[0]
            assert all(f == start for f in firsts) and not start.topics
            await wait_for(lambda: _is(c.service.controller.publisher.watchers, 20))

            await c.create(new_topic("watched", 2, 1))
            for s in streams:
                update = await asyncio.wait_for(s.read(), 5)
                assert update.version > start.version
                assert [t.name for t in update.topics] == ["watched"]
            created_version = update.version

            await c.delete(names=("watched",))
            for s in streams[:5]:
                update = await asyncio.wait_for(s.read(), 5)
                assert update.version > created_version and not update.topics

            # Watchers that go away are forgotten.
            for s in streams:
                s.cancel()
            await wait_for(lambda: _is(c.service.controller.publisher.watchers, 0))

    asyncio.run(scenario())


async def _is(value: int, expected: int) -> bool:
    return value == expected


def test_stopping_the_replicator_ends_watch_streams(tmp_path: Path):
    async def scenario() -> None:
        async with cluster(tmp_path) as c:
            stream = c.stub.WatchMetadata(pb.WatchMetadataRequest())
            await asyncio.wait_for(stream.read(), 5)
            service, c.service = c.service, None
            await service.stop(5)
            assert await asyncio.wait_for(stream.read(), 5) == grpc.aio.EOF
            assert await stream.code() == grpc.StatusCode.OK

    asyncio.run(scenario())


def test_log_node_liveness_follows_health_checks(tmp_path: Path):
    async def scenario() -> None:
        async with cluster(tmp_path) as c:
            (spread,) = await c.create(new_topic("spread", 3, 3))
            assert spread.error_code == OK
            version = (await c.metadata()).version
            await c.nodes[2].stop()
            await wait_for(lambda: _not(c.node_alive(2)))
            metadata = await c.metadata()
            assert metadata.version > version and metadata.controller_id == 0
            for p in partitions_of(metadata, "spread"):
                assert list(p.offline_replicas) == [2]

            (refused,) = await c.create(new_topic("three", 1, 3))
            assert refused.error_code == ErrorCode.invalid_replication_factor.value
            assert "only 2" in refused.error_message
            (placed,) = await c.create(new_topic("two", 4, 2))
            assert placed.error_code == OK
            for p in partitions_of(await c.metadata(), "two"):
                assert set(p.replicas) == {0, 1}

            await c.nodes[0].stop()
            await wait_for(lambda: _not(c.node_alive(0)))
            assert (await c.metadata()).controller_id == 1

            await c.nodes[2].start()
            await c.nodes[0].start()
            await wait_for(lambda: c.node_alive(2))
            await wait_for(lambda: c.node_alive(0))
            assert (await c.metadata()).controller_id == 0
            (accepted,) = await c.create(new_topic("three", 1, 3))
            assert accepted.error_code == OK

    asyncio.run(scenario())


def test_a_silent_node_is_fenced_only_after_the_session_timeout(tmp_path: Path):
    """A node that accepts connections but never answers (a hung process: stopped or
    overloaded) is not alive, and fenced only once silent for the session timeout."""
    async def scenario() -> None:
        with _silent_listener() as port:
            silent = FakeLogNode(2)
            silent.port = port
            c = Cluster(data_dir=tmp_path / "replicator",
                        nodes=[FakeLogNode(0), FakeLogNode(1), silent],
                        defaults={"node_session_timeout_ms": 2000})
            for fake in c.nodes[:2]:
                await fake.start()
            started = time.monotonic()
            await c.start_replicator()
            try:
                assert not await c.node_alive(2)
                assert not await _fenced(c, 2)
                await wait_for(lambda: _fenced(c, 2))
                assert time.monotonic() - started >= 2.0
            finally:
                await c.stop_replicator()
                for fake in c.nodes[:2]:
                    await fake.stop()

    asyncio.run(scenario())


def test_a_node_whose_process_exited_is_fenced_at_once(tmp_path: Path):
    """A node whose port refuses connections has exited: fenced without waiting for the
    session timeout (an hour here), and no longer once it is back."""
    async def scenario() -> None:
        async with cluster(tmp_path, node_session_timeout_ms=3_600_000) as c:
            (created,) = await c.create(new_topic("exits", 1, 3))
            assert created.error_code == OK
            (before,) = partitions_of(await c.metadata(), "exits")
            await c.nodes[before.leader].stop()
            await wait_for(lambda: _fenced(c, before.leader), within=5.0)
            (after,) = partitions_of(await c.metadata(), "exits")
            assert after.leader != before.leader
            assert after.leader_epoch == before.leader_epoch + 1
            assert before.leader not in after.isr
            await c.nodes[before.leader].start()
            await wait_for(lambda: c.node_alive(before.leader))
            assert not await _fenced(c, before.leader)

    asyncio.run(scenario())


@contextlib.contextmanager
def _silent_listener() -> Iterator[int]:
    """A port whose connections the kernel accepts and nobody reads, as a stopped process's
    are."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield listener.getsockname()[1]


def test_a_node_reporting_a_failed_log_dir_is_fenced_at_once_until_it_serves_again(
        tmp_path: Path, caplog: pytest.LogCaptureFixture):
    """A node that answers its health check with LogService NOT_SERVING (its log dir failed)
    is fenced without waiting for the session timeout: its partitions get new leaders from
    their ISR, it leaves the ISRs and gets no new replicas; serving again, it is alive."""
    async def scenario() -> None:
        async with cluster(tmp_path, node_session_timeout_ms=60_000) as c:
            (created,) = await c.create(new_topic("t", 6, 3))
            assert created.error_code == OK
            led = [p.partition for p in partitions_of(await c.metadata(), "t") if p.leader == 2]
            assert led
            await c.nodes[2].health.set(SERVICE_NAME, health_pb2.HealthCheckResponse.NOT_SERVING)
            await wait_for(lambda: _fenced(c, 2), within=5)
            metadata = await c.metadata()
            for p in partitions_of(metadata, "t"):
                assert p.leader != 2 and 2 not in p.isr, p
            (placed,) = await c.create(new_topic("later", 4, 2))
            assert placed.error_code == OK
            assert all(2 not in p.replicas for p in partitions_of(await c.metadata(), "later"))
            await asyncio.sleep(0.3)  # several checks: still one line for the event
            await c.nodes[2].health.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
            await wait_for(lambda: c.node_alive(2))
            assert not await _fenced(c, 2)

    with caplog.at_level(logging.INFO):
        asyncio.run(scenario())
    lines = [r.getMessage() for r in caplog.records if "failed log dir" in r.getMessage()]
    assert len(lines) == 1, lines


async def _fenced(c: Cluster, node_id: int) -> bool:
    return next(n.fenced for n in (await c.metadata()).log_nodes if n.node_id == node_id)


async def _not(value) -> bool:
    return not await value


def test_no_live_log_node(tmp_path: Path):
    async def scenario() -> None:
        async with cluster(tmp_path, nodes=1) as c:
            await c.nodes[0].stop()
            await wait_for(lambda: _not(c.node_alive(0)))
            assert (await c.metadata()).controller_id == -1
            (result,) = await c.create(new_topic("t"))
            assert result.error_code == ErrorCode.invalid_replication_factor.value

    asyncio.run(scenario())


def test_delete_topics_by_name_and_id(tmp_path: Path):
    async def scenario() -> None:
        async with cluster(tmp_path) as c:
            a, b, keep = await c.create(new_topic("a", 2, 2), new_topic("b", 1, 3),
                                        new_topic("keep"))
            version = (await c.metadata()).version
            missing_id = str(uuid.uuid4())
            results = await c.delete(names=("a", "nope"), ids=(b.topic_id, missing_id, "junk"))
            assert [(r.name, r.error_code) for r in results] == [
                ("a", OK),
                ("nope", ErrorCode.unknown_topic_or_partition.value),
                ("b", OK),
                ("", ErrorCode.unknown_topic_id.value),
                ("", ErrorCode.unknown_topic_id.value),
            ]
            assert results[0].topic_id == a.topic_id and results[2].topic_id == b.topic_id
            metadata = await c.metadata()
            assert [t.name for t in metadata.topics] == ["keep"]
            assert metadata.version == version + 1
            for node in c.nodes:
                created = node.service.created_partitions()
                assert set(node.service.deleted) == created - {("keep", 0)}
            doc = json.loads((c.data_dir / "metadata.json").read_text())
            assert doc["pending_deletions"] == {}

            (again,) = await c.create(new_topic("a"))
            assert again.error_code == OK and again.topic_id != a.topic_id

    asyncio.run(scenario())


def test_deleting_while_a_node_is_down_finishes_when_it_returns(tmp_path: Path):
    async def scenario() -> None:
        async with cluster(tmp_path) as c:
            (t,) = await c.create(new_topic("t", 3, 3))
            await c.nodes[1].stop()
            await wait_for(lambda: _not(c.node_alive(1)))
            (result,) = await c.delete(names=("t",))
            assert result.error_code == OK
            assert not (await c.metadata()).topics
            assert set(c.nodes[0].service.deleted) == {("t", 0), ("t", 1), ("t", 2)}
            assert c.nodes[1].service.deleted == []
            doc = json.loads((c.data_dir / "metadata.json").read_text())
            assert sorted(map(tuple, doc["pending_deletions"]["1"])) == [
                ("t", 0), ("t", 1), ("t", 2)]

            await c.nodes[1].start()

            async def deleted_on_node_1() -> bool:
                return set(c.nodes[1].service.deleted) == {("t", 0), ("t", 1), ("t", 2)}

            await wait_for(deleted_on_node_1)
            await wait_for(lambda: _is(len(c.service.controller.image.pending_deletions), 0))

    asyncio.run(scenario())


def test_concurrent_creates_of_one_name_have_one_winner(tmp_path: Path):
    async def scenario() -> None:
        async with cluster(tmp_path) as c:
            replies = await asyncio.gather(*(c.create(new_topic("race", 3, 2))
                                             for _ in range(10)))
            codes = Counter(r.error_code for (r,) in replies)
            assert codes == {OK: 1, ErrorCode.topic_already_exists.value: 9}
            assert sum(len(n.service.created) for n in c.nodes) == 6

    asyncio.run(scenario())


def test_a_failing_log_node_fails_its_topics_and_commits_nothing(tmp_path: Path):
    async def scenario() -> None:
        async with cluster(tmp_path) as c:
            version = (await c.metadata()).version
            c.nodes[1].service.partition_error = ErrorCode.kafka_storage_error.value
            (broken,) = await c.create(new_topic("broken", 3, 3))
            assert broken.error_code == ErrorCode.kafka_storage_error.value
            assert "log node 1" in broken.error_message
            metadata = await c.metadata()
            assert not metadata.topics and metadata.version == version
            # Replicas made on the healthy nodes were removed again.
            for node in (c.nodes[0], c.nodes[2]):
                assert set(node.service.deleted) == node.service.created_partitions("broken")

            c.nodes[1].service.partition_error = 0
            c.nodes[1].service.fail_status = grpc.StatusCode.INTERNAL
            # Topics not touching node 1 still succeed in the same request.
            results = await c.create(
                new_topic("unlucky", 1, 3),
                pb.NewTopic(name="lucky", num_partitions=-1, replication_factor=-1,
                            assignments={0: pb.Replicas(node_ids=[0, 2])}),
            )
            assert [(r.name, r.error_code) for r in results] == [
                ("unlucky", ErrorCode.request_timed_out.value), ("lucky", OK)]
            assert [t.name for t in (await c.metadata()).topics] == ["lucky"]

            c.nodes[1].service.fail_status = None
            (fixed,) = await c.create(new_topic("broken", 3, 3))
            assert fixed.error_code == OK

    asyncio.run(scenario())


def test_replicas_span_racks_when_log_nodes_have_them(tmp_path: Path):
    async def scenario() -> None:
        async with cluster(tmp_path, nodes=4) as c:
            await c.stop_replicator()
            racks = {n.node_id: "ab"[n.node_id // 2] for n in c.nodes}  # a: 0, 1; b: 2, 3
            await c.start_replicator(
                log_nodes=tuple(f"{n.entry}@{racks[n.node_id]}" for n in c.nodes))
            await wait_for(lambda: _all_alive(c))
            [result] = await c.create(new_topic("racked", 4, 2))
            assert result.error_code == 0
            metadata = await c.metadata("racked")
            assert {n.node_id: n.rack for n in metadata.log_nodes} == {
                0: "a", 1: "a", 2: "b", 3: "b"}
            for p in metadata.topics[0].partitions:
                assert {racks[r] for r in p.replicas} == {"a", "b"}

    asyncio.run(scenario())


async def _all_alive(c) -> bool:
    metadata = await c.metadata()
    return all(n.alive for n in metadata.log_nodes)
