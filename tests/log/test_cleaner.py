"""Tests of the log cleaner (services.log.cleaner) and the segment swap protocol
(services.log.segment_swap) against real files: what compaction keeps, tombstones and their
delete horizon, compressed batches, when a log is worth cleaning, crash safety of the swap,
reads during cleaning, and a model-based property test."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY

from services.common.errors import ErrorCode, KafkaError
from services.common.records.record import decode_records
from services.common.records.record_batch import (
    DELETE_HORIZON_BIT,
    HEADER_SIZE,
    iter_batches,
    read_header,
)
from services.log import replica_state, segment_swap
from services.log.checkpoint import OffsetCheckpoint
from services.log.cleaner import CLEANER_OFFSET_FILE, LogCleaner
from services.log.log_manager import LogManager, Schedule
from services.log.log_validator import stored_batch_problem
from services.log.partition_log import HIGH_WATERMARK, PartitionLog
from services.log.replica_state import LEADER
from services.log.topic_config import TopicConfig

from ..record_batches import CODECS, REFERENCE_DECOMPRESS, build_batch, compressed_batch

HW = HIGH_WATERMARK
DAY = 86_400_000
NOW = 1_800_000_000_000
Entry = tuple[bytes | None, bytes | None]


def open_log(directory: Path, **settings: object) -> PartitionLog:
    settings.setdefault("cleanup_policy", "compact")
    return PartitionLog(directory / "t-0", "t", 0, "", TopicConfig(**settings))  # type: ignore[arg-type]


def produce(partition_log: PartitionLog, entries: Sequence[Entry], timestamp: int = NOW - DAY,
            **batch: object) -> int:
    """Append one batch of (key, value) records; returns its base offset."""
    records = build_batch([value for _, value in entries],  # type: ignore[misc]
                          keys=[key for key, _ in entries], base_timestamp=timestamp,
                          **batch)  # type: ignore[arg-type]
    return asyncio.run(partition_log.append(records)).base_offset


def clean(partition_log: PartitionLog, now: int = NOW, cleaner: LogCleaner | None = None):  # type: ignore[no-untyped-def]
    return asyncio.run((cleaner or LogCleaner()).clean(partition_log, now))


def worth_cleaning(cleaner: LogCleaner, partition_log: PartitionLog, now: int) -> bool:
    cleanable = cleaner.cleanable(partition_log, now)
    return cleanable is not None and cleanable.worth_cleaning


def read_all(partition_log: PartitionLog) -> list[tuple[int, bytes | None, bytes | None]]:
    """Every record a consumer reading from the log start gets: (offset, key, value); checks
    every batch's framing and CRC on the way."""
    out = []
    offset = partition_log.log_start_offset
    for _ in range(10_000):
        data = partition_log.read(offset, 1 << 20, HW)
        if not data:
            break
        for batch in iter_batches(data):
            assert stored_batch_problem(data, batch.position, offset) is None
            raw = data[batch.position:batch.position + batch.header.size]
            for rec in decode_records(raw, batch.header):
                out.append((batch.header.base_offset + rec.offset_delta, rec.key, rec.value))
            offset = batch.header.next_offset
    return out


def latest_per_key(records: Sequence[tuple[int, bytes | None, bytes | None]]) -> dict:  # type: ignore[type-arg]
    return {key: value for _, key, value in records}


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir()
                  if p.name.endswith((".cleaned", ".swap", ".deleted")))


# ------------------------------------------------------------------------------ basics


def test_the_latest_record_per_key_is_kept_with_its_offset(tmp_path: Path) -> None:
    partition_log = open_log(tmp_path, segment_bytes=400)
    for i in range(20):
        produce(partition_log, [(b"a", b"a%d" % i), (b"b", b"b%d" % i), (b"c%d" % (i % 4), b"x")])
    before = read_all(partition_log)
    active_base = partition_log.segments[-1].base_offset
    assert partition_log.segment_count > 3
    result = clean(partition_log)
    assert result is not None and result.end_offset == active_base
    assert result.records_removed > 0 and result.bytes_written < result.bytes_read
    after = read_all(partition_log)
    # Below the active segment, one record per key, the latest one, at its original offset.
    cleaned = [r for r in after if r[0] < active_base]
    expected = {}
    for offset, key, value in before:
        if offset < active_base:
            expected[key] = (offset, key, value)
    assert cleaned == sorted(expected.values())
    assert [r for r in after if r[0] >= active_base] == [r for r in before
                                                         if r[0] >= active_base]
    assert latest_per_key(after) == latest_per_key(before)
    assert partition_log.log_end_offset == 60 and partition_log.log_start_offset == 0
    partition_log.close()


