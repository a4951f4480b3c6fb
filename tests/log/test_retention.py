"""Tests of segment.ms rolling, retention (retention.ms, retention.bytes), DeleteRecords and the
log start offset, flush policies and the recovery point, against real files."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from services.common.errors import ErrorCode, KafkaError
from services.common.records.record_batch import iter_batches
from services.log import replica_state
from services.log.checkpoint import LOG_START_OFFSET_FILE, RECOVERY_POINT_FILE, OffsetCheckpoint
from services.log.log_manager import LogManager
from services.log.partition_log import EARLIEST_TIMESTAMP, HIGH_WATERMARK, PartitionLog
from services.log.replica_state import LEADER
from services.log.topic_config import TopicConfig

from ..record_batches import build_batch, values

HW = HIGH_WATERMARK
DAY = 86_400_000


def open_log(directory: Path, **settings: object) -> PartitionLog:
    return PartitionLog(directory / "t-0", "t", 0, "", TopicConfig(**settings))  # type: ignore[arg-type]


def append_at(partition_log: PartitionLog, timestamp: int, count: int = 2) -> int:
    info = asyncio.run(partition_log.append(
        build_batch(values(count, size=20), base_timestamp=timestamp, timestamp_step=0)))
    return info.base_offset


def test_segment_ms_rolls_by_the_first_batch_time(tmp_path: Path) -> None:
    partition_log = open_log(tmp_path, segment_ms=1000)
    append_at(partition_log, 10_000)
    append_at(partition_log, 10_900)
    append_at(partition_log, 11_000)  # exactly segment.ms later: not yet
    assert partition_log.segment_count == 1
    append_at(partition_log, 11_001)
    assert [s.base_offset for s in partition_log.segments] == [0, 6]
    append_at(partition_log, 11_500)
    assert partition_log.segment_count == 2
    partition_log.close()


def test_retention_ms_deletes_old_segments_but_never_the_active_one(tmp_path: Path) -> None:
    partition_log = open_log(tmp_path, segment_ms=1000, retention_ms=DAY)
    now = 100 * DAY
    for timestamp in (now - 3 * DAY, now - 2 * DAY, now - 2000, now):
        append_at(partition_log, timestamp)
    assert [s.base_offset for s in partition_log.segments] == [0, 2, 4, 6]
    assert asyncio.run(partition_log.enforce_retention(now)) == 2
    assert [s.base_offset for s in partition_log.segments] == [4, 6]
    assert partition_log.log_start_offset == 4
    assert not (tmp_path / "t-0" / f"{0:020d}.log").exists()
    assert not (tmp_path / "t-0" / f"{0:020d}.timeindex").exists()
    with pytest.raises(KafkaError) as raised:
        partition_log.read(3, 1 << 20, HW)
    assert raised.value.errno == ErrorCode.offset_out_of_range.value
    assert partition_log.list_offset(EARLIEST_TIMESTAMP, HW).offset == 4
    # Much later everything but the active segment goes.
    assert asyncio.run(partition_log.enforce_retention(now + 10 * DAY)) == 1
    assert [s.base_offset for s in partition_log.segments] == [6]
    partition_log.close()


def test_retention_stops_at_the_high_watermark_and_for_compact_topics(tmp_path: Path) -> None:
    partition_log = open_log(tmp_path, segment_ms=1000, retention_ms=0)
    partition_log.state = replica_state.state(LEADER, -1)
    for timestamp in (1000, 5000, 9000):
        append_at(partition_log, timestamp)
    partition_log.high_watermark = 3  # inside the second segment
    assert asyncio.run(partition_log.enforce_retention(10**12)) == 1
    assert partition_log.log_start_offset == 2
    partition_log.close()
    compacted = open_log(tmp_path / "c", segment_ms=1000, retention_ms=0,
                         cleanup_policy="compact")
    for timestamp in (1000, 5000, 9000):
        append_at(compacted, timestamp)
    assert asyncio.run(compacted.enforce_retention(10**12)) == 0
    compacted.close()


def test_retention_bytes_keeps_the_log_under_the_limit(tmp_path: Path) -> None:
    batch_size = len(build_batch(values(2, size=20)))
    partition_log = open_log(tmp_path, segment_bytes=2 * batch_size,
                             retention_bytes=3 * batch_size, retention_ms=-1)
    for _ in range(9):
        append_at(partition_log, 1000)
    assert partition_log.segment_count == 5
    assert asyncio.run(partition_log.enforce_retention()) == 3
    # 3 batches' worth: deleting another whole segment would go below the limit.
    assert partition_log.size_bytes == 3 * batch_size
    assert partition_log.log_start_offset == 12
    partition_log.close()


def test_delete_records_moves_the_log_start_offset(tmp_path: Path) -> None:
    batch_size = len(build_batch(values(2, size=20)))
    partition_log = open_log(tmp_path, segment_bytes=2 * batch_size)
    for timestamp in range(6):
        append_at(partition_log, 1000 + timestamp)
    assert asyncio.run(partition_log.delete_records(5)) == 5
    # The first two segments end at or below offset 4 ... the one holding 5 stays.
    assert [s.base_offset for s in partition_log.segments] == [4, 8]
    assert partition_log.log_start_offset == 5
    # A read at the start returns the whole batch holding it.
    [batch] = list(iter_batches(partition_log.read(5, 1, HW)))
    assert (batch.header.base_offset, batch.header.last_offset) == (4, 5)
    for offset in (4, 0):
        with pytest.raises(KafkaError):
            partition_log.read(offset, 1 << 20, HW)
    assert partition_log.list_offset(1000, HW).offset == 5  # by time: never below the start
    assert asyncio.run(partition_log.delete_records(3)) == 5  # never backwards
    for bad in (13, -2):
        with pytest.raises(KafkaError) as raised:
            asyncio.run(partition_log.delete_records(bad))
        assert raised.value.errno == ErrorCode.offset_out_of_range.value
    assert asyncio.run(partition_log.delete_records(-1)) == 12  # the high watermark
    assert partition_log.read(12, 1 << 20, HW) == b""
    partition_log.close()


def test_the_log_start_offset_survives_a_restart(tmp_path: Path) -> None:
    manager = LogManager(tmp_path, TopicConfig(segment_bytes=200))
    manager.load()
    partition_log = manager.create("t", 0, "", {})
    for _ in range(5):
        append_at(partition_log, 1000)
    assert asyncio.run(manager.delete_records("t", 0, 7)) == 7
    assert OffsetCheckpoint(tmp_path / LOG_START_OFFSET_FILE).read() == {("t", 0): 7}
    manager.close()
    reloaded = LogManager(tmp_path, TopicConfig(segment_bytes=200))
    reloaded.load()
    assert reloaded.get("t", 0).log_start_offset == 7
    reloaded.close()


def test_flush_messages_moves_the_recovery_point(tmp_path: Path) -> None:
    partition_log = open_log(tmp_path, flush_messages=5)
    append_at(partition_log, 1000, count=3)
    assert partition_log.recovery_point == 0
    append_at(partition_log, 1000, count=3)
    assert partition_log.recovery_point == 6 and not partition_log.segments[-1].dirty

    async def by_time() -> tuple[bool, bool]:
        await partition_log.append(build_batch(values(1)))
        too_soon = await partition_log.maybe_flush_by_time(0)
        return too_soon, await partition_log.maybe_flush_by_time(2**62)

    timed = open_log(tmp_path / "timed", flush_ms=60_000)
    partition_log = timed
    assert asyncio.run(by_time()) == (False, True)
    assert timed.recovery_point == 1
    timed.close()


def test_rolled_segments_are_flushed_and_checkpointed_on_shutdown(tmp_path: Path) -> None:
    async def main() -> None:
        manager = LogManager(tmp_path, TopicConfig(segment_bytes=200))
        manager.load()
        partition_log = manager.create("t", 0, "", {})
        for _ in range(5):
            await partition_log.append(build_batch(values(2, size=20)))
        await partition_log.drain()
        rolled_to = partition_log.segments[-1].base_offset
        assert rolled_to > 0 and partition_log.recovery_point == rolled_to
        manager.write_checkpoints()
        assert OffsetCheckpoint(tmp_path / RECOVERY_POINT_FILE).read() == {("t", 0): rolled_to}
        manager.close()
        assert OffsetCheckpoint(tmp_path / RECOVERY_POINT_FILE).read() == {("t", 0): 10}

    asyncio.run(main())


def _segments_and_checkpoint(tmp_path: Path, recovery_point: int) -> list[Path]:
    partition_log = open_log(tmp_path, segment_bytes=300, index_interval_bytes=50)
    for _ in range(12):
        append_at(partition_log, 1000)
    partition_log.close()
    return sorted((tmp_path / "t-0").glob("*.log"))


def test_a_flipped_byte_past_the_recovery_point_truncates_the_log_there(tmp_path: Path) -> None:
    files = _segments_and_checkpoint(tmp_path, 0)
    assert len(files) >= 4
    victim = files[1]
    data = bytearray(victim.read_bytes())
    batch_size = len(build_batch(values(2, size=20)))
    data[batch_size + 70] ^= 0x04  # inside the second batch of the second segment
    victim.write_bytes(bytes(data))
    first_base = int(victim.stem)
    # Recovery point inside the first segment: everything from it on is validated.
    reopened = PartitionLog(tmp_path / "t-0", "t", 0, "",
                                 TopicConfig(segment_bytes=300, index_interval_bytes=50),
                                 recovery_point=1)
    assert reopened.log_end_offset == first_base + 2
    assert reopened.truncated_at_open > 0
    assert [s.base_offset for s in reopened.segments] == [0, first_base]
    assert sorted((tmp_path / "t-0").glob("*.log")) == files[:2]
    assert reopened.recovery_point == reopened.log_end_offset
    reopened.close()


def test_segments_below_the_recovery_point_are_not_revalidated(tmp_path: Path) -> None:
    files = _segments_and_checkpoint(tmp_path, 0)
    victim = files[0]
    data = bytearray(victim.read_bytes())
    data[70] ^= 0x04  # the records of the first batch: only a CRC check can see it
    victim.write_bytes(bytes(data))
    end_base = int(files[-1].stem)
    trusted = PartitionLog(tmp_path / "t-0", "t", 0, "",
                                TopicConfig(segment_bytes=300, index_interval_bytes=50),
                                recovery_point=end_base)
    assert trusted.log_end_offset == 24 and trusted.truncated_at_open == 0
    trusted.close()
    checked = PartitionLog(tmp_path / "t-0", "t", 0, "",
                                TopicConfig(segment_bytes=300, index_interval_bytes=50))
    assert checked.log_end_offset == 0 and checked.segment_count == 1
    checked.close()
