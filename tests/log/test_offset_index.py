"""Tests of services.log.offset_index: lookups, persistence and sanity checks."""

from __future__ import annotations

import asyncio
import bisect
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.common.records.record_batch import iter_batches
from services.log.offset_index import ENTRY_SIZE, IndexEntry, OffsetIndex
from services.log.partition_log import LOG_END, PartitionLog
from services.log.topic_config import TopicConfig

from ..record_batches import build_batch, values

ROOT = Path(__file__).resolve().parents[2]

# A segment as (record count, size in bytes) per batch.
segment_batches = st.lists(
    st.tuples(st.integers(1, 50), st.integers(61, 5000)), min_size=1, max_size=60
)


def layout(base: int, batches: list[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """(first offset, last offset, position) of each batch laid out from ``base``."""
    out, offset, position = [], base, 0
    for count, size in batches:
        out.append((offset, offset + count - 1, position))
        offset += count
        position += size
    return out


def index_like_a_segment(path: Path, base: int, batches: list[tuple[int, int]],
                         interval: int) -> OffsetIndex:
    index = OffsetIndex(path, base)
    since_entry = 0
    for (_, last, position), (_, size) in zip(layout(base, batches), batches, strict=True):
        if since_entry > interval:
            index.append(last, position)
            since_entry = 0
        since_entry += size
    return index


@settings(max_examples=200, deadline=None)
@given(
    base=st.integers(0, 10**12),
    batches=segment_batches,
    interval=st.integers(0, 20_000),
)
def test_lookup_never_misses_and_never_returns_a_later_position(
    base: int, batches: list[tuple[int, int]], interval: int
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        index = index_like_a_segment(Path(tmp) / "x.index", base, batches, interval)
        spans = layout(base, batches)
        starts = [position for _, _, position in spans]
        try:
            for first, last, position in spans:
                for target in {first, (first + last) // 2, last}:
                    entry = index.lookup(target)
                    # A batch boundary at or before the batch holding the target ...
                    assert entry.position in starts
                    assert entry.position <= position
                    # ... with an offset that does not pass the target.
                    assert entry.offset <= target
                    # Sparse but bounded: no indexed batch lies between it and the target's.
                    after = bisect.bisect_right(starts, entry.position)
                    skipped = [p for p in starts[after:] if p < position]
                    assert not any(p in {e.position for e in index.entries()} for p in skipped)
        finally:
            index.close()


def test_an_empty_index_points_at_the_segment_start(tmp_path: Path) -> None:
    index = OffsetIndex(tmp_path / "00000000000000000100.index", 100)
    assert index.lookup(100) == IndexEntry(100, 0)
    assert index.lookup(10**9) == IndexEntry(100, 0)
    assert index.floor_position(5000) == 0
    index.close()


def test_entries_persist_and_reload(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000100.index"
    index = OffsetIndex(path, 100)
    for offset, position in [(110, 500), (150, 9000), (2_000_000_100, 70000)]:
        index.append(offset, position)
    index.close()
    assert path.stat().st_size == 3 * ENTRY_SIZE
    reloaded = OffsetIndex(path, 100)
    assert reloaded.lookup(149) == IndexEntry(110, 500)
    assert reloaded.lookup(150) == IndexEntry(150, 9000)
    assert reloaded.last_entry == IndexEntry(2_000_000_100, 70000)
    assert reloaded.floor_position(8999) == 500
    assert reloaded.problem(log_size=80000) is None
    reloaded.close()


def test_entries_must_grow(tmp_path: Path) -> None:
    index = OffsetIndex(tmp_path / "a.index", 0)
    index.append(10, 100)
    for offset, position in [(10, 200), (11, 100), (5, 50)]:
        try:
            index.append(offset, position)
        except ValueError:
            continue
        raise AssertionError(f"({offset}, {position}) was accepted")
    index.close()


def test_problems_are_reported(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000000.index"
    index = OffsetIndex(path, 0)
    index.append(10, 100)
    index.append(20, 300)
    assert index.problem(log_size=400) is None
    assert index.problem(log_size=300) is not None  # points past the log
    assert index.problem(log_size=400, next_offset=15) is not None
    index.close()
    with open(path, "ab") as out:
        out.write(b"\x00\x00\x00")  # a torn entry
    torn = OffsetIndex(path, 0)
    assert "torn" in (torn.problem(log_size=400) or "")
    torn.close()
    path.write_bytes(bytes.fromhex("0000001400000064" "0000000a000000c8"))  # out of order
    disordered = OffsetIndex(path, 0)
    assert "order" in (disordered.problem(log_size=400) or "")
    disordered.close()


def test_truncation_drops_entries_at_or_past_a_position(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000000.index"
    index = OffsetIndex(path, 0)
    for i in range(1, 6):
        index.append(i * 10, i * 100)
    index.flush()
    index.truncate_to_position(300)
    assert index.last_entry == IndexEntry(20, 200)
    assert path.stat().st_size == 2 * ENTRY_SIZE
    index.append(30, 250)
    index.close()


def test_entries_wait_to_be_written_together_and_a_flush_or_close_writes_them(
        tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000000.index"
    index = OffsetIndex(path, 0)
    waiting = OffsetIndex.DEFERRED_ENTRIES
    for i in range(1, waiting):
        index.append(i, i * 100)
    assert path.stat().st_size == 0 and len(index) == waiting - 1
    assert index.lookup(5) == IndexEntry(5, 500)  # served from memory meanwhile
    index.append(waiting, waiting * 100)  # the last that may wait: all written at once
    assert path.stat().st_size == waiting * ENTRY_SIZE
    index.append(waiting + 1, (waiting + 1) * 100)
    index.append(waiting + 2, (waiting + 2) * 100)
    # Cutting into entries not yet written never grows the file, nor keeps what was cut.
    index.truncate_to_position((waiting + 2) * 100)
    assert path.stat().st_size == waiting * ENTRY_SIZE
    index.flush()
    assert path.stat().st_size == (waiting + 1) * ENTRY_SIZE
    index.append(waiting + 5, (waiting + 5) * 100)
    index.close()
    reloaded = OffsetIndex(path, 0)
    assert len(reloaded) == waiting + 2
    assert reloaded.last_entry == IndexEntry(waiting + 5, (waiting + 5) * 100)
    assert reloaded.problem() is None
    reloaded.close()


@pytest.mark.processes
def test_a_process_killed_with_entries_waiting_leaves_a_prefix_that_recovery_rebuilds(
        tmp_path: Path) -> None:
    """A process appends and dies with index entries waiting (its data written, nothing
    flushed or closed): past the recovery point, start-up recovers the segment and its index
    is whole again."""
    script = f"""
import asyncio, os, sys
from pathlib import Path
sys.path[:0] = {[str(ROOT), str(ROOT / "tests")]!r}
from record_batches import build_batch, values
from services.log.partition_log import PartitionLog
from services.log.topic_config import TopicConfig
log = PartitionLog(Path({str(tmp_path / "t-0")!r}), "t", 0, "", TopicConfig(index_interval_bytes=0))
for _ in range(10):
    asyncio.run(log.append(build_batch(values(2))))
assert len(log.segments[-1].index) == 9
os._exit(0)
"""
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    index_path = tmp_path / "t-0" / "00000000000000000000.index"
    assert index_path.stat().st_size == 0  # the entries were waiting
    reopened = PartitionLog(tmp_path / "t-0", "t", 0, "", TopicConfig(index_interval_bytes=0))
    try:
        assert reopened.log_end_offset == 20
        assert [e.offset for e in reopened.segments[-1].index.entries()] == list(range(3, 20, 2))
        assert index_path.stat().st_size == 9 * ENTRY_SIZE  # recovery flushed it
        first = next(iter_batches(reopened.read(11, 1 << 20, LOG_END)))
        assert (first.header.base_offset, first.header.last_offset) == (10, 11)
    finally:
        reopened.close()


def test_a_failed_log_directory_gets_no_index_entries_written_when_its_logs_close(
        tmp_path: Path) -> None:
    """Nothing more is written to a failed log directory, the index entries still waiting
    included: start-up rebuilds them (the segment is past the recovery point)."""
    partition_log = PartitionLog(tmp_path / "t-0", "t", 0, "",
                                 TopicConfig(index_interval_bytes=0))
    for _ in range(3):
        asyncio.run(partition_log.append(build_batch(values(2))))
    index_path = partition_log.segments[-1].index.path
    assert len(partition_log.segments[-1].index) == 2 and index_path.stat().st_size == 0
    partition_log.log_dir.fail(OSError(5, "Input/output error"), "a test")
    partition_log.close()
    assert index_path.stat().st_size == 0
    reopened = PartitionLog(tmp_path / "t-0", "t", 0, "", TopicConfig(index_interval_bytes=0))
    try:
        assert [e.offset for e in reopened.segments[-1].index.entries()] == [3, 5]
    finally:
        reopened.close()