def test_a_rewritten_batch_keeps_its_base_offset_last_offset_delta_and_producer(
    tmp_path: Path
) -> None:
    partition_log = open_log(tmp_path)
    produce(partition_log, [(b"a", b"1"), (b"b", b"2"), (b"c", b"3"), (b"d", b"4")],
            producer_id=42, producer_epoch=3, base_sequence=0, partition_leader_epoch=7)
    produce(partition_log, [(b"b", b"new"), (b"c", b"new")])
    asyncio.run(partition_log.flush())
    partition_log._roll()  # the data becomes cleanable
    clean(partition_log)
    data = partition_log.read(0, 1 << 20, HW)
    first, second = list(iter_batches(data))
    header = first.header
    assert (header.base_offset, header.last_offset_delta, header.record_count) == (0, 3, 2)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (42, 3, 0)
    assert header.partition_leader_epoch == 7
    assert stored_batch_problem(data, 0, 0) is None
    assert [(r.offset_delta, r.key) for r in decode_records(data, header)] == [(0, b"a"),
                                                                               (3, b"d")]
    assert second.header.base_offset == 4
    partition_log.close()


def test_the_active_segment_and_data_past_the_high_watermark_are_not_cleaned(
    tmp_path: Path
) -> None:
    partition_log = open_log(tmp_path, segment_bytes=200)
    partition_log.state = replica_state.state(LEADER, -1)
    for i in range(12):
        produce(partition_log, [(b"k", b"%d" % i)])
    bases = [s.base_offset for s in partition_log.segments]
    assert len(bases) >= 4
    partition_log.high_watermark = bases[2] + 1  # inside the third segment
    before = [(s.base_offset, s.size) for s in partition_log.segments]
    result = clean(partition_log)
    assert result is not None and result.end_offset == bases[2]
    after = [(s.base_offset, s.size) for s in partition_log.segments]
    assert after[-(len(bases) - 2):] == before[2:]
    partition_log.high_watermark = partition_log.log_end_offset
    records = read_all(partition_log)
    assert records[0] == (bases[2] - 1, b"k", b"%d" % (bases[2] - 1))
    assert [r[0] for r in records][1:] == list(range(bases[2], 12))
    partition_log.close()


def test_min_compaction_lag_keeps_young_segments_dirty(tmp_path: Path) -> None:
    partition_log = open_log(tmp_path, segment_ms=1000, min_compaction_lag_ms=60_000)
    for age in (300_000, 200_000, 30_000, 20_000, 0):  # one segment each (segment.ms)
        produce(partition_log, [(b"k", b"%d" % age)] * 2, timestamp=NOW - age)
    assert partition_log.segment_count == 5
    result = clean(partition_log)
    assert result is not None and result.end_offset == 4  # the 30 s old segment starts at 4
    assert [r[0] for r in read_all(partition_log)] == [3, 4, 5, 6, 7, 8, 9]
    partition_log.close()


def test_tombstones_are_kept_for_delete_retention_then_removed(tmp_path: Path) -> None:
    partition_log = open_log(tmp_path, segment_bytes=200, delete_retention_ms=DAY)
    produce(partition_log, [(b"a", b"1"), (b"b", b"1")])
    produce(partition_log, [(b"a", None)])
    produce(partition_log, [(b"b", b"2"), (b"c", b"1")])
    for i in range(3):
        produce(partition_log, [(b"z", b"%d" % i)])
    cleaner = LogCleaner()
    clean(partition_log, NOW, cleaner)
    records = read_all(partition_log)
    assert (2, b"a", None) in records and (0, b"a", b"1") not in records
    # The tombstone's batch now carries its delete horizon: first clean + delete.retention.ms.
    data = partition_log.read(2, 1 << 20, HW)
    header = read_header(data)
    assert header.attributes & DELETE_HORIZON_BIT and header.base_timestamp == NOW + DAY
    assert header.max_timestamp == NOW - DAY  # record timestamps unchanged
    assert decode_records(data, header)[0].timestamp_delta == -2 * DAY
    # Nothing dirty is left, but the horizon makes the log worth cleaning once it passes.
    assert not worth_cleaning(cleaner, partition_log, NOW + DAY - 1)
    assert worth_cleaning(cleaner, partition_log, NOW + DAY)
    clean(partition_log, NOW + DAY - 1, cleaner)
    assert (2, b"a", None) in read_all(partition_log)
    assert asyncio.run(cleaner.clean_logs([partition_log], NOW + DAY))
    records = read_all(partition_log)
    assert all(key != b"a" for _, key, _ in records)
    assert latest_per_key(records)[b"b"] == b"2"
    assert not worth_cleaning(cleaner, partition_log, NOW + 10 * DAY)
    partition_log.close()


