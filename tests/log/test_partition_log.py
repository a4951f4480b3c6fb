"""Tests of services.log.partition_log and services.log.segment against real files: appends,
reads, offset lookups, segment rolling, restart and recovery."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.common.errors import ErrorCode, KafkaError
from services.common.records.record import Record, encode_batch
from services.common.records.record_batch import BatchHeader, iter_batches, read_header
from services.log import replica_state
from services.log.log_validator import stored_batch_problem
from services.log.partition_log import (
    EARLIEST_TIMESTAMP,
    HIGH_WATERMARK,
    LATEST_TIMESTAMP,
    LOG_END,
    MAX_TIMESTAMP,
    PartitionLog,
)
from services.log.replica_state import LEADER
from services.log.topic_config import TimestampType, TopicConfig

from ..record_batches import build_batch, values

HW, END = HIGH_WATERMARK, LOG_END


def open_log(directory: Path, **settings: object) -> PartitionLog:
    return PartitionLog(directory / "t-0", "t", 0, "", TopicConfig(**settings))  # type: ignore[arg-type]


def append(partition_log: PartitionLog, records: bytes, now_ms: int | None = None):
    return asyncio.run(partition_log.append(records, now_ms))


def offsets_in(records: bytes) -> list[tuple[int, int]]:
    """(base offset, last offset) of each batch in ``records``."""
    return [(b.header.base_offset, b.header.last_offset) for b in iter_batches(records)]


def test_appends_get_consecutive_offsets_and_read_back_whole(tmp_path: Path) -> None:
    partition_log = open_log(tmp_path)
    first = append(partition_log, build_batch(values(3)))
    second = append(partition_log, build_batch(values(2)) + build_batch(values(4)))
    assert (first.base_offset, first.last_offset, first.log_end_offset) == (0, 2, 3)
    assert (second.base_offset, second.last_offset, second.log_end_offset) == (3, 8, 9)
    assert second.high_watermark == 9 and second.log_start_offset == 0
    assert second.log_append_time_ms == -1
    read = partition_log.read(0, 1 << 20, HW)
    assert offsets_in(read) == [(0, 2), (3, 4), (5, 8)]
    assert all(stored_batch_problem(read, b.position, 0) is None for b in iter_batches(read))
    assert (partition_log.high_watermark, partition_log.log_end_offset) == (9, 9)
    partition_log.close()


def test_a_bytearray_appended_is_patched_in_place_and_stored_as_patched(tmp_path: Path) -> None:
    """A caller that hands over a bytearray (a range read out of a spool file) saves the
    append its copy: the batches are patched in it, and what is stored is what it holds."""
    partition_log = open_log(tmp_path)
    append(partition_log, build_batch(values(2)))
    handed = bytearray(build_batch(values(3)))
    info = append(partition_log, handed)
    assert (info.base_offset, info.last_offset) == (2, 4)
    assert offsets_in(bytes(handed)) == [(2, 4)]
    assert partition_log.read(2, 1 << 20, HW) == bytes(handed)
    given = build_batch(values(1))
    append(partition_log, given)  # bytes: copied, left as they were
    assert offsets_in(given) == [(0, 0)]
    partition_log.close()


def test_a_read_inside_a_batch_returns_the_whole_batch(tmp_path: Path) -> None:
    partition_log = open_log(tmp_path)
    append(partition_log, build_batch(values(5)))
    append(partition_log, build_batch(values(5)))
    assert offsets_in(partition_log.read(7, 1 << 20, HW)) == [(5, 9)]
    assert offsets_in(partition_log.read(3, 1 << 20, HW)) == [(0, 4), (5, 9)]
    partition_log.close()


def test_reads_return_whole_batches_within_max_bytes(tmp_path: Path) -> None:
    partition_log = open_log(tmp_path, index_interval_bytes=0)
    batch = build_batch(values(2, size=100))
    for _ in range(5):
        append(partition_log, batch)
    size = len(batch)
    assert offsets_in(partition_log.read(0, size * 2 + size // 2, HW)) == [(0, 1), (2, 3)]
    assert len(partition_log.read(0, size * 3, HW)) == size * 3
    # The first batch comes whole even over the limit (KIP-74), unless told otherwise.
    assert offsets_in(partition_log.read(4, 10, HW)) == [(4, 5)]
    assert partition_log.read(4, 10, HW, min_one=False) == b""
    assert offsets_in(partition_log.read(4, 0, HW)) == [(4, 5)]
    partition_log.close()


def test_reads_at_and_beyond_the_ends(tmp_path: Path) -> None:
    partition_log = open_log(tmp_path)
    append(partition_log, build_batch(values(3)))
    assert partition_log.read(3, 1000, HW) == b""
    for offset in (4, -1):
        with pytest.raises(KafkaError) as caught:
            partition_log.read(offset, 1000, HW)
        assert caught.value.code == ErrorCode.offset_out_of_range
    partition_log.close()


def test_consumers_never_read_past_the_high_watermark(tmp_path: Path) -> None:
    moves: list[tuple[str, int, int, int]] = []
    partition_log = PartitionLog(
        tmp_path / "t-0", "t", 0, "", TopicConfig(), lambda *move: moves.append(move)
    )
    append(partition_log, build_batch(values(3)))
    assert moves == [("t", 0, 3, -1, "", ())]  # -1: a replica without a leader epoch
    partition_log.state = replica_state.state(LEADER, -1)
    append(partition_log, build_batch(values(2)))
    append(partition_log, build_batch(values(4)))
    assert partition_log.high_watermark == 3
    assert offsets_in(partition_log.read(0, 1 << 20, HW)) == [(0, 2)]
    assert partition_log.read(3, 1 << 20, HW) == b""  # between HW and end: empty
    assert partition_log.read(5, 1 << 20, HW) == b""
    assert offsets_in(partition_log.read(0, 1 << 20, END)) == [(0, 2), (3, 4), (5, 8)]
    partition_log.high_watermark = 5
    assert offsets_in(partition_log.read(0, 1 << 20, HW)) == [(0, 2), (3, 4)]
    partition_log.high_watermark = 100  # clamped to the log end
    assert partition_log.high_watermark == 9
    assert moves == [("t", 0, 3, -1, "", ()), ("t", 0, 5, -1, "", ()), ("t", 0, 9, -1, "", ())]
    partition_log.close()


def test_segments_roll_at_segment_bytes(tmp_path: Path) -> None:
    batch = build_batch(values(4, size=50))
    partition_log = open_log(tmp_path, segment_bytes=len(batch) * 3 + 10)
    for _ in range(10):
        append(partition_log, batch)
    assert partition_log.segment_count == 4
    assert [s.base_offset for s in partition_log.segments] == [0, 12, 24, 36]
    names = sorted(p.name for p in (tmp_path / "t-0").glob("*.log"))
    assert names == [f"{base:020d}.log" for base in (0, 12, 24, 36)]
    assert all(s.size <= len(batch) * 3 + 10 for s in partition_log.segments)
    # A read returns the data of one segment, as Kafka's does.
    assert offsets_in(partition_log.read(5, 1 << 20, HW)) == [(4, 7), (8, 11)]
    assert offsets_in(partition_log.read(12, 1 << 20, HW))[0] == (12, 15)
    partition_log.close()


def test_an_append_larger_than_a_segment_gets_its_own_segment_or_is_refused(
    tmp_path: Path,
) -> None:
    small, large = build_batch(values(1)), build_batch(values(20, size=40))
    partition_log = open_log(tmp_path, segment_bytes=len(large) + 5)
    append(partition_log, small)
    append(partition_log, large)
    assert [s.size for s in partition_log.segments] == [len(small), len(large)]
    with pytest.raises(KafkaError) as caught:
        append(partition_log, large + small)
    assert caught.value.code == ErrorCode.record_list_too_large
    assert partition_log.log_end_offset == 21
    partition_log.close()


def test_a_rejected_append_stores_nothing(tmp_path: Path) -> None:
    partition_log = open_log(tmp_path)
    append(partition_log, build_batch(values(2)))
    bad = bytearray(build_batch(values(2)))
    bad[-3] ^= 0x40
    with pytest.raises(KafkaError) as caught:
        append(partition_log, build_batch(values(3)) + bytes(bad))
    assert caught.value.code == ErrorCode.corrupt_message
    assert partition_log.log_end_offset == 2
    assert partition_log.size_bytes == len(build_batch(values(2)))
    partition_log.close()


def test_an_acks_all_append_needs_min_insync_replicas_in_the_leaders_isr(
        tmp_path: Path) -> None:
    partition_log = open_log(tmp_path)
    asyncio.run(partition_log.become(replica_state.state(
        LEADER, 3, leader=0, replicas=(0, 1, 2), isr=(0,))))
    with pytest.raises(KafkaError) as caught:
        asyncio.run(partition_log.append(build_batch(values(2)), min_insync_replicas=2))
    assert caught.value.code == ErrorCode.not_enough_replicas
    assert "current ISR [0] is insufficient to satisfy the min.isr requirement of 2" in (
        caught.value.message)
    assert partition_log.log_end_offset == 0
    # Without the check (acks=1), and once the ISR has grown back, it is stored.
    asyncio.run(partition_log.append(build_batch(values(1))))
    asyncio.run(partition_log.become(replica_state.state(
        LEADER, 3, leader=0, replicas=(0, 1, 2), isr=(0, 2), partition_epoch=1)))
    info = asyncio.run(partition_log.append(build_batch(values(2)), min_insync_replicas=2))
    assert (info.base_offset, partition_log.log_end_offset) == (1, 3)
    assert info.partition_epoch == 1  # the metadata version of the ISR it was checked against
    # A replica led without a replicated state counts itself as its ISR.
    alone = open_log(tmp_path / "alone")
    asyncio.run(alone.append(build_batch(values(1)), min_insync_replicas=1))
    with pytest.raises(KafkaError):
        asyncio.run(alone.append(build_batch(values(1)), min_insync_replicas=2))
    partition_log.close()
    alone.close()


@settings(max_examples=40, deadline=None)
@given(
    counts=st.lists(st.integers(1, 30), min_size=1, max_size=40),
    value_size=st.integers(1, 40),
    segment_bytes=st.integers(1700, 6000),
    interval=st.integers(0, 2000),
)
def test_every_offset_reads_from_the_batch_holding_it(
    counts: list[int], value_size: int, segment_bytes: int, interval: int
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        partition_log = open_log(Path(tmp), segment_bytes=segment_bytes,
                                 index_interval_bytes=interval)
        try:
            spans = []
            for count in counts:
                info = append(partition_log, build_batch(values(count, size=value_size)))
                spans.append((info.base_offset, info.last_offset))
            for base, last in spans:
                for offset in {base, (base + last) // 2, last}:
                    got = offsets_in(partition_log.read(offset, 1, HW))
                    assert got == [(base, last)]
        finally:
            partition_log.close()


def test_list_offsets_by_timestamp(tmp_path: Path) -> None:
    partition_log = open_log(tmp_path)
    for base_timestamp in (100, 300, 200):  # max timestamps 102, 302, 202
        append(partition_log, build_batch(values(3), base_timestamp=base_timestamp))

    def lookup(timestamp: int, limit: int = HW) -> tuple[int, int]:
        found = partition_log.list_offset(timestamp, limit)
        return found.offset, found.timestamp

    # Record-exact, as Kafka answers: the first record (in offset order) whose own timestamp
    # is >= the target, with that record's timestamp; not its batch's base offset.
    assert lookup(LATEST_TIMESTAMP) == (9, -1)
    assert lookup(EARLIEST_TIMESTAMP) == (0, -1)
    assert lookup(MAX_TIMESTAMP) == (5, 302)
    assert lookup(0) == (0, 100)
    assert lookup(101) == (1, 101)
    assert lookup(102) == (2, 102)
    assert lookup(150) == (3, 300)
    assert lookup(250) == (3, 300)
    assert lookup(301) == (4, 301)
    assert lookup(303) == (-1, -1)
    partition_log.state = replica_state.state(LEADER, -1)
    partition_log.high_watermark = 3
    assert lookup(LATEST_TIMESTAMP) == (3, -1)
    assert lookup(LATEST_TIMESTAMP, END) == (9, -1)
    assert lookup(102) == (2, 102)
    assert lookup(150) == (-1, -1)  # found beyond the high watermark: not visible
    assert lookup(150, END) == (3, 300)
    assert lookup(MAX_TIMESTAMP) == (-1, -1)
    partition_log.close()


@pytest.mark.parametrize("codec", [1, 2, 3, 4], ids=["gzip", "snappy", "lz4", "zstd"])
def test_list_offsets_by_timestamp_reads_inside_compressed_batches(tmp_path: Path,
                                                                   codec: int) -> None:
    partition_log = open_log(tmp_path)
    # Timestamps out of order inside the batch: 500, 400, 600, 450, 700 at offsets 0-4.
    stamps = [500, 400, 600, 450, 700]
    header = BatchHeader(attributes=codec, last_offset_delta=4, base_timestamp=400,
                         max_timestamp=700)
    append(partition_log, encode_batch(header, [
        Record(i, stamp - 400, b"k", b"v%d" % i) for i, stamp in enumerate(stamps)]))
    found = partition_log.list_offset(420, HW)
    assert (found.offset, found.timestamp) == (0, 500)
    found = partition_log.list_offset(550, HW)
    assert (found.offset, found.timestamp) == (2, 600)
    found = partition_log.list_offset(MAX_TIMESTAMP, HW)
    assert (found.offset, found.timestamp) == (4, 700)
    partition_log.close()


def test_list_offsets_by_timestamp_starts_at_the_log_start(tmp_path: Path) -> None:
    partition_log = open_log(tmp_path)
    append(partition_log, build_batch(values(4), base_timestamp=100))  # 100..103 at 0..3
    partition_log.state = replica_state.state(LEADER, -1)
    partition_log.high_watermark = 4
    asyncio.run(partition_log.delete_records(2))
    found = partition_log.list_offset(0, HW)
    assert (found.offset, found.timestamp) == (2, 102)
    partition_log.close()


def test_list_offsets_of_log_append_time_batches_use_the_batch_time(tmp_path: Path) -> None:
    partition_log = open_log(tmp_path, message_timestamp_type=TimestampType.LOG_APPEND_TIME)
    append(partition_log, build_batch(values(3), base_timestamp=100))
    stamped = partition_log.list_offset(MAX_TIMESTAMP, END)
    assert stamped.offset == 0 and stamped.timestamp > 1_000_000_000_000
    found = partition_log.list_offset(stamped.timestamp, END)
    assert (found.offset, found.timestamp) == (0, stamped.timestamp)
    partition_log.close()


def test_list_offsets_of_an_empty_log(tmp_path: Path) -> None:
    partition_log = open_log(tmp_path)
    assert partition_log.list_offset(MAX_TIMESTAMP, HW).offset == -1
    assert partition_log.list_offset(0, HW).offset == -1
    assert partition_log.list_offset(LATEST_TIMESTAMP, HW).offset == 0
    partition_log.close()


def test_log_append_time_stamps_the_batches(tmp_path: Path) -> None:
    partition_log = open_log(tmp_path, message_timestamp_type=TimestampType.LOG_APPEND_TIME)
    info = append(partition_log, build_batch(values(2), base_timestamp=5), now_ms=123_456)
    assert info.log_append_time_ms == 123_456
    header = read_header(partition_log.read(0, 1000, HW))
    assert header.max_timestamp == 123_456 and header.attributes & 0x08
    assert partition_log.list_offset(MAX_TIMESTAMP, HW).timestamp == 123_456
    partition_log.close()


def test_a_restarted_log_has_the_same_data(tmp_path: Path) -> None:
    partition_log = open_log(tmp_path, segment_bytes=400, index_interval_bytes=100)
    for i in range(12):
        append(partition_log, build_batch(values(i % 3 + 1, size=30)))
    before = [partition_log.read(s.base_offset, 1 << 20, HW)
              for s in partition_log.segments]
    end = partition_log.log_end_offset
    partition_log.close()
    reopened = open_log(tmp_path, segment_bytes=400, index_interval_bytes=100)
    assert reopened.log_end_offset == reopened.high_watermark == end
    assert [reopened.read(s.base_offset, 1 << 20, HW)
            for s in reopened.segments] == before
    assert append(reopened, build_batch(values(1))).base_offset == end
    assert reopened.list_offset(MAX_TIMESTAMP, HW).offset >= 0
    reopened.close()


def _last_log_file(tmp_path: Path) -> Path:
    return max((tmp_path / "t-0").glob("*.log"))


@pytest.mark.parametrize(
    "tail",
    [
        b"\x00\x00\x00",  # a few bytes of a header
        build_batch(values(3), base_offset=9)[:-7],  # a batch cut short
        b"\xff" * 200,  # garbage
    ],
)
def test_a_torn_tail_is_truncated_on_restart(tmp_path: Path, tail: bytes) -> None:
    partition_log = open_log(tmp_path, segment_bytes=500, index_interval_bytes=50)
    for _ in range(9):
        append(partition_log, build_batch(values(3, size=20)))
    end, size = partition_log.log_end_offset, partition_log.size_bytes
    intact = partition_log.read(0, 1 << 20, HW)
    partition_log.close()
    with open(_last_log_file(tmp_path), "ab") as out:
        out.write(tail)

    reopened = open_log(tmp_path, segment_bytes=500, index_interval_bytes=50)
    assert reopened.truncated_at_open == len(tail)
    assert (reopened.log_end_offset, reopened.size_bytes) == (end, size)
    assert reopened.read(0, 1 << 20, HW) == intact
    assert append(reopened, build_batch(values(1))).base_offset == end
    assert offsets_in(reopened.read(end, 1000, HW)) == [(end, end)]
    reopened.close()


def test_a_corrupt_last_batch_is_truncated_on_restart(tmp_path: Path) -> None:
    partition_log = open_log(tmp_path)
    for _ in range(4):
        append(partition_log, build_batch(values(2, size=30)))
    batch_size = len(build_batch(values(2, size=30)))
    partition_log.close()
    path = _last_log_file(tmp_path)
    data = bytearray(path.read_bytes())
    data[-5] ^= 0x01  # a bit flipped in the last batch's records
    path.write_bytes(bytes(data))
    reopened = open_log(tmp_path)
    assert reopened.log_end_offset == 6
    assert reopened.size_bytes == 3 * batch_size
    reopened.close()


def test_missing_or_damaged_indexes_are_rebuilt(tmp_path: Path) -> None:
    settings = {"segment_bytes": 1000, "index_interval_bytes": 60}
    partition_log = open_log(tmp_path, **settings)
    for i in range(30):
        append(partition_log, build_batch(values(i % 4 + 1, size=25)))
    spans = [(b.header.base_offset, b.header.last_offset)
             for s in partition_log.segments
             for b in iter_batches(partition_log.read(s.base_offset, 1 << 20, END))]
    end = partition_log.log_end_offset
    partition_log.close()
    indexes = sorted((tmp_path / "t-0").glob("*.index"))
    expected = {p.name: p.read_bytes() for p in indexes}
    assert len(indexes) >= 3 and all(expected.values())
    indexes[0].unlink()                              # missing
    indexes[1].write_bytes(b"\xff" * 16)             # nonsense entries
    indexes[-1].write_bytes(expected[indexes[-1].name] + b"\x01\x02")  # torn

    reopened = open_log(tmp_path, **settings)
    assert reopened.log_end_offset == end
    assert {p.name: p.read_bytes() for p in sorted((tmp_path / "t-0").glob("*.index"))} == expected
    for base, last in spans:
        assert offsets_in(reopened.read(last, 1, HW)) == [(base, last)]
    reopened.close()


def test_a_stray_index_file_is_removed(tmp_path: Path) -> None:
    partition_log = open_log(tmp_path)
    partition_log.close()
    stray = tmp_path / "t-0" / f"{500:020d}.index"
    stray.write_bytes(b"")
    open_log(tmp_path).close()
    assert not stray.exists()


def test_a_log_cut_short_under_its_index_keeps_every_whole_batch(tmp_path: Path) -> None:
    # As after losing unflushed pages: the index may point past the end of the log.
    partition_log = open_log(tmp_path, index_interval_bytes=0)
    spans = [
        (info.base_offset, info.last_offset, info.log_end_offset)
        for info in (append(partition_log, build_batch(values(2, size=40))) for _ in range(10))
    ]
    partition_log.close()
    path = _last_log_file(tmp_path)
    data = path.read_bytes()
    cut = len(data) // 2 + 7
    path.write_bytes(data[:cut])
    reopened = open_log(tmp_path, index_interval_bytes=0)
    kept = [span for span in spans if len(build_batch(values(2, size=40))) * (span[2] // 2) <= cut]
    assert reopened.log_end_offset == kept[-1][2]
    assert offsets_in(reopened.read(0, 1 << 20, HW)) == [(b, last) for b, last, _ in kept]
    for base, last, _ in kept:
        assert offsets_in(reopened.read(last, 1, HW)) == [(base, last)]
    reopened.close()


def test_an_append_answers_every_field_of_its_result(tmp_path: Path) -> None:
    # Every field differs from the others, so a result built in the wrong order fails here.
    partition_log = open_log(tmp_path)
    asyncio.run(partition_log.become(replica_state.state(
        LEADER, 4, leader=0, replicas=(0, 1), isr=(0, 1), partition_epoch=7)))
    append(partition_log, build_batch(values(3)))
    partition_log.advance_high_watermark(2)
    asyncio.run(partition_log.delete_records(1))
    records = build_batch(values(2)) + build_batch(values(3))
    info = append(partition_log, records)
    assert info._asdict() == {
        "base_offset": 3, "last_offset": 7, "log_append_time_ms": -1, "log_start_offset": 1,
        "log_end_offset": 8, "high_watermark": 2, "size_bytes": len(records),
        "batch_count": 2, "leader_epoch": 4, "partition_epoch": 7}
    partition_log.close()
