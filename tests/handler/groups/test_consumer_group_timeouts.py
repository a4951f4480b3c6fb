"""Classic members of a consumer group in real handlers (real log node, purgatory and
replicator on port 0): the deadlines Kafka gives them besides their session, each its
rebalance timeout. A classic member that joined must send SyncGroup in time, and one told to
rejoin must send JoinGroup in time, however often it heartbeats meanwhile; else it is fenced
and its partitions go to the others."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

from kbroker.kafka.v1 import kafka_pb2 as k
from services.common.errors import ErrorCode
from services.handler.groups.consumer_protocol import Subscription, write_subscription

from ..harness import CALL_TIMEOUT, running_cluster
from .client import GroupClient, context
from .test_service import GROUP_OPTIONS, find

E = ErrorCode
TIMEOUT = 120
REBALANCE_TIMEOUT_MS = 1500
# Sessions outlast the tests: only the join and sync deadlines can fence a member.
SESSION_TIMEOUT_MS = 30_000
OPTIONS: dict[str, Any] = {**GROUP_OPTIONS, "group_consumer_session_timeout_ms": 45_000,
                           "group_consumer_heartbeat_interval_ms": 500,
                           "group_consumer_min_heartbeat_interval_ms": 500}


class ConsumerMember:
    """A member speaking the consumer protocol (ConsumerGroupHeartbeat v1)."""

    def __init__(self, stub: Any, group_id: str, topic: str) -> None:
        self.stub, self.group_id, self.topic = stub, group_id, topic
        self.member_id = str(uuid.uuid4())
        self.epoch = 0
        self.owned: dict[str, list[int]] = {}

    async def heartbeat(self) -> k.ConsumerGroupHeartbeatResponse:
        request = k.ConsumerGroupHeartbeatRequest(
            group_id=self.group_id, member_id=self.member_id, member_epoch=self.epoch,
            rebalance_timeout_ms=REBALANCE_TIMEOUT_MS if self.epoch == 0 else -1,
            subscribed_topic_names=[self.topic] if self.epoch == 0 else [],
            subscribed_topic_names_is_null=self.epoch != 0,
            topic_partitions=[k.ConsumerGroupHeartbeatRequest.TopicPartitions(
                topic_id=t, partitions=ps) for t, ps in self.owned.items()])
        response = await self.stub.ConsumerGroupHeartbeat(request, metadata=context(1),
                                                           timeout=CALL_TIMEOUT)
        assert response.error_code == 0, response
        self.epoch = response.member_epoch
        if response.HasField("assignment"):
            self.owned = {tp.topic_id: list(tp.partitions)
                          for tp in response.assignment.topic_partitions}
        return response


def classic(stub: Any, group_id: str, topic: str, name: str) -> GroupClient:
    subscription = write_subscription(Subscription(version=1, topics=(topic,), owned={}))
    return GroupClient(stub, group_id, name, session_timeout_ms=SESSION_TIMEOUT_MS,
                       rebalance_timeout_ms=REBALANCE_TIMEOUT_MS,
                       protocols=(("range", subscription),))


async def members(stub: Any, group_id: str) -> set[str]:
    response = await stub.ConsumerGroupDescribe(
        k.ConsumerGroupDescribeRequest(group_ids=[group_id]), metadata=context(1),
        timeout=CALL_TIMEOUT)
    [group] = response.groups
    assert group.error_code == 0, group
    return {m.member_id for m in group.members}


async def fenced_within(client: GroupClient, seconds: float, *, heartbeat: bool) -> float:
    """Wait until ``client`` is no member any more (heartbeating meanwhile if asked);
    the seconds it took."""
    started = time.monotonic()
    while client.member_id in await members(client.stub, client.group_id):
        assert time.monotonic() - started < seconds, "never fenced"
        if heartbeat:
            # UNKNOWN_MEMBER_ID: fenced between the look at the members and the heartbeat.
            assert await client.heartbeat() in (0, E.rebalance_in_progress.value,
                                                E.unknown_member_id.value)
        await asyncio.sleep(0.2)
    return time.monotonic() - started


def test_a_classic_member_that_never_syncs_is_fenced_at_its_rebalance_timeout(
        tmp_path: Path) -> None:
    async def main() -> None:
        async with running_cluster(tmp_path, **OPTIONS) as cluster:
            await cluster.create_topic("t", partitions=4)
            await find(cluster.stub, "nosync")
            first = ConsumerMember(cluster.stub, "nosync", "t")
            await first.heartbeat()
            joiner = classic(cluster.stub, "nosync", "t", "joiner")
            assert (await joiner.join()).error_code == 0
            waited = await fenced_within(joiner, 15, heartbeat=False)
            assert waited >= REBALANCE_TIMEOUT_MS / 1000 * 0.9
            assert await members(cluster.stub, "nosync") == {first.member_id}

    asyncio.run(asyncio.wait_for(main(), TIMEOUT))


def test_a_classic_member_told_to_rejoin_is_fenced_if_it_only_heartbeats(
        tmp_path: Path) -> None:
    async def main() -> None:
        async with running_cluster(tmp_path, **OPTIONS) as cluster:
            await cluster.create_topic("t", partitions=4)
            await find(cluster.stub, "norejoin")
            first = ConsumerMember(cluster.stub, "norejoin", "t")
            await first.heartbeat()
            lazy = classic(cluster.stub, "norejoin", "t", "lazy")
            assert (await lazy.join()).error_code == 0
            sync = await lazy.sync()
            assert sync.error_code in (0, E.rebalance_in_progress.value)
            # A third member joins: the group epoch moves on and the classic member is told
            # to rejoin; it keeps heartbeating (its session stays alive) but never does.
            third = ConsumerMember(cluster.stub, "norejoin", "t")
            await third.heartbeat()
            deadline = time.monotonic() + 15
            while await lazy.heartbeat() != E.rebalance_in_progress.value:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.2)
            waited = await fenced_within(lazy, 15, heartbeat=True)
            assert waited < REBALANCE_TIMEOUT_MS / 1000 + 5
            assert await lazy.heartbeat() == E.unknown_member_id.value
            assert await members(cluster.stub, "norejoin") == {first.member_id,
                                                               third.member_id}

    asyncio.run(asyncio.wait_for(main(), TIMEOUT))