def test_keyless_records_are_refused_by_compacted_topics_only(tmp_path: Path) -> None:
    compacted = open_log(tmp_path / "c")
    with pytest.raises(KafkaError) as raised:
        produce(compacted, [(b"a", b"1"), (None, b"2")])
    assert raised.value.errno == ErrorCode.invalid_record.value
    assert compacted.log_end_offset == 0
    produce(compacted, [(b"a", b"1")])
    compacted.close()
    plain = open_log(tmp_path / "d", cleanup_policy="delete")
    produce(plain, [(None, b"1")])
    assert plain.log_end_offset == 1
    plain.close()


# -------------------------------------------------------------------- compressed batches


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_compressed_batches_are_compacted_in_their_own_codec(tmp_path: Path, codec: str) -> None:
    partition_log = open_log(tmp_path, segment_bytes=2000)
    for i in range(6):
        entries = [(b"k%d" % j, b"v%d-%d" % (i, j) * 20) for j in range(10)]
        entries += [(b"only%d" % i, b"x" * 100)]
        asyncio.run(partition_log.append(compressed_batch(entries, codec, NOW - DAY + i)))
    asyncio.run(partition_log.flush())
    partition_log._roll()  # the data becomes cleanable
    before = read_all(partition_log)
    clean(partition_log)
    after = read_all(partition_log)
    assert latest_per_key(after) == latest_per_key(before)
    assert len(after) == 10 + 6
    data = b"".join(partition_log.read(s.base_offset, 1 << 20, HW)
                    for s in partition_log.segments if s.size)
    for batch in iter_batches(data):
        assert batch.header.compression == CODECS[codec]
        assert stored_batch_problem(data, batch.position, 0) is None
        payload = data[batch.position + HEADER_SIZE:batch.position + batch.header.size]
        assert REFERENCE_DECOMPRESS[codec](payload)  # the reference library reads what was written
    partition_log.close()


# ----------------------------------------------------------------- producers, segments


def test_a_producers_last_batch_stays_as_an_empty_batch(tmp_path: Path) -> None:
    partition_log = open_log(tmp_path)
    produce(partition_log, [(b"a", b"1")], producer_id=7, producer_epoch=0, base_sequence=0)
    produce(partition_log, [(b"b", b"1"), (b"c", b"1")], producer_id=7, producer_epoch=0,
            base_sequence=1)
    produce(partition_log, [(b"a", b"2"), (b"b", b"2"), (b"c", b"2")])
    asyncio.run(partition_log.flush())
    partition_log._roll()  # the data becomes cleanable
    clean(partition_log)
    data = partition_log.read(0, 1 << 20, HW)
    headers = [b.header for b in iter_batches(data)]
    # The first batch of producer 7 is gone; its last one stays, empty, for its sequence.
    assert [(h.base_offset, h.last_offset_delta, h.record_count, h.producer_id,
             h.base_sequence) for h in headers] == [(1, 1, 0, 7, 1), (3, 2, 3, -1, -1)]
    assert stored_batch_problem(data, 0, 0) is None
    partition_log.close()
    reopened = open_log(tmp_path)
    entry = reopened.producer_state.entry(7)
    assert entry is not None and entry.last_seq == 2
    reopened.close()


def test_small_cleaned_segments_are_grouped_into_one(tmp_path: Path) -> None:
    partition_log = open_log(tmp_path, segment_ms=1000)
    for i in range(8):
        produce(partition_log, [(b"k", b"%d" % i)], timestamp=NOW - DAY + 2000 * i)
    assert partition_log.segment_count == 8
    clean(partition_log)
    assert [s.base_offset for s in partition_log.segments] == [0, 7]
    assert read_all(partition_log) == [(6, b"k", b"6"), (7, b"k", b"7")]
    assert leftovers(tmp_path / "t-0") == []
    partition_log.close()
    reopened = open_log(tmp_path, segment_ms=1000)
    assert read_all(reopened) == [(6, b"k", b"6"), (7, b"k", b"7")]
    # Reads inside the gap land on the next batch.
    assert read_header(reopened.read(2, 1 << 20, HW)).base_offset == 6
    reopened.close()


