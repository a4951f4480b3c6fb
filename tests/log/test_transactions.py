"""Transactions in a partition log on disk (no gRPC): what starts and ends a transaction, the
last stable offset, the transaction index, read_committed reads, verification guards, marker
fencing, coordinator appends, followers, truncation and the state after clean and unclean
restarts."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from services.common.errors import ErrorCode, KafkaError
from services.common.records.control_records import (
    ControlRecordType,
    EndTransactionMarker,
    build_end_transaction_batch,
)
from services.common.records.record_batch import TRANSACTIONAL_BIT, iter_batches
from services.log import replica_state
from services.log.partition_log import HIGH_WATERMARK, LAST_STABLE, LOG_END, PartitionLog
from services.log.producer_state import snapshot_name
from services.log.replica_state import FOLLOWER, LEADER
from services.log.segment import TXN_INDEX_SUFFIX
from services.log.topic_config import TimestampType, TopicConfig
from services.log.transaction_index import AbortedTxn
from services.log.verification import VerificationRequiredError

from ..record_batches import build_batch, values

NOW = int(time.time() * 1000)


def data(producer_id: int, sequence: int, count: int = 1, epoch: int = 0,
         transactional: bool = True) -> bytes:
    return build_batch(values(count, tag=f"p{producer_id}s{sequence}-"), producer_id=producer_id,
                       producer_epoch=epoch, base_sequence=sequence, base_timestamp=NOW,
                       attributes=TRANSACTIONAL_BIT if transactional else 0)


def plain(count: int = 1) -> bytes:
    return build_batch(values(count), base_timestamp=NOW)


def open_log(directory: Path, **settings: object) -> PartitionLog:
    return PartitionLog(directory / "t-0", "t", 0, "", TopicConfig(**settings))  # type: ignore[arg-type]


def replicated_leader(directory: Path, **settings: object) -> PartitionLog:
    """A leader with followers: its high watermark moves only when told."""
    partition_log = open_log(directory, **settings)
    asyncio.run(partition_log.become(replica_state.state(LEADER, 0, in_sync_alone=False)))
    return partition_log


def run(coroutine):  # type: ignore[no-untyped-def]
    return asyncio.run(coroutine)


def error_of(coroutine) -> KafkaError:  # type: ignore[no-untyped-def]
    with pytest.raises(KafkaError) as caught:
        asyncio.run(coroutine)
    return caught.value


def append(partition_log: PartitionLog, records: bytes, **options: object):  # type: ignore[no-untyped-def]
    """Append as the handler does: a batch that needs verifying is sent again with the guard
    it was answered with (the coordinator is taken to agree)."""
    try:
        return run(partition_log.append(records, **options))  # type: ignore[arg-type]
    except VerificationRequiredError as needed:
        return run(partition_log.append(records, verification_guard=needed.guard,
                                        **options))  # type: ignore[arg-type]


def marker(partition_log: PartitionLog, producer_id: int, committed: bool, epoch: int = 0,
           coordinator_epoch: int = 0):  # type: ignore[no-untyped-def]
    return run(partition_log.write_txn_marker(producer_id, epoch, committed, coordinator_epoch))


def offsets_read(records: bytes) -> list[tuple[int, int, bool]]:
    """(base offset, producer id, control) of each batch read."""
    return [(b.header.base_offset, b.header.producer_id, b.header.is_control)
            for b in iter_batches(records)]


# --------------------------------------------------------------- transactions and the LSO


def test_a_transaction_holds_the_last_stable_offset_until_its_marker(tmp_path: Path) -> None:
    partition_log = open_log(tmp_path)
    append(partition_log, plain(2))                      # 0-1
    append(partition_log, data(7, 0, count=2))           # 2-3: producer 7's transaction
    append(partition_log, plain())                       # 4
    append(partition_log, data(7, 2))                    # 5
    assert partition_log.high_watermark == 6  # a leader alone commits at once
    assert partition_log.last_stable_offset == 2
    assert partition_log.producer_state.entry(7).txn_first_offset == 2  # type: ignore[union-attr]
    info = marker(partition_log, 7, committed=True)
    assert (info.base_offset, info.log_end_offset, info.high_watermark) == (6, 7, 7)
    assert partition_log.last_stable_offset == 7
    assert partition_log.producer_state.entry(7).txn_first_offset == -1  # type: ignore[union-attr]
    # A commit is not indexed; the marker is an ordinary batch to readers.
    assert [len(s.txn_index) for s in partition_log.segments] == [0]
    assert offsets_read(partition_log.read(6, 1 << 20, HIGH_WATERMARK)) == [(6, 7, True)]
    partition_log.close()


def test_a_decided_transaction_stays_unstable_until_the_high_watermark_passes_its_marker(
    tmp_path: Path,
) -> None:
    partition_log = replicated_leader(tmp_path)
    append(partition_log, data(7, 0))                    # 0
    append(partition_log, data(8, 0))                    # 1
    partition_log.advance_high_watermark(2)
    assert partition_log.last_stable_offset == 0
    marker(partition_log, 7, committed=False)            # 2
    assert partition_log.last_stable_offset == 0  # the abort is not replicated yet
    partition_log.advance_high_watermark(3)
    assert partition_log.last_stable_offset == 1  # producer 8's is still open
    assert partition_log.producer_state.unreplicated_transactions() == []
    marker(partition_log, 8, committed=True)             # 3
    append(partition_log, plain())                       # 4
    partition_log.advance_high_watermark(4)
    assert partition_log.last_stable_offset == 4
    partition_log.advance_high_watermark(5)
    assert partition_log.last_stable_offset == 5
    assert partition_log.last_stable_offset_lag == 0
    partition_log.close()


def test_an_abort_is_indexed_where_its_marker_lands_with_the_lso_of_that_moment(
    tmp_path: Path,
) -> None:
    # One batch per segment: data and markers land in segments of their own.
    partition_log = open_log(tmp_path, segment_bytes=len(data(7, 0)) + 10)
    append(partition_log, data(7, 0))                    # 0
    append(partition_log, data(8, 0))                    # 1
    append(partition_log, data(9, 0))                    # 2
    marker(partition_log, 8, committed=False)            # 3: 7's is older, still open
    marker(partition_log, 7, committed=False)            # 4: 9's is open
    marker(partition_log, 9, committed=True)             # 5
    marker(partition_log, 9, committed=False)            # 6: no transaction: not indexed
    indexes = {s.base_offset: s.txn_index.entries() for s in partition_log.segments}
    assert indexes[3] == [AbortedTxn(8, 1, 3, 0)]
    assert indexes[4] == [AbortedTxn(7, 0, 4, 2)]
    assert all(not entries for base, entries in indexes.items() if base not in (3, 4))
    assert partition_log.last_stable_offset == partition_log.log_end_offset == 7
    partition_log.close()


def test_read_committed_stops_at_the_lso_and_lists_the_aborted_transactions_read(
    tmp_path: Path,
) -> None:
    partition_log = open_log(tmp_path)
    append(partition_log, data(7, 0))                    # 0
    append(partition_log, data(8, 0))                    # 1
    append(partition_log, plain())                       # 2
    marker(partition_log, 7, committed=False)            # 3
    append(partition_log, data(8, 1))                    # 4
    # Producer 8 is still open from 1: nothing past it is stable.
    records, aborted = partition_log.read_committed(0, 1 << 20)
    assert offsets_read(records) == [(0, 7, False)]
    assert aborted == [AbortedTxn(7, 0, 3, 1)]
    assert partition_log.list_offset(-1, LAST_STABLE).offset == 1
    marker(partition_log, 8, committed=False)            # 5
    records, aborted = partition_log.read_committed(0, 1 << 20)
    assert [b[0] for b in offsets_read(records)] == [0, 1, 2, 3, 4, 5]
    assert aborted == [AbortedTxn(7, 0, 3, 1), AbortedTxn(8, 1, 5, 6)]
    # A read from past producer 7's marker only meets producer 8's transaction.
    records, aborted = partition_log.read_committed(4, 1 << 20)
    assert [b[0] for b in offsets_read(records)] == [4, 5]
    assert aborted == [AbortedTxn(8, 1, 5, 6)]
    # One batch only: producer 8's abort begins before the end of what was read.
    records, aborted = partition_log.read_committed(2, 1, min_one=True)
    assert [b[0] for b in offsets_read(records)] == [2]
    assert aborted == [AbortedTxn(7, 0, 3, 1), AbortedTxn(8, 1, 5, 6)]
    # Nothing read, nothing listed.
    assert partition_log.read_committed(6, 1 << 20) == (b"", [])
    partition_log.close()


def test_read_committed_lists_an_abort_whose_marker_is_in_a_later_segment(
    tmp_path: Path,
) -> None:
    partition_log = open_log(tmp_path, segment_bytes=len(data(7, 0)) * 2 + 10)
    for sequence in range(4):                            # 0-3, two segments
        append(partition_log, data(7, sequence))
    append(partition_log, plain())                       # 4
    marker(partition_log, 7, committed=False)            # 5, a third segment
    assert [s.base_offset for s in partition_log.segments] == [0, 2, 4]
    records, aborted = partition_log.read_committed(0, 1 << 20)
    assert [b[0] for b in offsets_read(records)] == [0, 1]  # one segment per read
    assert aborted == [AbortedTxn(7, 0, 5, 6)]
    partition_log.close()


def test_the_lso_stays_within_the_log_start_offset(tmp_path: Path) -> None:
    partition_log = open_log(tmp_path)
    append(partition_log, plain())                       # 0
    append(partition_log, data(7, 0))                    # 1
    append(partition_log, plain(3))                      # 2-4
    assert run(partition_log.delete_records(3)) == 3
    assert partition_log.last_stable_offset == 3
    partition_log.close()


# ----------------------------------------------------------------------------- verification


def test_a_transaction_starts_only_with_the_guard_the_partition_handed_out(
    tmp_path: Path,
) -> None:
    partition_log = open_log(tmp_path)
    first = error_of(partition_log.append(data(7, 0)))
    assert isinstance(first, VerificationRequiredError)
    assert first.code is ErrorCode.invalid_txn_state and first.guard != 0
    assert partition_log.log_end_offset == 0
    # The guard stands until used: asked again, the same one.
    again = error_of(partition_log.append(data(7, 0)))
    assert isinstance(again, VerificationRequiredError) and again.guard == first.guard
    wrong = error_of(partition_log.append(data(7, 0), verification_guard=first.guard + 1))
    assert isinstance(wrong, VerificationRequiredError) and wrong.guard == first.guard
    info = run(partition_log.append(data(7, 0), verification_guard=first.guard))
    assert info.base_offset == 0
    # Inside the transaction no guard is needed, and the used one is gone.
    assert run(partition_log.append(data(7, 1))).base_offset == 1
    assert partition_log.producer_state.verification_guard(7) == 0
    partition_log.close()


def test_a_marker_voids_a_standing_guard(tmp_path: Path) -> None:
    partition_log = open_log(tmp_path)
    guard = error_of(partition_log.append(data(7, 0))).guard  # type: ignore[attr-defined]
    # The transaction ends (say, it timed out) before the verified append comes back.
    marker(partition_log, 7, committed=False)
    stale = error_of(partition_log.append(data(7, 0), verification_guard=guard))
    assert isinstance(stale, VerificationRequiredError) and stale.guard != guard
    assert partition_log.log_end_offset == 1  # the marker only
    partition_log.close()


def test_a_verified_batch_cannot_overtake_a_lower_sequence_still_verifying(
    tmp_path: Path,
) -> None:
    partition_log = open_log(tmp_path)
    append(partition_log, data(7, 0))
    marker(partition_log, 7, committed=True)
    # Sequences 1 and 2 are both being verified; 2 comes back first.
    guard = error_of(partition_log.append(data(7, 1))).guard  # type: ignore[attr-defined]
    assert error_of(partition_log.append(data(7, 2))).guard == guard  # type: ignore[attr-defined]
    early = error_of(partition_log.append(data(7, 2), verification_guard=guard))
    assert early.code is ErrorCode.out_of_order_sequence_number
    assert run(partition_log.append(data(7, 1), verification_guard=guard)).base_offset == 2
    assert run(partition_log.append(data(7, 2))).base_offset == 3
    partition_log.close()


def test_batches_that_break_transaction_rules_are_refused_whole(tmp_path: Path) -> None:
    partition_log = open_log(tmp_path)
    append(partition_log, data(7, 0))
    mixed = error_of(partition_log.append(data(7, 1, transactional=False)))
    assert mixed.code is ErrorCode.invalid_txn_state
    control = build_end_transaction_batch(
        EndTransactionMarker(type=ControlRecordType.COMMIT, coordinator_epoch=0),
        producer_id=7, producer_epoch=0, timestamp=NOW)
    refused = error_of(partition_log.append(control))
    assert refused.code is ErrorCode.invalid_record and "control" in str(refused)
    no_producer = build_batch(values(1), attributes=TRANSACTIONAL_BIT)
    assert error_of(partition_log.append(no_producer)).code is ErrorCode.invalid_record
    # A later batch of the same append breaks a rule: nothing of it is stored.
    both = data(7, 1) + data(7, 2, transactional=False)
    assert error_of(partition_log.append(both)).code is ErrorCode.invalid_txn_state
    assert partition_log.log_end_offset == 1
    partition_log.close()


def test_a_retried_transactional_batch_is_a_duplicate_even_after_its_transaction(
    tmp_path: Path,
) -> None:
    partition_log = open_log(tmp_path)
    append(partition_log, data(7, 0, count=2))
    retry = run(partition_log.append(data(7, 0, count=2)))
    assert (retry.base_offset, retry.batch_count) == (0, 0)
    marker(partition_log, 7, committed=True)
    assert run(partition_log.append(data(7, 0, count=2))).base_offset == 0
    partition_log.close()


# ------------------------------------------------------------------------------- markers


def test_markers_of_older_epochs_are_refused(tmp_path: Path) -> None:
    partition_log = open_log(tmp_path)
    append(partition_log, data(7, 0, epoch=3))
    marker(partition_log, 7, committed=True, epoch=3, coordinator_epoch=5)
    assert error_of(partition_log.write_txn_marker(7, 2, True, 5)).code is (
        ErrorCode.invalid_producer_epoch)
    assert error_of(partition_log.write_txn_marker(7, 3, False, 4)).code is (
        ErrorCode.transaction_coordinator_fenced)
    assert partition_log.log_end_offset == 2
    # A newer coordinator, a producer unknown here: written.
    marker(partition_log, 7, committed=False, epoch=3, coordinator_epoch=6)
    marker(partition_log, 99, committed=True, epoch=0, coordinator_epoch=0)
    entry = partition_log.producer_state.entry(99)
    assert entry is not None and (entry.epoch, entry.coordinator_epoch) == (0, 0)
    partition_log.close()


def test_a_marker_whose_epoch_is_no_int16_is_refused(tmp_path: Path) -> None:
    # Found by tests/fuzz: the epoch reached the batch header's struct.pack, a crash.
    partition_log = open_log(tmp_path)
    for epoch in (0x8000, -0x8001):
        assert error_of(partition_log.write_txn_marker(99, epoch, True, 0)).code is (
            ErrorCode.invalid_producer_epoch)
    assert partition_log.log_end_offset == 0
    partition_log.close()


def test_a_marker_with_a_bumped_epoch_restarts_the_producers_sequences(
    tmp_path: Path,
) -> None:
    # Transactions version 2 bumps the epoch at every end of a transaction.
    partition_log = open_log(tmp_path)
    append(partition_log, data(7, 0, count=3, epoch=1))
    marker(partition_log, 7, committed=True, epoch=2)
    entry = partition_log.producer_state.entry(7)
    assert entry is not None and entry.epoch == 2 and entry.last_seq == -1
    assert error_of(partition_log.append(data(7, 3, epoch=1))).code is (
        ErrorCode.invalid_txn_state)  # no transaction: verification first, as in Kafka
    assert append(partition_log, data(7, 0, epoch=2)).base_offset == 4
    assert error_of(partition_log.append(data(7, 5, epoch=1))).code is (
        ErrorCode.invalid_producer_epoch)
    partition_log.close()


def test_a_marker_is_stamped_with_the_broker_time_and_the_leader_epoch(tmp_path: Path) -> None:
    partition_log = open_log(tmp_path, message_timestamp_type=TimestampType.LOG_APPEND_TIME)
    run(partition_log.become(replica_state.state(LEADER, 4, in_sync_alone=True)))
    info = run(partition_log.write_txn_marker(7, 1, True, 2, now_ms=NOW + 5))
    assert (info.log_append_time_ms, info.leader_epoch) == (NOW + 5, 4)
    [batch] = iter_batches(partition_log.read(0, 1 << 20, HIGH_WATERMARK))
    header = batch.header
    assert header.is_control and header.is_transactional and header.is_log_append_time
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (7, 1, -1)
    assert (header.max_timestamp, header.partition_leader_epoch) == (NOW + 5, 4)
    assert partition_log.leader_epochs.latest_epoch == 4
    partition_log.close()


def test_only_a_leader_writes_markers_and_describes_producers(tmp_path: Path) -> None:
    partition_log = open_log(tmp_path)
    append(partition_log, data(7, 0))
    [entry] = partition_log.active_producers()
    assert (entry.producer_id, entry.txn_first_offset, entry.last_seq) == (7, 0, 0)
    run(partition_log.become(replica_state.state(FOLLOWER, 1)))
    assert error_of(partition_log.write_txn_marker(7, 0, True, 0)).code is (
        ErrorCode.not_leader_or_follower)
    with pytest.raises(KafkaError) as caught:
        partition_log.active_producers()
    assert caught.value.code is ErrorCode.not_leader_or_follower
    partition_log.close()


# -------------------------------------------------------------------- coordinator appends


def test_coordinator_appends_are_not_verified_and_need_no_sequences(tmp_path: Path) -> None:
    partition_log = open_log(tmp_path)
    offsets = build_batch(values(2), producer_id=7, producer_epoch=3, base_sequence=-1,
                          attributes=TRANSACTIONAL_BIT, base_timestamp=NOW)
    info = run(partition_log.append(offsets, expected_log_end_offset=0))
    assert info.base_offset == 0 and partition_log.last_stable_offset == 0
    # Another one continues the transaction; the same bytes again are not a duplicate.
    assert run(partition_log.append(offsets, expected_log_end_offset=2)).base_offset == 2
    stale = build_batch(values(1), producer_id=7, producer_epoch=2, base_sequence=-1,
                        attributes=TRANSACTIONAL_BIT, base_timestamp=NOW)
    assert error_of(partition_log.append(stale, expected_log_end_offset=4)).code is (
        ErrorCode.invalid_producer_epoch)
    # A client's batch without a sequence is still refused.
    assert error_of(partition_log.append(offsets)).code is ErrorCode.invalid_record
    marker(partition_log, 7, committed=True, epoch=3)
    assert partition_log.last_stable_offset == 5
    partition_log.close()


# ------------------------------------------------------------- followers and truncation


def follower_of(directory: Path, **settings: object) -> PartitionLog:
    partition_log = open_log(directory, **settings)
    run(partition_log.become(replica_state.state(FOLLOWER, 0)))
    return partition_log


def copy(leader: PartitionLog, follower: PartitionLog) -> None:
    for _ in range(1000):
        if follower.log_end_offset >= leader.log_end_offset:
            break
        records = leader.read(follower.log_end_offset, 1 << 20, LOG_END)
        run(follower.append_as_follower(records, 0, leader.high_watermark))


def test_a_follower_takes_markers_into_its_producer_state_and_transaction_index(
    tmp_path: Path,
) -> None:
    size = len(data(7, 0)) * 2 + 10
    leader = open_log(tmp_path / "leader", segment_bytes=size)
    run(leader.become(replica_state.state(LEADER, 0, in_sync_alone=True)))
    follower = follower_of(tmp_path / "follower", segment_bytes=size)
    append(leader, data(7, 0))
    append(leader, data(8, 0))
    marker(leader, 7, committed=False)
    append(leader, data(9, 0))
    marker(leader, 8, committed=True)
    copy(leader, follower)
    assert follower.last_stable_offset == leader.last_stable_offset == 3
    assert follower.producer_state.ongoing_transactions() == [(3, 9)]
    assert [s.txn_index.entries() for s in follower.segments] == [
        s.txn_index.entries() for s in leader.segments]
    assert follower.collect_aborted_transactions(0, 10) == [AbortedTxn(7, 0, 2, 1)]
    # Led later, it ends the open transaction itself.
    run(follower.become(replica_state.state(LEADER, 1, in_sync_alone=True)))
    marker(follower, 9, committed=False)
    assert follower.read_committed(3, 1 << 20)[1] == [AbortedTxn(9, 3, 5, 6)]
    leader.close()
    follower.close()


def test_truncation_reopens_a_transaction_whose_marker_was_cut(tmp_path: Path) -> None:
    follower = follower_of(tmp_path)
    leader = open_log(tmp_path / "leader")
    append(leader, data(7, 0))
    append(leader, plain())
    marker(leader, 7, committed=False)
    append(leader, plain())
    copy(leader, follower)
    assert follower.last_stable_offset == 4
    assert follower.segments[0].txn_index.entries() == [AbortedTxn(7, 0, 2, 3)]
    assert run(follower.truncate_to(2)) == 2
    assert follower.segments[0].txn_index.entries() == []
    assert follower.producer_state.ongoing_transactions() == [(0, 7)]
    assert follower.last_stable_offset == 0
    leader.close()
    follower.close()


# ----------------------------------------------------------------------------- restarts


def test_a_clean_restart_keeps_ongoing_and_unreplicated_transactions(tmp_path: Path) -> None:
    partition_log = replicated_leader(tmp_path)
    append(partition_log, data(7, 0))                    # 0
    append(partition_log, data(8, 0))                    # 1
    marker(partition_log, 8, committed=False, coordinator_epoch=3)  # 2
    partition_log.advance_high_watermark(2)
    partition_log.close()
    document = json.loads((tmp_path / "t-0" / snapshot_name(3)).read_text())
    assert document["format"] == 2 and document["unreplicated"] == [[1, 8, 2]]
    reopened = open_log(tmp_path)
    assert reopened.producer_state.ongoing_transactions() == [(0, 7)]
    assert reopened.producer_state.unreplicated_transactions() == [(1, 8, 2)]
    assert reopened.producer_state.entry(8).coordinator_epoch == 3  # type: ignore[union-attr]
    assert (reopened.high_watermark, reopened.last_stable_offset) == (2, 0)
    run(reopened.become(replica_state.state(LEADER, 1, in_sync_alone=True)))
    assert reopened.producer_state.unreplicated_transactions() == []
    marker(reopened, 7, committed=True)
    assert reopened.last_stable_offset == 4
    reopened.close()


def test_a_replicated_replica_restarts_with_its_unreplicated_transactions(
    tmp_path: Path,
) -> None:
    partition_log = replicated_leader(tmp_path)
    append(partition_log, data(8, 0))                    # 0
    append(partition_log, plain())                       # 1
    marker(partition_log, 8, committed=False)            # 2
    partition_log.advance_high_watermark(2)
    partition_log.checkpoint_high_watermark()
    partition_log.close()
    reopened = open_log(tmp_path)
    assert reopened.high_watermark == 2
    assert reopened.last_stable_offset == 0  # the abort marker is still above it
    run(reopened.become(replica_state.state(FOLLOWER, 1)))
    reopened.advance_high_watermark(3)
    assert reopened.last_stable_offset == 3
    reopened.close()


def test_a_snapshot_of_format_1_is_still_read(tmp_path: Path) -> None:
    partition_log = open_log(tmp_path)
    append(partition_log, data(7, 0, transactional=False))
    partition_log.close()
    directory = tmp_path / "t-0"
    (directory / snapshot_name(1)).write_text(json.dumps({
        "format": 1, "offset": 1, "producers": [
            {"id": 7, "epoch": 0, "last_timestamp": NOW, "batches": [[0, 0, 0, 0, NOW]]}]}))
    reopened = PartitionLog(directory, "t", 0, "", TopicConfig(), recovery_point=1)
    entry = reopened.producer_state.entry(7)
    assert entry is not None and (entry.coordinator_epoch, entry.txn_first_offset) == (-1, -1)
    assert run(reopened.append(data(7, 0, transactional=False))).batch_count == 0  # duplicate
    reopened.close()


def _transactional_history(directory: Path, segment_bytes: int) -> PartitionLog:
    """Three segments; aborts indexed in the second and third, a transaction left open."""
    partition_log = open_log(directory, segment_bytes=segment_bytes)
    append(partition_log, data(7, 0))                    # 0
    append(partition_log, data(8, 0))                    # 1
    marker(partition_log, 7, committed=False)            # 2
    append(partition_log, data(9, 0))                    # 3
    marker(partition_log, 8, committed=False)            # 4
    append(partition_log, data(7, 1))                    # 5
    marker(partition_log, 9, committed=True)             # 6
    marker(partition_log, 7, committed=False)            # 7
    append(partition_log, data(8, 1))                    # 8
    return partition_log


def _indexes(partition_log: PartitionLog) -> dict[int, list[AbortedTxn]]:
    return {s.base_offset: s.txn_index.entries() for s in partition_log.segments}


@pytest.mark.parametrize("damage", ["crash", "missing", "torn", "all lost"])
def test_lost_or_recovered_transaction_indexes_are_rebuilt_at_start_up(
    tmp_path: Path, damage: str,
) -> None:
    segment_bytes = len(data(7, 0)) * 3 + 10
    partition_log = _transactional_history(tmp_path, segment_bytes)
    expected, lso = _indexes(partition_log), partition_log.last_stable_offset
    assert sorted(expected) == [0, 3, 6] and expected[3] and expected[6]
    ongoing = partition_log.producer_state.ongoing_transactions()
    directory = tmp_path / "t-0"
    if damage == "crash":
        partition_log.close(flush=False)
        (directory / ("00000000000000000006" + TXN_INDEX_SUFFIX)).write_bytes(b"")
        recovery_point = 6  # the last segment is recovered
    else:
        partition_log.close()
        recovery_point = partition_log.log_end_offset
        paths = sorted(directory.glob("*" + TXN_INDEX_SUFFIX))
        if damage == "missing":
            paths[1].unlink()
        elif damage == "torn":
            with paths[2].open("ab") as file:
                file.write(b"\x00" * 5)
        else:
            for path in paths:
                path.unlink()
    reopened = PartitionLog(directory, "t", 0, "", TopicConfig(segment_bytes=segment_bytes),
                            recovery_point=recovery_point)
    assert _indexes(reopened) == expected
    assert reopened.producer_state.ongoing_transactions() == ongoing
    assert reopened.last_stable_offset == lso == 8
    assert not any(s.txn_index_stale for s in reopened.segments)
    reopened.close()


def test_an_abort_marker_torn_off_by_a_crash_leaves_its_transaction_open(
    tmp_path: Path,
) -> None:
    segment_bytes = len(data(7, 0)) * 3 + 10
    partition_log = _transactional_history(tmp_path, segment_bytes)
    expected, ongoing = _indexes(partition_log), partition_log.producer_state.ongoing_transactions()
    marker(partition_log, 8, committed=False)            # 9, in a segment of its own
    assert partition_log.segments[-1].txn_index.entries() == [AbortedTxn(8, 8, 9, 10)]
    partition_log.close(flush=False)
    path = partition_log.segments[-1].log_path
    path.write_bytes(path.read_bytes()[:-10])
    reopened = PartitionLog(tmp_path / "t-0", "t", 0, "",
                            TopicConfig(segment_bytes=segment_bytes), recovery_point=6)
    assert reopened.log_end_offset == 9
    assert _indexes(reopened) == {**expected, 9: []}
    assert reopened.producer_state.ongoing_transactions() == ongoing == [(8, 8)]
    assert reopened.last_stable_offset == 8
    reopened.close()


def test_an_ongoing_transaction_keeps_its_producer_from_expiring(tmp_path: Path) -> None:
    partition_log = open_log(tmp_path)
    append(partition_log, data(7, 0))
    append(partition_log, data(8, 0, transactional=False))
    later = NOW + 2 * 86_400_000
    assert partition_log.producer_state.remove_expired(later) == 1
    assert partition_log.producer_state.producer_ids == [7]
    partition_log.close()


def test_retention_and_delete_records_take_transaction_indexes_with_their_segments(
    tmp_path: Path,
) -> None:
    partition_log = open_log(tmp_path, segment_bytes=len(data(7, 0)) + 10, retention_ms=1000)
    append(partition_log, data(7, 0))                    # 0
    marker(partition_log, 7, committed=False)            # 1
    append(partition_log, data(8, 0))                    # 2
    marker(partition_log, 8, committed=False)            # 3
    append(partition_log, plain())                       # 4
    directory = tmp_path / "t-0"
    assert sorted(p.name[:20] for p in directory.glob("*" + TXN_INDEX_SUFFIX)) == [
        f"{base:020d}" for base in range(5)]
    assert run(partition_log.delete_records(2)) == 2
    assert sorted(int(p.name[:20]) for p in directory.glob("*" + TXN_INDEX_SUFFIX)) == [2, 3, 4]
    assert partition_log.collect_aborted_transactions(2, 5) == [AbortedTxn(8, 2, 3, 4)]
    # Everything is old ten seconds on (batches and markers are stamped up to now):
    # retention leaves the active segment.
    later = int(time.time() * 1000) + 10_000
    assert run(partition_log.enforce_retention(now=later)) == 2
    assert sorted(int(p.name[:20]) for p in directory.glob("*" + TXN_INDEX_SUFFIX)) == [4]
    partition_log.close()


def test_transactions_v2_a_marker_at_the_bumped_epoch_ends_the_transaction(
    tmp_path: Path,
) -> None:
    """Transactions v2 markers carry the epoch after the bump (Kafka's TV2 markers): the
    transaction begun at epoch 0 ends with a marker at epoch 1, and the next transaction
    starts at epoch 1, sequence 0, verified again."""
    partition_log = open_log(tmp_path)
    append(partition_log, data(7, 0, count=2, epoch=0))
    assert partition_log.producer_state.first_unstable_offset == 0
    marker(partition_log, 7, committed=True, epoch=1)
    assert partition_log.producer_state.first_unstable_offset is None
    needed = error_of(partition_log.append(data(7, 0, epoch=1)))
    assert isinstance(needed, VerificationRequiredError)
    assert run(partition_log.append(data(7, 0, epoch=1),
                                    verification_guard=needed.guard)).base_offset == 3
    # The epoch before the bump is fenced.
    assert error_of(partition_log.append(data(7, 2, epoch=0))).code is \
        ErrorCode.invalid_producer_epoch
    partition_log.close()


def test_a_batch_of_a_newer_epoch_begins_a_transaction_and_needs_verifying(
    tmp_path: Path,
) -> None:
    """A transactions v2 producer may send its next transaction's first batch (at the bumped
    epoch) before this partition has the marker of the last one: it must not join the
    transaction still open here, so it needs the coordinator's word like any first batch
    (which the coordinator withholds until the markers are written)."""
    partition_log = open_log(tmp_path)
    append(partition_log, data(7, 0, epoch=3))
    # The same epoch continues the open transaction without a guard.
    assert run(partition_log.append(data(7, 1, epoch=3))).base_offset == 1
    needed = error_of(partition_log.append(data(7, 0, epoch=4)))
    assert isinstance(needed, VerificationRequiredError)
    assert partition_log.log_end_offset == 2
    partition_log.close()
