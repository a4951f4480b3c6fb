"""OffsetForLeaderEpoch: routed to each partition's leader, epochs checked against the
metadata, answers per partition."""

from __future__ import annotations

import asyncio

from kbroker.kafka.v1 import kafka_pb2 as k
from kbroker.log.v1 import log_pb2
from services.common.errors import ErrorCode
from services.handler.apis.leader_epochs import OffsetForLeaderEpochApi
from services.handler.collaborators import UnreachableError
from services.handler.metadata_cache import MetadataCache

from .fakes import CONTEXT, cache_of, cluster, topic

EpochPartition = k.OffsetForLeaderEpochRequest.OffsetForLeaderPartition


class FakeEpochs:
    """Leaders that know epochs 0 (offsets 0..9) and 3 (from 10 to the log end, 25)."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, list[tuple[str, int, int]]]] = []
        self.failures: dict[int, Exception] = {}

    async def offset_for_leader_epoch(self, node, request, time_limit):  # type: ignore[no-untyped-def]
        self.calls.append((node.node_id, [(q.topic, q.partition, q.leader_epoch)
                                          for q in request.partitions]))
        if node.node_id in self.failures:
            raise self.failures[node.node_id]
        out = log_pb2.OffsetForLeaderEpochResponse()
        for q in request.partitions:
            if q.leader_epoch < 0:
                answer = (-1, -1)
            elif q.leader_epoch >= 3:
                answer = (3, 25) if q.leader_epoch == 3 else (-1, -1)
            else:
                answer = (0, 10)
            out.results.add(topic=q.topic, partition=q.partition, leader_epoch=answer[0],
                            end_offset=answer[1])
        return out


def ask(*partitions: EpochPartition, name: str = "t") -> k.OffsetForLeaderEpochRequest:
    return k.OffsetForLeaderEpochRequest(topics=[{"topic": name, "partitions": partitions}])


def answers(response) -> list[tuple[int, int, int, int]]:
    return [(p.partition, p.error_code, p.leader_epoch, p.end_offset)
            for t in response.topics for p in t.partitions]


def test_end_offsets_come_from_each_leader():
    epochs = FakeEpochs()
    snapshot = cluster(topic("t", 3, leaders=[0, 1, 0], epoch=3), nodes=(0, 1))
    api = OffsetForLeaderEpochApi(cache_of(snapshot), epochs)
    response = asyncio.run(api.handle(ask(
        EpochPartition(partition=0, leader_epoch=3, current_leader_epoch=3),
        EpochPartition(partition=1, leader_epoch=1),
        EpochPartition(partition=2, leader_epoch=7)), CONTEXT))
    assert answers(response) == [(0, 0, 3, 25), (1, 0, 0, 10), (2, 0, -1, -1)]
    assert sorted(epochs.calls) == [(0, [("t", 0, 3), ("t", 2, 7)]), (1, [("t", 1, 1)])]


def test_epochs_unknown_partitions_and_unreachable_leaders_are_per_partition_errors():
    epochs = FakeEpochs()
    epochs.failures[1] = UnreachableError("down")
    snapshot = cluster(topic("t", 2, leaders=[0, 1], epoch=3), nodes=(0, 1))
    api = OffsetForLeaderEpochApi(cache_of(snapshot), epochs)
    response = asyncio.run(api.handle(ask(
        EpochPartition(partition=0, leader_epoch=3, current_leader_epoch=2),
        EpochPartition(partition=0, leader_epoch=3, current_leader_epoch=4),
        EpochPartition(partition=1, leader_epoch=3),
        EpochPartition(partition=5, leader_epoch=3)), CONTEXT))
    assert [(p, e) for p, e, _, _ in answers(response)] == [
        (0, ErrorCode.fenced_leader_epoch.value), (0, ErrorCode.unknown_leader_epoch.value),
        (1, ErrorCode.not_leader_or_follower.value),
        (5, ErrorCode.unknown_topic_or_partition.value)]
    missing = asyncio.run(api.handle(ask(EpochPartition(partition=0, leader_epoch=0),
                                         name="nope"), CONTEXT))
    assert answers(missing) == [(0, ErrorCode.unknown_topic_or_partition.value, -1, -1)]


def test_an_unset_epoch_asks_for_no_epoch():
    """A hand-made request without leader_epoch asks about epoch -1 (none), not epoch 0."""
    epochs = FakeEpochs()
    api = OffsetForLeaderEpochApi(cache_of(cluster(topic("t", epoch=3))), epochs)
    response = asyncio.run(api.handle(ask(EpochPartition(partition=0)), CONTEXT))
    assert answers(response) == [(0, 0, -1, -1)]
    assert epochs.calls == [(0, [("t", 0, -1)])]


def test_without_metadata_every_partition_is_not_leader():
    async def main():
        async def down():
            raise ConnectionError("no replicator")

        api = OffsetForLeaderEpochApi(MetadataCache(down), FakeEpochs())
        return await api.handle(ask(EpochPartition(partition=0, leader_epoch=1)), CONTEXT)

    assert answers(asyncio.run(main())) == [
        (0, ErrorCode.not_leader_or_follower.value, -1, -1)]