def test_a_full_offset_map_cleans_part_of_the_log_per_pass(tmp_path: Path) -> None:
    partition_log = open_log(tmp_path, segment_ms=1000)
    for i in range(6):  # one segment per batch, three keys each, all of them new
        produce(partition_log, [(b"s%d-%d" % (i, j), b"v") for j in range(3)] + [(b"k", b"%d" % i)],
                timestamp=NOW - DAY + 2000 * i)
    cleaner = LogCleaner(max_map_keys=5)
    first = clean(partition_log, NOW, cleaner)
    # The map filled in the second segment: the pass stops at its end.
    assert first is not None and first.end_offset == 8
    assert [r for r in read_all(partition_log) if r[1] == b"k"][0] == (7, b"k", b"1")
    assert cleaner.first_dirty_offset(partition_log) == 8
    second = clean(partition_log, NOW, cleaner)
    assert second is not None and second.end_offset == 16
    third = clean(partition_log, NOW, cleaner)
    assert third is not None and third.end_offset == 20
    assert [r for r in read_all(partition_log) if r[1] == b"k"] == [(19, b"k", b"4"),
                                                                  (23, b"k", b"5")]
    partition_log.close()


def test_a_swap_is_refused_when_the_log_changed_meanwhile(tmp_path: Path) -> None:
    partition_log = open_log(tmp_path, segment_bytes=200, cleanup_policy="compact,delete",
                             retention_ms=-1)
    for i in range(8):
        produce(partition_log, [(b"k", b"%d" % i)])
    first = partition_log.segments[0]
    asyncio.run(partition_log.delete_records(first.next_offset))
    assert partition_log.segments[0] is not first
    segment_swap.segment_files(tmp_path / "t-0", 0, segment_swap.CLEANED_SUFFIX)[2].touch()
    assert not asyncio.run(partition_log.replace_segments([first]))
    assert leftovers(tmp_path / "t-0") == []
    # A segment whose size changed since it was cleaned (a truncation) is not replaced either.
    second = partition_log.segments[0]
    segment_swap.segment_files(tmp_path / "t-0", second.base_offset,
                               segment_swap.CLEANED_SUFFIX)[2].touch()
    assert not asyncio.run(partition_log.replace_segments(
        [second], [second.size + 1]))
    assert partition_log.segments[0] is second and leftovers(tmp_path / "t-0") == []
    partition_log.close()


# ------------------------------------------------------------------- when to clean


def test_the_dirty_ratio_decides_when_a_log_is_worth_cleaning(tmp_path: Path) -> None:
    partition_log = open_log(tmp_path, segment_bytes=300)
    for i in range(40):
        produce(partition_log, [(b"k%d" % i, b"v" * 40)])  # distinct keys: nothing to remove
    cleaner = LogCleaner()
    assert cleaner.cleanable(partition_log).dirty_ratio == 1.0  # type: ignore[union-attr]
    assert len(asyncio.run(cleaner.clean_logs([partition_log], NOW))) == 1
    assert cleaner.cleanable(partition_log).dirty_bytes == 0  # type: ignore[union-attr]
    assert asyncio.run(cleaner.clean_logs([partition_log], NOW)) == []
    for i in range(6):  # a few dirty segments: under half of the cleanable bytes
        produce(partition_log, [(b"k%d" % i, b"w" * 40)])
    cleanable = cleaner.cleanable(partition_log)
    assert cleanable is not None and 0 < cleanable.dirty_ratio < 0.5
    assert asyncio.run(cleaner.clean_logs([partition_log], NOW)) == []
    for i in range(40):
        produce(partition_log, [(b"k%d" % i, b"x" * 40)])
    assert asyncio.run(cleaner.clean_logs([partition_log], NOW))
    assert {value for _, _, value in read_all(partition_log)} >= {b"x" * 40}
    partition_log.close()


def test_max_compaction_lag_forces_a_cleaning(tmp_path: Path) -> None:
    partition_log = open_log(tmp_path, segment_bytes=300, min_cleanable_dirty_ratio=0.99,
                             max_compaction_lag_ms=DAY)
    old = NOW - 3 * DAY
    for i in range(20):
        produce(partition_log, [(b"k%d" % i, b"v" * 40)], timestamp=old)
    cleaner = LogCleaner()
    asyncio.run(cleaner.clean_logs([partition_log], old))
    # The segment that was active is dirty now, its records as old as the rest.
    for i in range(3):
        produce(partition_log, [(b"n%d" % i, b"v" * 40)], timestamp=NOW)
    cleanable = cleaner.cleanable(partition_log, NOW)
    assert cleanable is not None and 0 < cleanable.dirty_ratio < 0.99
    assert not worth_cleaning(cleaner, partition_log, old + DAY)
    assert worth_cleaning(cleaner, partition_log, old + DAY + 1)
    assert asyncio.run(cleaner.clean_logs([partition_log], old + DAY + 1))
    partition_log.close()


