"""The replicated metadata log against real log nodes (gRPC servers on 127.0.0.1, data in
tmp_path): record codec, round trip, majority writes with a node down, a node that comes back
with stale data, fencing of a deposed writer, racing takeovers and a takeover that reached only
a minority, a deposed controller, a restarted replicator without its data directory, and
waiting for the log nodes at start-up."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import grpc
import pytest

from kbroker.log.v1 import log_pb2
from kbroker.replicator.v1 import replicator_pb2 as pb
from services.common.errors import ErrorCode
from services.common.records.record_batch import iter_batches
from services.log.log_validator import check_keys, validate_append
from services.replicator.controller import Controller
from services.replicator.grpc_log_nodes import GrpcLogNodes
from services.replicator.log_nodes import parse_log_nodes
from services.replicator.metadata import (
    LogNode,
    MetadataImage,
    NodeId,
    PartitionRegistration,
    TopicName,
    TopicRegistration,
    new_topic_id,
)
from services.replicator.metadata_log import (
    METADATA_TOPIC,
    DeposedError,
    MetadataLog,
    MetadataLogError,
    MetadataRecord,
    decode_records,
    encode_record,
)
from services.replicator.metadata_store import FILE_NAME

from .replication.harness import Node, replication, wait_for


def image_with(version: int, *topics: str, next_producer_id: int = 0) -> MetadataImage:
    registrations = [
        TopicRegistration(
            name=TopicName(name), topic_id=new_topic_id(), configs={"retention.ms": "1000"},
            partitions=(PartitionRegistration(partition=0, leader=NodeId(1), leader_epoch=3,
                                              replicas=(NodeId(1), NodeId(0)),
                                              isr=(NodeId(1),)),))
        for name in topics
    ]
    return MetadataImage(cluster_id="cluster-a", version=version,
                         topics={t.name: t for t in registrations}, next_leader_index=len(topics),
                         pending_deletions={NodeId(2): frozenset({("gone", 0)})},
                         next_producer_id=next_producer_id)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.asynccontextmanager
async def log_nodes(tmp_path: Path, count: int = 3, start: bool = True
                    ) -> AsyncIterator[list[Node]]:
    nodes = [Node(i, tmp_path / f"log-{i}", "", port=free_port()) for i in range(count)]
    try:
        if start:
            for node in nodes:
                await node.start()
        yield nodes
    finally:
        for node in nodes:
            await node.stop()


async def eventually(attempt: Callable[[], Awaitable[object]], within: float = 10.0) -> None:
    """Retry ``attempt`` while it raises OSError, for up to ``within`` seconds."""
    deadline = asyncio.get_running_loop().time() + within
    while True:
        try:
            await attempt()
            return
        except OSError:
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.1)


def configured(nodes: list[Node]) -> tuple[LogNode, ...]:
    return parse_log_nodes([n.entry for n in nodes])


@contextlib.asynccontextmanager
async def metadata_log(nodes: list[Node], **options: object) -> AsyncIterator[MetadataLog]:
    store = MetadataLog(configured(nodes), call_timeout=2.0, **options)  # type: ignore[arg-type]
    try:
        yield store
    finally:
        await store.close()


async def last_record(node: Node) -> tuple[MetadataRecord | None, int]:
    """The node's last image record and that batch's partition leader epoch (retrying while a
    restarted node's channel reconnects)."""
    deadline = asyncio.get_running_loop().time() + 10
    while True:
        try:
            data = await node.read_all(METADATA_TOPIC)
            break
        except grpc.aio.AioRpcError:
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.1)
    images = [(offset, r) for offset, r in decode_records(data) if not r.is_claim]
    if not images:
        return None, -1
    offset, record = images[-1]
    epochs = {b.header.base_offset: b.header.partition_leader_epoch for b in iter_batches(data)}
    return record, epochs[offset]


