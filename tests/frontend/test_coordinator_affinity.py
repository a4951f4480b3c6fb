"""Coordinator requests of one internal-topic partition go to one handler: the frontend finds
the partition as the handlers do, every frontend ranks the handlers alike, and a handler that
cannot be reached is passed over."""

from __future__ import annotations

import asyncio

from kbroker.kafka.v1 import kafka_pb2 as k
from kbroker.replicator.v1 import replicator_pb2
from services.common.coordinator_keys import partition_for
from services.frontend.coordinator_affinity import CoordinatorAffinity, coordinator_key
from services.frontend.handler_pool import HandlerCallError, HandlerPool

from .fake_handler import FakeHandler


def test_each_coordinator_api_names_its_key_and_others_none() -> None:
    group, txn = "__consumer_offsets", "__transaction_state"
    assert coordinator_key(8, k.OffsetCommitRequest(group_id="g")) == (group, "g")
    assert coordinator_key(11, k.JoinGroupRequest(group_id="g")) == (group, "g")
    assert coordinator_key(68, k.ConsumerGroupHeartbeatRequest(group_id="g")) == (group, "g")
    # TxnOffsetCommit writes the group's offsets: the group's coordinator.
    assert coordinator_key(28, k.TxnOffsetCommitRequest(transactional_id="t", group_id="g")) \
        == (group, "g")
    assert coordinator_key(9, k.OffsetFetchRequest(group_id="g")) == (group, "g")
    assert coordinator_key(9, k.OffsetFetchRequest(groups=[{"group_id": "g"}])) == (group, "g")
    assert coordinator_key(9, k.OffsetFetchRequest(
        groups=[{"group_id": "g"}, {"group_id": "h"}])) is None
    assert coordinator_key(26, k.EndTxnRequest(transactional_id="t")) == (txn, "t")
    assert coordinator_key(25, k.AddOffsetsToTxnRequest(transactional_id="t", group_id="g")) \
        == (txn, "t")
    assert coordinator_key(22, k.InitProducerIdRequest()) is None  # idempotent only
    assert coordinator_key(24, k.AddPartitionsToTxnRequest(
        v3_and_below_transactional_id="t")) == (txn, "t")
    assert coordinator_key(24, k.AddPartitionsToTxnRequest(
        transactions=[{"transactional_id": "t"}])) == (txn, "t")
    assert coordinator_key(0, k.ProduceRequest(transactional_id="t")) is None
    assert coordinator_key(3, k.MetadataRequest()) is None


def test_the_affinity_is_the_partition_once_the_topic_is_known() -> None:
    affinity = CoordinatorAffinity()
    request = k.OffsetCommitRequest(group_id="orders")
    assert affinity.of(8, request) == "__consumer_offsets:orders"
    affinity.on_metadata(replicator_pb2.ClusterMetadata(topics=[
        replicator_pb2.TopicMetadata(name="__consumer_offsets", partitions=[
            replicator_pb2.PartitionMetadata(partition=p) for p in range(50)])]))
    assert affinity.of(8, request) == f"__consumer_offsets-{partition_for('orders', 50)}"
    assert affinity.of(26, k.EndTxnRequest(transactional_id="t")) == "__transaction_state:t"


def test_a_partitions_requests_go_to_one_handler_and_around_one_that_is_down() -> None:
    async def commit(pool: HandlerPool, affinity: str) -> None:
        await pool.call("OffsetCommit", k.OffsetCommitRequest(group_id="g"), metadata=(),
                        time_limit=5, retry_safe=False, affinity=affinity)

    async def main() -> None:
        handlers = [await FakeHandler(f"h{i}").start() for i in range(3)]
        pools = [HandlerPool(tuple(h.address for h in order))
                 for order in (handlers, handlers[::-1])]  # two frontends
        try:
            for pool in pools:
                await pool.start()
            partitions = [f"__consumer_offsets-{p}" for p in range(12)]
            owners = {}
            for partition in partitions:
                for pool in pools:
                    for _ in range(3):
                        await commit(pool, partition)
                served = [h for h in handlers if h.called("OffsetCommit")]
                assert len(served) == 1, partition  # both frontends, every time
                owners[partition] = served[0]
                served[0].calls.clear()
            assert len(set(map(id, owners.values()))) > 1  # partitions spread over handlers
            # The first-ranked handler of a partition is down: another serves it. A request
            # written before the pool has heard that the stream ended (the stop cancels it) fails
            # mid-request, as it must: it may have reached the handler. The next one goes round.
            down = owners[partitions[0]]
            await down.stop()
            try:
                await commit(pools[0], partitions[0])
            except HandlerCallError as lost:
                assert lost.reached, lost
                await commit(pools[0], partitions[0])
            assert sum(len(h.called("OffsetCommit")) for h in handlers if h is not down) == 1
        finally:
            for pool in pools:
                await pool.close()
            for handler in handlers:
                await handler.stop()

    asyncio.run(main())