def test_the_log_manager_runs_rounds_checkpoints_and_counts(tmp_path: Path) -> None:
    def counter(name: str) -> float:
        return REGISTRY.get_sample_value(name) or 0.0

    manager = LogManager(tmp_path, TopicConfig(segment_bytes=300),
                         schedule=Schedule(cleaner_backoff_ms=10))
    manager.load()
    compacted = manager.create("c", 0, "", {"cleanup.policy": "compact"})
    plain = manager.create("p", 0, "", {})
    for i in range(30):
        produce(compacted, [(b"k%d" % (i % 3), b"v" * 40)])
        produce(plain, [(b"k%d" % (i % 3), b"v" * 40)])
    runs = counter("kbroker_log_cleaner_runs_total")
    removed = counter("kbroker_log_cleaner_removed_records_total")
    results = asyncio.run(manager.clean_logs(NOW))
    assert [(r.topic, r.partition) for r in results] == [("c", 0)]
    assert counter("kbroker_log_cleaner_runs_total") == runs + 1
    assert counter("kbroker_log_cleaner_removed_records_total") > removed
    end = results[0].end_offset
    assert OffsetCheckpoint(tmp_path / CLEANER_OFFSET_FILE).read() == {("c", 0): end}
    assert len(read_all(plain)) == 30
    manager.close()
    reloaded = LogManager(tmp_path, TopicConfig(segment_bytes=300))
    reloaded.load()
    assert reloaded.cleaner.first_dirty_offset(reloaded.get("c", 0)) == end
    assert reloaded.delete("c", 0)
    assert OffsetCheckpoint(tmp_path / CLEANER_OFFSET_FILE).read() == {}
    reloaded.close()


def test_the_background_cleaner_compacts_without_being_asked(tmp_path: Path) -> None:
    async def main() -> None:
        manager = LogManager(tmp_path, TopicConfig(segment_bytes=300),
                             schedule=Schedule(cleaner_backoff_ms=20))
        manager.load()
        partition_log = manager.create("c", 0, "", {"cleanup.policy": "compact"})
        for i in range(30):
            await partition_log.append(build_batch([b"v" * 40], keys=[b"k%d" % (i % 2)]))
        manager.start_background()
        try:
            for _ in range(200):
                if len(read_all(partition_log)) < 10:
                    break
                await asyncio.sleep(0.02)
            assert len(read_all(partition_log)) < 10
        finally:
            await manager.stop_background()
            manager.close()

    asyncio.run(main())


# ------------------------------------------------------------------------- crash safety


def _grouped_log(directory: Path) -> PartitionLog:
    """Five small segments (rolled by segment.ms) that the cleaner merges into one."""
    partition_log = open_log(directory, segment_ms=1000)
    for i in range(5):
        produce(partition_log, [(b"k%d" % (i % 2), b"%d" % i), (b"u%d" % i, b"u")],
                timestamp=NOW - DAY + 2000 * i)
    return partition_log


def test_a_crash_at_any_point_of_the_swap_leaves_the_old_or_the_new_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reference = _grouped_log(tmp_path / "reference")
    before = read_all(reference)
    real_replace = segment_swap.os.replace
    renames = 0

    def counting(src, dst):  # type: ignore[no-untyped-def]
        nonlocal renames
        renames += 1
        real_replace(src, dst)

    monkeypatch.setattr(segment_swap.os, "replace", counting)
    clean(reference)
    monkeypatch.setattr(segment_swap.os, "replace", real_replace)
    after = read_all(reference)
    reference.close()
    # Four files a segment (log, offset, time and transaction indexes); four old segments.
    assert renames == 4 + 4 * 4 + 4 and after != before

    class SimulatedCrashError(Exception):
        pass

    outcomes = set()
    for crash_at in range(renames):
        directory = tmp_path / f"crash-{crash_at}"
        partition_log = _grouped_log(directory)
        done = 0

        def crashing(src, dst, crash_at=crash_at):  # type: ignore[no-untyped-def]
            nonlocal done
            if done == crash_at:
                raise SimulatedCrashError
            done += 1
            real_replace(src, dst)

        monkeypatch.setattr(segment_swap.os, "replace", crashing)
        with pytest.raises(SimulatedCrashError):
            clean(partition_log)
        monkeypatch.setattr(segment_swap.os, "replace", real_replace)
        partition_log.close(flush=False)
        reopened = open_log(directory, segment_ms=1000)
        records = read_all(reopened)
        assert records in (before, after), crash_at
        outcomes.add("old" if records == before else "new")
        assert leftovers(directory / "t-0") == []
        # And the recovered log cleans (again) to the same result.
        clean(reopened)
        assert read_all(reopened) == after
        reopened.close()
    assert outcomes == {"old", "new"}


