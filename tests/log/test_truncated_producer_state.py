"""A follower cut back to its new leader's log rebuilds its idempotent producers' state for
what it kept (Kafka rebuilds it from snapshots and the log on truncation): when it later
leads, a retried batch that was cut is stored again, not answered as a duplicate at offsets
the log no longer has, and sequences go on from the last batch kept. Real files."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from services.common.errors import ErrorCode, KafkaError
from services.log import replica_state
from services.log.partition_log import PartitionLog
from services.log.replica_state import FOLLOWER, LEADER
from services.log.topic_config import TopicConfig

from ..record_batches import build_batch, values

# Recent timestamps: a producer whose last batch is a day old is forgotten on a reload.
PRODUCER = {"producer_id": 7, "producer_epoch": 0, "base_timestamp": int(time.time() * 1000)}


def batch(sequence: int, count: int = 3, **offsets: int) -> bytes:
    return build_batch(values(count), base_sequence=sequence, **PRODUCER, **offsets)


def follower(directory: Path, **config: int) -> PartitionLog:
    partition_log = PartitionLog(directory, "t", 0, "", TopicConfig(**config))  # type: ignore[arg-type]
    asyncio.run(partition_log.become(replica_state.state(FOLLOWER, 0,
                                                  in_sync_alone=False)))
    return partition_log


def copy(partition_log: PartitionLog, count: int, epoch: int = 0) -> None:
    """``count`` batches of 3 records from the producer, sequences and offsets 0, 3, 6..."""
    for n in range(count):
        asyncio.run(partition_log.append_as_follower(
            build_batch(values(3), base_offset=3 * n, base_sequence=3 * n,
                        partition_leader_epoch=epoch, **PRODUCER), leader_epoch=0))


def lead(partition_log: PartitionLog, epoch: int = 1) -> None:
    asyncio.run(partition_log.become(replica_state.state(LEADER, epoch,
                                                  in_sync_alone=True)))


@pytest.mark.parametrize("segment_bytes", [1 << 20, 200])  # one segment; one per batch
def test_a_cut_batch_retried_at_the_new_leader_is_stored_again(
        tmp_path: Path, segment_bytes: int) -> None:
    partition_log = follower(tmp_path, segment_bytes=segment_bytes)
    copy(partition_log, 4)  # offsets 0..11, sequences 0..11
    assert asyncio.run(partition_log.truncate_to(6)) == 6  # sequences 6..11 are gone
    assert partition_log.producer_state.entry(7).last_seq == 5
    lead(partition_log)
    retried = asyncio.run(partition_log.append(batch(6)))
    assert (retried.base_offset, retried.batch_count) == (6, 1), "answered as a duplicate"
    again = asyncio.run(partition_log.append(batch(6)))
    assert (again.base_offset, again.batch_count) == (6, 0)  # now it is one
    with pytest.raises(KafkaError) as gap:
        asyncio.run(partition_log.append(batch(12)))  # 9..11 were cut: a gap now
    assert gap.value.errno == ErrorCode.out_of_order_sequence_number.value
    partition_log.close()


def test_the_rebuilt_state_survives_a_restart(tmp_path: Path) -> None:
    partition_log = follower(tmp_path, segment_bytes=200)
    copy(partition_log, 4)
    partition_log.close()  # a snapshot at offset 12, with sequences up to 11
    partition_log = PartitionLog(tmp_path, "t", 0, "", TopicConfig(segment_bytes=200))
    asyncio.run(partition_log.become(replica_state.state(FOLLOWER, 0,
                                                  in_sync_alone=False)))
    asyncio.run(partition_log.truncate_to(3))
    partition_log.close(flush=False)  # a kill right after the cut
    partition_log = PartitionLog(tmp_path, "t", 0, "", TopicConfig(segment_bytes=200))
    assert partition_log.producer_state.entry(7).last_seq == 2
    lead(partition_log)
    assert asyncio.run(partition_log.append(batch(3))).base_offset == 3
    partition_log.close()


def test_a_cut_that_removes_every_batch_of_a_producer_forgets_it(tmp_path: Path) -> None:
    partition_log = follower(tmp_path)
    asyncio.run(partition_log.append_as_follower(build_batch(values(2)), leader_epoch=0))
    asyncio.run(partition_log.append_as_follower(
        build_batch(values(3), base_offset=2, base_sequence=0, **PRODUCER), leader_epoch=0))
    asyncio.run(partition_log.truncate_to(2))
    assert partition_log.producer_state.entry(7) is None
    lead(partition_log)
    # Unknown again: it may start anywhere (KIP-360), and its first batch is stored.
    assert asyncio.run(partition_log.append(batch(0))).batch_count == 1
    partition_log.close()
