"""Tests of services.log.time_index and of timestamp lookups through a segment: the index is
sparse, persists, and a lookup never misses the first batch at or after a time nor points
past it."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from services.log.segment import LogSegment
from services.log.time_index import ENTRY_SIZE, TimeEntry, TimeIndex

from ..record_batches import build_batch, values


def test_entries_only_grow_and_persist(tmp_path: Path) -> None:
    index = TimeIndex(tmp_path / "x.timeindex", 100)
    assert index.lookup(5) == 100 and index.last_entry is None
    assert index.maybe_append(1000, 104)
    assert not index.maybe_append(1000, 110)  # the time did not grow
    assert not index.maybe_append(2000, 104)  # the offset did not grow
    assert index.maybe_append(3000, 120)
    index.close()
    reopened = TimeIndex(tmp_path / "x.timeindex", 100)
    assert reopened.entries() == [TimeEntry(1000, 104), TimeEntry(3000, 120)]
    assert reopened.problem() is None
    # The last entry strictly below the target: its batch and all before are below it.
    assert [reopened.lookup(t) for t in (999, 1000, 1001, 3000, 3001)] == [100, 100, 104, 104,
                                                                          120]
    reopened.truncate_to_offset(120)
    assert reopened.entries() == [TimeEntry(1000, 104)]
    assert (tmp_path / "x.timeindex").stat().st_size == ENTRY_SIZE
    reopened.close()


def test_problems_are_reported(tmp_path: Path) -> None:
    path = tmp_path / "x.timeindex"
    index = TimeIndex(path, 0)
    index.maybe_append(10, 5)
    index.close()
    path.write_bytes(path.read_bytes() + b"\x01")
    torn = TimeIndex(path, 0)
    assert "torn" in (torn.problem() or "")
    torn.close()
    disordered = bytes.fromhex("0000000000000064 00000005 0000000000000032 00000009"
                               .replace(" ", ""))
    path.write_bytes(disordered)
    bad = TimeIndex(path, 0)
    assert "out of order" in (bad.problem() or "")
    bad.close()
    path.write_bytes(disordered[:ENTRY_SIZE])
    ahead = TimeIndex(path, 0)
    assert ahead.problem(next_offset=6) is None
    assert "beyond" in (ahead.problem(next_offset=5) or "")
    ahead.close()


# A segment as (record count, timestamp, value size) per batch; timestamps go up and down, in a
# small range so that ties and near misses are common.
segment_batches = st.lists(
    st.tuples(st.integers(1, 5), st.integers(0, 60), st.integers(1, 100)),
    min_size=1, max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(batches=segment_batches, interval=st.integers(0, 1000),
       targets=st.lists(st.integers(-1, 62), min_size=1, max_size=10),
       reopen=st.booleans())
def test_lookup_never_misses_and_never_points_past_the_answer(
    batches: list[tuple[int, int, int]], interval: int, targets: list[int], reopen: bool
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        segment = LogSegment.create(directory, 1000, interval)
        offset, expected = 1000, []
        for count, timestamp, size in batches:
            batch = bytearray(build_batch(values(count, size=size), base_timestamp=timestamp,
                                          timestamp_step=0, base_offset=0))
            batch[0:8] = offset.to_bytes(8, "big")
            segment.append(batch, [0])
            expected.append((offset, timestamp))
            offset += count
        if reopen:  # the indexes as a restart finds them, or rebuilt
            segment.close()
            segment = LogSegment(directory, 1000, interval)
            segment.recover()
        try:
            for target in targets:
                first = next((base for base, ts in expected if ts >= target), None)
                found = segment.find_by_timestamp(target, 1000)
                assert (found[0] if found else None) == first
                # The scan starts at or before the answer's batch.
                scan_from = segment.time_index.lookup(target)
                if found is not None:
                    holder = segment.find_batch(found[0])
                    assert holder is not None
                    assert segment.index.lookup(scan_from).position <= holder.position
        finally:
            segment.close()


def test_the_time_index_is_sparse_and_rebuilt_when_lost(tmp_path: Path) -> None:
    segment = LogSegment.create(tmp_path, 0, 200)
    offset = 0
    for i in range(40):
        batch = bytearray(build_batch(values(2, size=50), base_timestamp=1000 + 10 * i))
        batch[0:8] = offset.to_bytes(8, "big")
        segment.append(batch, [0])
        offset += 2
    entries = segment.time_index.entries()
    assert 3 <= len(entries) < 40
    assert len(segment.index) == len(entries)  # timestamps grow: one per offset entry
    segment.close()
    (tmp_path / f"{0:020d}.timeindex").unlink()
    reloaded = LogSegment(tmp_path, 0, 200)
    reloaded.load()
    assert reloaded.time_index.entries() == entries
    assert reloaded.find_by_timestamp(1205, 0) == (42, 1210, -1)
    reloaded.close()


def test_batches_without_timestamps_are_stored_and_not_time_indexed(tmp_path: Path) -> None:
    segment = LogSegment.create(tmp_path, 1000, 0)
    for offset in range(1000, 1003):
        batch = bytearray(build_batch(values(1), base_timestamp=-1, timestamp_step=0))
        batch[0:8] = offset.to_bytes(8, "big")
        segment.append(batch, [0])
    assert segment.next_offset == 1003 and len(segment.index) == 2
    assert segment.time_index.entries() == [] and segment.largest_timestamp() > 0
    assert segment.offset_of_max_timestamp() == (1000, -1, -1)
    segment.close()
