"""A follower copying a compacted leader (Kafka's ``appendAsFollower`` accepts batches whose
base offset is at or past its log end): the cleaner leaves gaps in the leader's offsets, and
the follower ends up holding exactly the leader's batches, gaps and all. Real files, no gRPC."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from services.common.errors import ErrorCode, KafkaError
from services.common.records.record_batch import iter_batches
from services.log import replica_state
from services.log.cleaner import LogCleaner
from services.log.partition_log import LOG_END, PartitionLog
from services.log.replica_state import FOLLOWER
from services.log.topic_config import TopicConfig

from ..record_batches import build_batch

NOW = 1_800_000_000_000
DAY = 86_400_000


def compacted(directory: Path) -> PartitionLog:
    return PartitionLog(directory, "t", 0, "", TopicConfig(
        cleanup_policy="compact", segment_bytes=400))


def copy_all(leader: PartitionLog, follower: PartitionLog) -> int:
    """What a replica fetcher does: read the leader from the follower's log end and append
    it as it is, until the follower has everything; returns the rounds it took."""
    for rounds in range(1, 1000):
        if follower.log_end_offset >= leader.log_end_offset:
            return rounds
        data = leader.read(follower.log_end_offset, 1 << 20, LOG_END)
        assert data, f"nothing to read at {follower.log_end_offset}"
        asyncio.run(follower.append_as_follower(data, leader_epoch=0))
    raise AssertionError("the follower never caught up")


def batches_of(partition_log: PartitionLog) -> list[bytes]:
    out, offset = [], partition_log.log_start_offset
    while offset < partition_log.log_end_offset:
        data = partition_log.read(offset, 1 << 20, LOG_END)
        for batch in iter_batches(data):
            out.append(bytes(data[batch.position:batch.position + batch.header.size]))
            offset = batch.header.next_offset
    return out


def test_a_follower_copies_a_compacted_leader_across_its_offset_gaps(tmp_path: Path) -> None:
    leader = compacted(tmp_path / "leader")
    for round_ in range(12):
        # Each round: a key written once, then two keys overwritten every round.
        for key in (f"once-{round_}".encode(), b"a", b"b"):
            batch = build_batch([f"{key.decode()}{round_}".encode()], keys=[key],
                                base_timestamp=NOW - DAY)
            asyncio.run(leader.append(batch))
    asyncio.run(LogCleaner().clean(leader, NOW))
    offsets = [b.header.base_offset for data in batches_of(leader)
               for b in iter_batches(data)]
    gaps = [(a, b) for a, b in zip(offsets, offsets[1:], strict=False) if b > a + 1]
    assert gaps, f"the cleaner left no gap: {offsets}"

    follower = compacted(tmp_path / "follower")
    asyncio.run(follower.become(replica_state.state(FOLLOWER, 0,
                                             in_sync_alone=False)))
    copy_all(leader, follower)
    assert follower.log_end_offset == leader.log_end_offset
    assert batches_of(follower) == batches_of(leader)
    leader.close()
    follower.close()


def test_a_follower_refuses_batches_below_its_log_end(tmp_path: Path) -> None:
    follower = compacted(tmp_path / "follower")
    asyncio.run(follower.become(replica_state.state(FOLLOWER, 0,
                                             in_sync_alone=False)))
    asyncio.run(follower.append_as_follower(
        build_batch([b"x", b"y"], keys=[b"k", b"k"], base_offset=3), leader_epoch=0))
    assert follower.log_end_offset == 5
    with pytest.raises(KafkaError) as refused:
        asyncio.run(follower.append_as_follower(
            build_batch([b"z"], keys=[b"k"], base_offset=4), leader_epoch=0))
    assert refused.value.errno == ErrorCode.offset_out_of_range.value
    assert follower.log_end_offset == 5
    follower.close()
