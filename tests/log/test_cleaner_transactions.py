"""The log cleaner and transactions, against real files: the records of aborted transactions go
(and never win a key), markers stay while their transaction has data and then for
delete.retention.ms, the transaction index of cleaned segments, the last stable offset as the
limit of cleaning, and a producer's last batch or marker kept empty."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

from services.common.records.control_records import (
    ControlRecordType,
    EndTransactionMarker,
    read_end_transaction_marker,
)
from services.common.records.record import decode_records
from services.common.records.record_batch import TRANSACTIONAL_BIT, iter_batches
from services.log.cleaner import LogCleaner
from services.log.partition_log import HIGH_WATERMARK, LAST_STABLE, PartitionLog
from services.log.producer_state import ProducerStateManager
from services.log.topic_config import TopicConfig
from services.log.transaction_index import AbortedTxn
from services.log.verification import VerificationRequiredError

from ..record_batches import build_batch

DAY = 86_400_000
# Batch times; the producers are recent enough not to expire during the test.
NOW = 1_800_000_000_000
RETENTION = DAY  # delete.retention.ms's default

Entry = tuple[bytes, bytes | None]


def open_log(directory: Path, **settings: object) -> PartitionLog:
    settings.setdefault("cleanup_policy", "compact")
    return PartitionLog(directory / "t-0", "t", 0, "", TopicConfig(**settings))  # type: ignore[arg-type]


def produce(partition_log: PartitionLog, entries: Sequence[Entry], producer_id: int = -1,
            sequence: int = -1, transactional: bool = False) -> int:
    """One batch of (key, value) records, verified if it needs to be; returns its offset."""
    records = build_batch([value for _, value in entries], keys=[key for key, _ in entries],
                          base_timestamp=NOW - DAY, producer_id=producer_id,
                          producer_epoch=0 if producer_id >= 0 else -1, base_sequence=sequence,
                          attributes=TRANSACTIONAL_BIT if transactional else 0)
    try:
        return asyncio.run(partition_log.append(records)).base_offset
    except VerificationRequiredError as needed:
        return asyncio.run(partition_log.append(
            records, verification_guard=needed.guard)).base_offset


def end(partition_log: PartitionLog, producer_id: int, committed: bool) -> int:
    return asyncio.run(partition_log.write_txn_marker(
        producer_id, 0, committed, 0, now_ms=NOW - DAY)).base_offset


def roll(partition_log: PartitionLog) -> None:
    """Make everything so far cleanable."""
    asyncio.run(partition_log.flush())
    partition_log._roll()


def clean(partition_log: PartitionLog, now: int = NOW, cleaner: LogCleaner | None = None):  # type: ignore[no-untyped-def]
    return asyncio.run((cleaner or LogCleaner()).clean(partition_log, now))


def consumed(partition_log: PartitionLog, committed: bool) -> list[tuple[int, bytes, bytes]]:
    """(offset, key, value) of the data records a consumer gets from the log start: a
    read_committed one drops the aborted transactions the reads list, as clients do."""
    out: list[tuple[int, bytes, bytes]] = []
    offset = partition_log.log_start_offset
    for _ in range(1000):
        if committed:
            records, aborted = partition_log.read_committed(offset, 1 << 20)
        else:
            records, aborted = partition_log.read(offset, 1 << 20, HIGH_WATERMARK), []
        if not records:
            return out
        aborting: set[int] = set()
        pending = sorted(aborted, key=lambda txn: txn.first_offset)
        for batch in iter_batches(records):
            header = batch.header
            while pending and pending[0].first_offset <= header.last_offset:
                aborting.add(pending.pop(0).producer_id)
            raw = records[batch.position:batch.position + header.size]
            if header.is_control:
                aborting.discard(header.producer_id)
            elif not (header.is_transactional and header.producer_id in aborting):
                out += [(header.base_offset + r.offset_delta, r.key, r.value)  # type: ignore[misc]
                        for r in decode_records(raw, header)]
            offset = header.next_offset
    raise AssertionError("the log never ended")


def control_batches(partition_log: PartitionLog) -> list[tuple[int, int, str | None, bool]]:
    """(offset, producer id, marker type or None if emptied, has a delete horizon)."""
    out = []
    for segment in partition_log.segments:
        for batch in segment.batches():
            header = batch.header
            if header.is_control:
                raw = segment.read_batch(batch)
                kind = read_end_transaction_marker(raw, header).type.name if (
                    header.record_count) else None  # type: ignore[union-attr]
                out.append((header.base_offset, header.producer_id, kind,
                            header.delete_horizon is not None))
    return out


def indexed(partition_log: PartitionLog) -> list[AbortedTxn]:
    return [txn for segment in partition_log.segments for txn in segment.txn_index.entries()]


def test_aborted_records_go_never_win_their_key_and_their_marker_goes_last(
    tmp_path: Path,
) -> None:
    partition_log = open_log(tmp_path)
    produce(partition_log, [(b"k", b"v1"), (b"j", b"j1")])               # 0-1
    produce(partition_log, [(b"k", b"bad"), (b"x", b"bad")], 7, 0, True)  # 2-3
    produce(partition_log, [(b"j", b"j2")])                              # 4
    end(partition_log, 7, committed=False)                               # 5
    # The producer goes on: its aborted batch is not the one holding its last sequence.
    produce(partition_log, [(b"y", b"y1")], 7, 2)                        # 6
    roll(partition_log)
    committed_view = consumed(partition_log, committed=True)
    assert committed_view == [(0, b"k", b"v1"), (1, b"j", b"j1"), (4, b"j", b"j2"),
                              (6, b"y", b"y1")]
    assert indexed(partition_log) == [AbortedTxn(7, 2, 5, 6)]

    # First pass: the aborted records go; the marker stays, as its batch was still there.
    result = clean(partition_log)
    assert result is not None
    assert consumed(partition_log, committed=False) == [(0, b"k", b"v1"), (4, b"j", b"j2"),
                                                        (6, b"y", b"y1")]
    assert consumed(partition_log, committed=True) == consumed(partition_log, committed=False)
    assert control_batches(partition_log) == [(5, 7, "ABORT", False)]
    assert indexed(partition_log) == [AbortedTxn(7, 2, 5, 6)]
    # Second pass: no data left: the marker gets a delete horizon, and stays until then.
    clean(partition_log, NOW + 1)
    assert control_batches(partition_log) == [(5, 7, "ABORT", True)]
    assert indexed(partition_log) == []
    clean(partition_log, NOW + 1 + RETENTION - 1)
    assert control_batches(partition_log) == [(5, 7, "ABORT", True)]
    clean(partition_log, NOW + 1 + RETENTION)
    assert control_batches(partition_log) == []
    assert consumed(partition_log, committed=True) == [(0, b"k", b"v1"), (4, b"j", b"j2"),
                                                       (6, b"y", b"y1")]
    partition_log.close()


def test_a_commit_marker_stays_while_its_transaction_has_records(tmp_path: Path) -> None:
    partition_log = open_log(tmp_path)
    produce(partition_log, [(b"a", b"1"), (b"b", b"1")], 7, 0, True)    # 0-1
    end(partition_log, 7, committed=True)                               # 2
    produce(partition_log, [(b"a", b"2")])                              # 3
    roll(partition_log)
    clean(partition_log)
    assert control_batches(partition_log) == [(2, 7, "COMMIT", False)]
    assert consumed(partition_log, committed=True) == [(1, b"b", b"1"), (3, b"a", b"2")]
    produce(partition_log, [(b"b", b"2")])                              # 4
    roll(partition_log)
    clean(partition_log, NOW + 1)
    # The transaction's last record is superseded; its batch stays empty (the producer's last
    # sequence), so the marker does too.
    assert control_batches(partition_log) == [(2, 7, "COMMIT", False)]
    assert consumed(partition_log, committed=True) == [(3, b"a", b"2"), (4, b"b", b"2")]
    partition_log.close()


def test_cleaning_stops_at_the_last_stable_offset(tmp_path: Path) -> None:
    partition_log = open_log(tmp_path)
    produce(partition_log, [(b"k", b"1")])                              # 0
    roll(partition_log)
    produce(partition_log, [(b"k", b"2")], 7, 0, True)                  # 1: still open
    roll(partition_log)
    produce(partition_log, [(b"k", b"3")])                              # 2
    roll(partition_log)
    assert partition_log.last_stable_offset == 1 and partition_log.high_watermark == 3
    cleaner = LogCleaner()
    cleanable = cleaner.cleanable(partition_log, NOW)
    assert cleanable is not None and [ref.segment.base_offset for ref in cleanable.segments] == [0]
    result = clean(partition_log, cleaner=cleaner)
    assert result is not None and result.end_offset == 1
    # Record 0 is not superseded by anything below the LSO: everything is still there.
    assert consumed(partition_log, committed=False) == [(0, b"k", b"1"), (1, b"k", b"2"),
                                                        (2, b"k", b"3")]
    end(partition_log, 7, committed=False)                              # 3
    roll(partition_log)
    clean(partition_log, NOW + 1, cleaner)
    assert consumed(partition_log, committed=True) == [(2, b"k", b"3")]
    partition_log.close()


def test_transactions_spread_over_cleaned_groups_are_indexed_where_their_markers_are(
    tmp_path: Path,
) -> None:
    partition_log = open_log(tmp_path, segment_bytes=180)  # one or two batches a segment
    produce(partition_log, [(b"a", b"1")], 7, 0, True)                  # 0
    produce(partition_log, [(b"b", b"1")], 8, 0, True)                  # 1
    produce(partition_log, [(b"c", b"1")])                              # 2
    produce(partition_log, [(b"d", b"1")], 8, 1, True)                  # 3
    end(partition_log, 7, committed=False)                              # 4
    produce(partition_log, [(b"e", b"1")])                              # 5
    end(partition_log, 8, committed=False)                              # 6
    produce(partition_log, [(b"f", b"1")])                              # 7
    roll(partition_log)
    assert partition_log.segment_count > 3
    before = indexed(partition_log)
    assert before == [AbortedTxn(7, 0, 4, 1), AbortedTxn(8, 1, 6, 7)]
    # Small groups: segment.bytes bounds what is merged into one cleaned segment.
    clean(partition_log)
    assert consumed(partition_log, committed=False) == [
        (2, b"c", b"1"), (5, b"e", b"1"), (7, b"f", b"1")]
    # The markers stayed (their batches were there in this pass), and so did their entries,
    # each in the segment that holds its marker.
    assert indexed(partition_log) == before
    for segment in partition_log.segments:
        for txn in segment.txn_index.entries():
            assert segment.base_offset <= txn.last_offset < segment.next_offset
    # After a restart the indexes are taken as they are: nothing to rebuild.
    partition_log.close()
    reopened = PartitionLog(tmp_path / "t-0", "t", 0, "",
                            TopicConfig(cleanup_policy="compact", segment_bytes=180),
                            recovery_point=partition_log.log_end_offset)
    assert indexed(reopened) == before and reopened.last_stable_offset == 8
    reopened.close()


def test_a_producers_last_batch_and_marker_stay_empty(tmp_path: Path) -> None:
    partition_log = open_log(tmp_path)
    produce(partition_log, [(b"k", b"bad")], 7, 0, True)                # 0
    end(partition_log, 7, committed=False)                              # 1
    produce(partition_log, [(b"k", b"good")])                           # 2
    roll(partition_log)
    clean(partition_log)
    # Producer 7's only batch is its last sequence: kept, empty; so is the marker then.
    [batch, marker, _] = [b.header for s in partition_log.segments for b in s.batches()]
    assert (batch.base_offset, batch.record_count, batch.producer_id) == (0, 0, 7)
    assert control_batches(partition_log) == [(1, 7, "ABORT", False)]
    assert consumed(partition_log, committed=True) == [(2, b"k", b"good")]
    partition_log.close()


def test_an_emptied_marker_still_ends_its_transaction_on_replay(tmp_path: Path) -> None:
    state = ProducerStateManager(tmp_path)
    data = next(iter(iter_batches(build_batch([b"v"], producer_id=7, producer_epoch=0,
                                              base_sequence=0,
                                              attributes=TRANSACTIONAL_BIT)))).header
    state.replay(data)
    assert state.ongoing_transactions() == [(0, 7)]
    emptied = data._replace(base_offset=5, attributes=data.attributes | 0x20, record_count=0,
                            base_sequence=-1)
    assert state.replay(emptied, None) is not None
    assert state.ongoing_transactions() == [] and state.first_unstable_offset == 0
    state.on_high_watermark(6)
    assert state.first_unstable_offset is None
    assert state.replay(emptied._replace(base_offset=6), EndTransactionMarker(
        type=ControlRecordType.ABORT, coordinator_epoch=0)) is None  # nothing left to end


def test_read_committed_after_cleaning_matches_before(tmp_path: Path) -> None:
    partition_log = open_log(tmp_path, segment_bytes=300)
    sequences = {7: 0, 8: 0}
    for round_ in range(6):
        for pid in (7, 8):
            produce(partition_log, [(b"k%d" % (round_ % 3), b"%d-%d" % (pid, round_))], pid,
                    sequences[pid], True)
            sequences[pid] += 1
        produce(partition_log, [(b"p%d" % round_, b"plain")])
        end(partition_log, 7, committed=round_ % 2 == 0)
        end(partition_log, 8, committed=round_ % 3 != 0)
    roll(partition_log)
    latest = {key: value for _, key, value in consumed(partition_log, committed=True)}
    clean(partition_log)
    after = consumed(partition_log, committed=True)
    assert {key: value for _, key, value in after} == latest
    assert len({key for _, key, _ in after}) == len(after)  # one record per key
    assert partition_log.list_offset(-1, LAST_STABLE).offset == partition_log.log_end_offset
    partition_log.close()