def test_leftover_cleaned_files_are_removed_at_start_up(tmp_path: Path) -> None:
    partition_log = _grouped_log(tmp_path)
    before = read_all(partition_log)
    partition_log.close()
    directory = tmp_path / "t-0"
    for path in segment_swap.segment_files(directory, 0, segment_swap.CLEANED_SUFFIX):
        path.write_bytes(b"half written")
    (directory / ("00000000000000000002.index" + segment_swap.SWAP_SUFFIX)).write_bytes(b"x")
    (directory / ("00000000000000000009.log" + segment_swap.DELETED_SUFFIX)).write_bytes(b"x")
    reopened = open_log(tmp_path, segment_ms=1000)
    assert read_all(reopened) == before and leftovers(directory) == []
    reopened.close()


# ----------------------------------------------------------------- reads while cleaning


def test_reads_during_cleaning_always_see_a_complete_log(tmp_path: Path) -> None:
    partition_log = open_log(tmp_path, segment_bytes=600)
    for i in range(60):
        produce(partition_log, [(b"k%d" % (i % 7), b"%d" % i), (b"s%d" % i, b"s")])
    before = read_all(partition_log)
    expected = latest_per_key(before)

    async def main() -> int:
        task = asyncio.create_task(LogCleaner().clean(partition_log, NOW))
        reads = 0
        while not task.done():
            records = read_all(partition_log)
            assert latest_per_key(records) == expected
            assert [r[0] for r in records] == sorted({r[0] for r in records})
            reads += 1
            await asyncio.sleep(0)
        assert await task is not None
        return reads

    assert asyncio.run(main()) > 1
    assert latest_per_key(read_all(partition_log)) == expected
    partition_log.close()


# ------------------------------------------------------------------------ property test

KEYS = [b"a", b"b", b"c", b"d", b"e"]
batches_strategy = st.lists(
    st.lists(st.tuples(st.sampled_from(KEYS), st.one_of(st.none(), st.binary(max_size=30))),
             min_size=1, max_size=4),
    min_size=1, max_size=25,
)


# The largest batch drawn (four records of 30-byte values) takes about 215 bytes, and a batch
# larger than segment.bytes is refused (RECORD_LIST_TOO_LARGE), so segments start above it.
@settings(max_examples=40, deadline=None)
@given(batches=batches_strategy, segment_bytes=st.integers(min_value=220, max_value=800))
def test_compaction_matches_the_model(batches, segment_bytes: int) -> None:  # type: ignore[no-untyped-def]
    with tempfile.TemporaryDirectory() as temporary:
        directory = Path(temporary)
        partition_log = open_log(directory, segment_bytes=segment_bytes, delete_retention_ms=DAY)
        for entries in batches:
            produce(partition_log, entries)
        before = read_all(partition_log)
        end = partition_log.segments[-1].base_offset  # the cleanable end: the active segment

        def model(drop_tombstones: bool) -> list[tuple[int, bytes | None, bytes | None]]:
            latest = {key: offset for offset, key, _ in before if offset < end}
            return [r for r in before if r[0] >= end or (
                latest[r[1]] == r[0] and not (drop_tombstones and r[2] is None))]

        cleaner = LogCleaner()
        clean(partition_log, NOW, cleaner)
        assert read_all(partition_log) == model(drop_tombstones=False)
        clean(partition_log, NOW + DAY, cleaner)
        assert read_all(partition_log) == model(drop_tombstones=True)
        partition_log.close()
        reopened = open_log(directory, segment_bytes=segment_bytes)
        assert read_all(reopened) == model(drop_tombstones=True)
        assert reopened.log_end_offset == len(before)
        reopened.close()
        shutil.rmtree(directory, ignore_errors=True)
