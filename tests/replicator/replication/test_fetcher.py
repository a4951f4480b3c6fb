"""Unit tests of one leader's fetch loop against stand-in log nodes (no gRPC)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from kbroker.log.v1 import log_pb2
from services.replicator.replication.fetcher import FetchSettings, LeaderFetcher
from services.replicator.replication.partition_state import PartitionReplication


class StalledLeaderNodes:
    """Followers at offset 0 with no epochs; the leader's long poll never answers."""

    def __init__(self) -> None:
        self.fetches = 0

    async def describe(self, node, keys):
        return [log_pb2.PartitionState(topic=t, partition=p, log_end_offset=0, high_watermark=0,
                                       leader_epoch=0, role=log_pb2.REPLICA_ROLE_FOLLOWER,
                                       latest_log_epoch=-1) for t, p in keys]

    async def fetch(self, node, reads: list[log_pb2.PartitionRead], **_
                    ) -> list[log_pb2.PartitionReadResult]:
        self.fetches += 1
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


def partition(name: str) -> PartitionReplication:
    return PartitionReplication(topic=name, partition=0, leader=0, leader_epoch=0,
                                replicas=(0, 1), isr=(0, 1), now_ms=0)


def test_a_long_poll_abandoned_for_a_partition_change_is_no_failed_round(
        caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        nodes = StalledLeaderNodes()
        fetcher = LeaderFetcher(leader=0, nodes=nodes, settings=FetchSettings(),  # type: ignore[arg-type]
                                on_progress=lambda _: None, on_stale_state=lambda *_: None)
        first = {("a", 0): partition("a")}
        fetcher.set_partitions(first, [0, 1])
        fetcher.start()
        try:
            for _ in range(200):
                if nodes.fetches:
                    break
                await asyncio.sleep(0.01)
            assert nodes.fetches == 1
            # A new partition: the read in flight is abandoned and a new one starts at once
            # (not after a failed round's backoff).
            fetcher.set_partitions({**first, ("b", 0): partition("b")}, [0, 1])
            for _ in range(200):
                if nodes.fetches == 2:
                    break
                await asyncio.sleep(0.01)
            assert nodes.fetches == 2
        finally:
            await fetcher.stop()

    with caplog.at_level(logging.ERROR, logger="services.replicator.replication.fetcher"):
        asyncio.run(asyncio.wait_for(main(), 30))
    assert not [r for r in caplog.records if "round failed" in r.getMessage()]