async def until_holds(node: Node, image: MetadataImage, within: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while (await last_record(node))[0] is None or (await last_record(node))[0].image != image:
        assert asyncio.get_running_loop().time() < deadline, "the image never got there"
        await asyncio.sleep(0.05)


# --- the record codec ----------------------------------------------------------------------


def test_records_are_keyed_v2_batches_a_log_node_accepts_and_reads_back() -> None:
    record = MetadataRecord(controller_epoch=7, writer="w", sequence=12,
                            image=image_with(5, "a", "b"))
    batch = encode_record(record, 1_700_000_000_000)
    (validated,) = validate_append(batch, 1 << 20)  # magic, sizes, CRC-32C
    assert validated.header.partition_leader_epoch == 7
    assert validated.header.record_count == 1
    # Compacted topics need keys.
    assert check_keys(batch, [validated], "__cluster_metadata-0") is None
    claim = MetadataRecord(controller_epoch=8, writer="v", sequence=13, image_offset=41)
    claim_batch = encode_record(claim, 0)
    assert claim.is_claim and not record.is_claim
    decoded = decode_records(batch + claim_batch + batch[:30])  # a torn tail is left out
    assert decoded == [(0, record), (0, claim)]  # offsets are the log node's to assign
    assert decode_records(b"") == []


def test_a_batch_that_is_not_a_metadata_record_is_refused() -> None:
    batch = bytearray(encode_record(MetadataRecord(controller_epoch=1, writer="w", sequence=1,
                                                   image=image_with(1)), 0))
    batch[-5] ^= 0xFF
    with pytest.raises(ValueError):
        decode_records(bytes(batch))


# --- against log nodes ---------------------------------------------------------------------


def test_round_trip_through_every_log_node(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with log_nodes(tmp_path) as nodes:
            async with metadata_log(nodes) as store:
                assert await store.load() is None  # a new cluster
                assert store.controller_epoch == 1
                image = image_with(2, "orders", "payments", next_producer_id=4000)
                await store.save(image)
            for node in nodes:
                record, leader_epoch = await last_record(node)
                assert record is not None and record.image == image
                assert record.controller_epoch == leader_epoch == 1
                # The new cluster's claim, then its first image.
                records = decode_records(await node.read_all(METADATA_TOPIC))
                assert [(o, r.is_claim, r.controller_epoch) for o, r in records] == [
                    (0, True, 1), (1, False, 1)]
            async with metadata_log(nodes) as again:
                assert await again.load() == image
                assert again.controller_epoch == 2
            # The takeover wrote the image back under the new epoch everywhere.
            for node in nodes:
                record, leader_epoch = await last_record(node)
                assert record is not None and record.image == image
                assert record.controller_epoch == leader_epoch == 2

    asyncio.run(scenario())


def test_a_majority_commits_and_a_minority_does_not(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with log_nodes(tmp_path) as nodes, metadata_log(nodes) as store:
            assert await store.load() is None
            await store.save(image_with(1))
            await nodes[2].stop()
            await store.save(image_with(2, "a"))  # two of three
            await nodes[1].stop()
            with pytest.raises(MetadataLogError) as failed:
                await store.save(image_with(3, "a", "b"))
            assert not isinstance(failed.value, DeposedError)
            assert isinstance(failed.value, OSError)
            assert "reached 1 of 3" in str(failed.value)
            await nodes[1].start()
            committed = image_with(3, "a", "c")
            # Once the channel to the returning node reconnects (a backoff of 100 ms and up).
            await eventually(lambda: store.save(committed))
            for node in nodes[:2]:
                record, _ = await last_record(node)
                assert record is not None and record.image == committed

    asyncio.run(scenario())


def test_a_node_back_with_stale_data_neither_wins_nor_blocks(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with log_nodes(tmp_path) as nodes:
            async with metadata_log(nodes) as writer:
                await writer.load()
                first = image_with(1, "old")
                await writer.save(first)
                await until_holds(nodes[2], first)  # a save waits for a majority only
                await nodes[2].stop()
                await writer.save(image_with(2, "old", "new"))
                latest = image_with(3, "old", "new", "newest")
                await writer.save(latest)
                # Node 2 comes back holding version 1; commits go on and repair it.
                await nodes[2].start()
                record, _ = await last_record(nodes[2])
                assert record is not None and set(record.image.topics) == {"old"}
                for producer_ids in range(1000, 100_000, 1000):
                    latest = latest.replace(next_producer_id=producer_ids)
                    await writer.save(latest)
                    record, _ = await last_record(nodes[2])
                    if record is not None and record.image == latest:
                        break
                    await asyncio.sleep(0.05)
                assert record is not None and record.image == latest
            # A replica that missed writes and a majority read without the freshest one.
            await nodes[2].stop()
            async with metadata_log(nodes) as writer:
                assert await writer.load() == latest
                await writer.save(latest.replace(version=4))
            await nodes[0].stop()
            await nodes[2].start()  # stale: it lacks version 4
            async with metadata_log(nodes) as reader:
                loaded = await reader.load()
                assert loaded is not None and loaded.version == 4

    asyncio.run(scenario())


def test_a_deposed_writer_is_fenced_and_its_write_never_becomes_the_state(tmp_path: Path
                                                                          ) -> None:
    async def scenario() -> None:
        async with log_nodes(tmp_path) as nodes:
            async with metadata_log(nodes) as old, metadata_log(nodes) as new:
                await old.load()
                committed = image_with(1, "kept")
                await old.save(committed)
                assert await new.load() == committed  # takes over at epoch 2
                assert new.controller_epoch == old.controller_epoch + 1
                with pytest.raises(DeposedError):
                    await old.save(image_with(2, "lost"))
                assert old.deposed
                with pytest.raises(DeposedError):  # for good
                    await old.save(image_with(2, "lost"))
                await new.save(image_with(2, "kept", "also"))
            async with metadata_log(nodes) as third:
                loaded = await third.load()
                assert loaded is not None and set(loaded.topics) == {"kept", "also"}

    asyncio.run(scenario())


def test_racing_takeovers_leave_one_writer(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with log_nodes(tmp_path) as nodes:
            async with metadata_log(nodes) as first:
                await first.load()
                await first.save(image_with(1, "t"))
            async with metadata_log(nodes) as a, metadata_log(nodes) as b:
                loads = await asyncio.gather(a.load(), b.load(), return_exceptions=True)
                loaded = [w for w, outcome in zip((a, b), loads, strict=True)
                          if not isinstance(outcome, BaseException)]
                assert loaded, loads
                assert len({w.controller_epoch for w in loaded}) == len(loaded)
                newest = max(loaded, key=lambda w: w.controller_epoch)
                outcomes = await asyncio.gather(
                    *(w.save(image_with(2, f"from-{w.writer_id}")) for w in loaded),
                    return_exceptions=True)
                for writer, outcome in zip(loaded, outcomes, strict=True):
                    if writer is newest:
                        assert outcome is None
                    else:
                        assert isinstance(outcome, DeposedError)
            async with metadata_log(nodes) as reader:
                result = await reader.load()
                assert result is not None and set(result.topics) == {f"from-{newest.writer_id}"}

    asyncio.run(scenario())


def test_a_takeover_that_reached_a_minority_hides_no_later_commit(tmp_path: Path) -> None:
    """A claim left on one replica by a replicator whose takeover failed carries no image: a
    commit of the old writer on the other replicas stays the newest image."""

    async def scenario() -> None:
        async with log_nodes(tmp_path) as nodes:
            async with metadata_log(nodes) as old:
                await old.load()
                await old.save(image_with(1, "first"))
                # The leftover claim of a newer epoch, on node 0 only.
                state = await nodes[0].describe(METADATA_TOPIC)
                claim = MetadataRecord(controller_epoch=old.controller_epoch + 1,
                                       writer="lost", sequence=10_000,
                                       image_offset=state.log_end_offset - 1)
                appended = await nodes[0].stub.Append(log_pb2.AppendRequest(partitions=[
                    log_pb2.PartitionAppend(topic=METADATA_TOPIC, partition=0,
                                            records=encode_record(claim, 0),
                                            expected_log_end_offset=state.log_end_offset)]))
                assert appended.results[0].error_code == 0
                await nodes[0].stop()
                committed = image_with(2, "first", "second")
                await old.save(committed)  # nodes 1 and 2
            await nodes[0].start()
            await nodes[2].stop()
            async with metadata_log(nodes) as reader:  # nodes 0 and 1
                assert await reader.load() == committed
                assert reader.controller_epoch == claim.controller_epoch + 1

    asyncio.run(scenario())


async def create(controller: Controller, name: str) -> list[pb.TopicResult]:
    reply = await controller.topics.create_topics(pb.CreateTopicsRequest(topics=[
        pb.NewTopic(name=name, num_partitions=-1, replication_factor=-1)]))
    return list(reply.topics)


def test_a_deposed_controller_keeps_its_image_and_says_so(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with log_nodes(tmp_path) as nodes:
            configured_nodes = configured(nodes)
            client = GrpcLogNodes(configured_nodes)
            controller = await Controller.open(
                store=MetadataLog(configured_nodes, call_timeout=2.0), client=client,
                log_nodes=configured_nodes)
            try:
                (created,) = await create(controller, "a")
                assert created.error_code == ErrorCode.none.value
                async with metadata_log(nodes) as usurper:
                    await usurper.load()
                before = controller.image
                (refused,) = await create(controller, "b")
                assert refused.error_code == ErrorCode.unknown_server_error.value
                assert "deposed" in refused.error_message
                assert controller.deposed.is_set()
                assert controller.image is before and "b" not in controller.image.topics
            finally:
                await controller.close()
                await client.close()

    asyncio.run(scenario())


def test_the_metadata_topic_name_is_reserved(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with log_nodes(tmp_path, count=1) as nodes:
            configured_nodes = configured(nodes)
            client = GrpcLogNodes(configured_nodes)
            controller = await Controller.open(
                store=MetadataLog(configured_nodes), client=client, log_nodes=configured_nodes)
            try:
                (result,) = await create(controller, METADATA_TOPIC)
                assert result.error_code == ErrorCode.invalid_request.value
            finally:
                await controller.close()
                await client.close()

    asyncio.run(scenario())


def test_start_up_waits_for_a_majority_and_gives_up_in_time(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with log_nodes(tmp_path, start=False) as nodes:
            async with metadata_log(nodes, start_timeout=0.5) as store:
                loop = asyncio.get_running_loop()
                started = loop.time()
                with pytest.raises(MetadataLogError) as failed:
                    await store.load()
                assert "0 of 3 log nodes answered" in str(failed.value)
                assert loop.time() - started < 10
            async with metadata_log(nodes, start_timeout=30) as store:
                loading = asyncio.create_task(store.load())
                await asyncio.sleep(0.5)
                assert not loading.done()
                await nodes[0].start()
                await asyncio.sleep(0.3)
                assert not loading.done()  # one of three is not a majority
                await nodes[1].start()
                assert await asyncio.wait_for(loading, 20) is None

    asyncio.run(scenario())


def test_a_replicator_without_its_data_directory_rebuilds_everything(tmp_path: Path) -> None:
    """The whole replicator on the metadata log: topics, leaders, epochs, ISR, configs,
    cluster id and producer ids survive losing its data directory, and versions go on."""

    async def scenario() -> None:
        async with replication(tmp_path, nodes=3) as r:
            await r.create_topic("kept", partitions=3, replication=3, retention_ms="60000")
            await r.create_topic("single", partitions=2, replication=1)
            await wait_for(lambda: _isr_full(r, "kept", 3))
            block = await r.stub.AllocateProducerIds(pb.AllocateProducerIdsRequest())
            before = await r.stub.GetMetadata(pb.GetMetadataRequest())
            await r.stop_replicator()
            shutil.rmtree(tmp_path / "replicator", ignore_errors=True)
            await r.start_replicator()
            after = await r.stub.GetMetadata(pb.GetMetadataRequest())
            assert after.cluster_id == before.cluster_id
            assert after.version > before.version
            assert _topics(after) == _topics(before)
            again = await r.stub.AllocateProducerIds(pb.AllocateProducerIdsRequest())
            assert again.producer_id_start == block.producer_id_start + block.producer_id_len
            assert not (tmp_path / "replicator" / FILE_NAME).exists()

    asyncio.run(scenario())


async def _isr_full(r, topic: str, partitions: int) -> bool:  # type: ignore[no-untyped-def]
    metadata = await r.stub.GetMetadata(pb.GetMetadataRequest(topics=[topic]))
    return all(len(p.isr) == len(p.replicas) for p in metadata.topics[0].partitions) and len(
        metadata.topics[0].partitions) == partitions


def _topics(metadata: pb.ClusterMetadata) -> dict[str, object]:
    return {
        t.name: (t.topic_id, dict(t.configs), [
            (p.partition, p.leader, p.leader_epoch, list(p.replicas), list(p.isr))
            for p in t.partitions])
        for t in metadata.topics
    }


def test_the_metadata_partition_is_compacted_and_flushed(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with log_nodes(tmp_path, count=1) as nodes:
            async with metadata_log(nodes) as store:
                await store.load()
                await store.save(image_with(1))
            stored = json.loads((nodes[0].data_dir / f"{METADATA_TOPIC}-0" /
                                 "partition.metadata.json").read_text())
            assert stored["configs"]["cleanup.policy"] == "compact"
            assert stored["configs"]["flush.messages"] == "1"
            # Created without a replica state: a standalone leader keeping the writer's epoch.
            state = await nodes[0].describe(METADATA_TOPIC)
            assert state.role == log_pb2.REPLICA_ROLE_LEADER

    asyncio.run(scenario())
