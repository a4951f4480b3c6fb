"""Tests of services.log.producer_state, alone and inside a real partition log on disk:
duplicates answered with their original offsets, sequence gaps, epoch fencing, and the state
rebuilt after a clean or unclean restart from snapshots and replay."""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.common.errors import ErrorCode, KafkaError
from services.common.records.record_batch import iter_batches
from services.log.log_validator import validate_append
from services.log.partition_log import LOG_END, PartitionLog
from services.log.producer_state import (
    BATCHES_TO_RETAIN,
    MAX_SEQUENCE,
    PRODUCER_ID_EXPIRATION_MS,
    ProducerStateManager,
    increment_sequence,
    snapshot_name,
)
from services.log.topic_config import TimestampType, TopicConfig

from ..record_batches import build_batch, values

# Batch timestamps are recent: producers whose last batch is a day old expire.
NOW = int(time.time() * 1000)


def batch(producer_id: int, epoch: int, sequence: int, count: int = 1, tag: str = "v",
          timestamp: int = NOW) -> bytes:
    return build_batch(values(count, tag=tag), producer_id=producer_id, producer_epoch=epoch,
                       base_sequence=sequence, base_timestamp=timestamp)


def open_log(directory: Path, **settings: object) -> PartitionLog:
    return PartitionLog(directory / "t-0", "t", 0, "", TopicConfig(**settings))  # type: ignore[arg-type]


def append(partition_log: PartitionLog, records: bytes):
    return asyncio.run(partition_log.append(records))


def append_error(partition_log: PartitionLog, records: bytes) -> ErrorCode:
    with pytest.raises(KafkaError) as caught:
        append(partition_log, records)
    return caught.value.code


def stored(partition_log: PartitionLog) -> list[tuple[int, int, int, int, int]]:
    """(base offset, record count, producer id, epoch, base sequence) of every stored batch."""
    out = []
    for segment in partition_log.segments:
        for _, header in segment.batches():
            out.append((header.base_offset, header.record_count, header.producer_id,
                        header.producer_epoch, header.base_sequence))
    return out


# -------------------------------------------------------------------------- the manager alone


def test_sequences_wrap_around_the_int32_circle() -> None:
    assert increment_sequence(5, 3) == 8
    assert increment_sequence(MAX_SEQUENCE, 1) == 0
    assert increment_sequence(MAX_SEQUENCE - 1, 3) == 1


def test_batches_without_a_producer_id_are_not_tracked(tmp_path: Path) -> None:
    state = ProducerStateManager(tmp_path)
    batches = validate_append(build_batch(values(2)), 1 << 20)
    assert state.validate(batches) is None
    assert len(state) == 0


def test_a_wrapped_sequence_continues_at_zero(tmp_path: Path) -> None:
    state = ProducerStateManager(tmp_path)
    # Known here (as a copy of the leader's batches makes it), near the end of the range.
    [(_, header)] = validate_append(batch(7, 0, MAX_SEQUENCE - 1, count=2), 1 << 20)
    state.replay(header)
    entry = state.entry(7)
    assert entry is not None and entry.last_seq == MAX_SEQUENCE
    after = validate_append(batch(7, 0, 0, count=1), 1 << 20)
    state.complete(state.validate(after), 2)
    assert state.entry(7).last_seq == 0  # type: ignore[union-attr]
    with pytest.raises(KafkaError) as caught:
        state.validate(validate_append(batch(7, 0, 5), 1 << 20))
    assert caught.value.code is ErrorCode.out_of_order_sequence_number


def test_expired_producers_are_forgotten(tmp_path: Path) -> None:
    state = ProducerStateManager(tmp_path)
    for producer_id, timestamp in ((1, NOW), (2, NOW + 5000)):
        batches = validate_append(batch(producer_id, 0, 0, timestamp=timestamp), 1 << 20)
        state.complete(state.validate(batches), producer_id)
    assert state.remove_expired(NOW + PRODUCER_ID_EXPIRATION_MS + 500) == 1
    assert state.producer_ids == [2]


# ------------------------------------------------------------------------ in a partition log


def test_a_retried_batch_gets_its_original_offsets_and_is_not_stored_again(
    tmp_path: Path,
) -> None:
    partition_log = open_log(tmp_path)
    first = append(partition_log, batch(1000, 0, 0, count=3))
    second = append(partition_log, batch(1000, 0, 3, count=2))
    retry = append(partition_log, batch(1000, 0, 0, count=3))
    assert (first.base_offset, first.last_offset) == (0, 2)
    assert (retry.base_offset, retry.last_offset) == (0, 2)
    assert retry.log_end_offset == second.log_end_offset == 5
    assert retry.batch_count == 0 and retry.size_bytes == 0
    assert append(partition_log, batch(1000, 0, 3, count=2)).base_offset == 3
    assert stored(partition_log) == [(0, 3, 1000, 0, 0), (3, 2, 1000, 0, 3)]
    partition_log.close()


def test_only_the_last_five_batches_are_recognised_as_duplicates(tmp_path: Path) -> None:
    partition_log = open_log(tmp_path)
    for sequence in range(BATCHES_TO_RETAIN + 1):
        append(partition_log, batch(1, 0, sequence))
    # Batches 1..5 are cached; batch 0 fell out and is now simply out of order.
    assert append(partition_log, batch(1, 0, 1)).base_offset == 1
    assert append_error(partition_log, batch(1, 0, 0)) is ErrorCode.out_of_order_sequence_number
    assert partition_log.log_end_offset == BATCHES_TO_RETAIN + 1
    partition_log.close()


def test_a_sequence_gap_is_out_of_order(tmp_path: Path) -> None:
    partition_log = open_log(tmp_path)
    append(partition_log, batch(1, 0, 0, count=2))
    assert append_error(partition_log, batch(1, 0, 3)) is ErrorCode.out_of_order_sequence_number
    assert append_error(partition_log, batch(1, 0, 1)) is ErrorCode.out_of_order_sequence_number
    assert partition_log.log_end_offset == 2
    assert append(partition_log, batch(1, 0, 2)).base_offset == 2
    partition_log.close()


def test_an_older_epoch_is_fenced_and_a_new_epoch_starts_at_zero(tmp_path: Path) -> None:
    partition_log = open_log(tmp_path)
    append(partition_log, batch(1, 3, 0))
    assert append_error(partition_log, batch(1, 2, 1)) is ErrorCode.invalid_producer_epoch
    # A new epoch must restart its sequence.
    assert append_error(partition_log, batch(1, 4, 1)) is ErrorCode.out_of_order_sequence_number
    assert append(partition_log, batch(1, 4, 0)).base_offset == 1
    # The old epoch's batches are no longer duplicates: that epoch is fenced now.
    assert append_error(partition_log, batch(1, 3, 0)) is ErrorCode.invalid_producer_epoch
    assert partition_log.log_end_offset == 2
    partition_log.close()


def test_an_unknown_producer_is_refused_past_sequence_zero(tmp_path: Path) -> None:
    partition_log = open_log(tmp_path)
    assert append_error(partition_log, batch(9, 2, 41)) is ErrorCode.out_of_order_sequence_number
    assert partition_log.log_end_offset == 0
    assert append(partition_log, batch(9, 2, 0)).base_offset == 0
    assert append_error(partition_log, batch(9, 2, 2)) is ErrorCode.out_of_order_sequence_number
    assert append(partition_log, batch(9, 2, 1)).base_offset == 1
    partition_log.close()


def test_producers_and_plain_batches_do_not_disturb_each_other(tmp_path: Path) -> None:
    partition_log = open_log(tmp_path)
    append(partition_log, batch(1, 0, 0))
    append(partition_log, build_batch(values(2)))
    append(partition_log, batch(2, 0, 0))
    append(partition_log, build_batch(values(1)))  # plain batches are never duplicates
    assert append(partition_log, batch(1, 0, 0)).base_offset == 0
    assert append(partition_log, batch(2, 0, 0)).base_offset == 3
    assert append(partition_log, batch(1, 0, 1)).base_offset == 5
    partition_log.close()


def test_several_batches_of_one_append_are_checked_in_order_all_or_nothing(
    tmp_path: Path,
) -> None:
    partition_log = open_log(tmp_path)
    info = append(partition_log, batch(1, 0, 0, count=2) + batch(1, 0, 2) + batch(2, 0, 0))
    assert (info.base_offset, info.last_offset) == (0, 3)
    # The second batch leaves a gap after the first: nothing of the append is stored.
    code = append_error(partition_log, batch(1, 0, 3) + batch(1, 0, 5))
    assert code is ErrorCode.out_of_order_sequence_number
    assert partition_log.log_end_offset == 4
    assert append(partition_log, batch(1, 0, 3)).base_offset == 4
    # A duplicate anywhere makes the whole append a duplicate (as Kafka answers it).
    retry = append(partition_log, batch(2, 0, 0) + batch(2, 0, 1))
    assert (retry.base_offset, retry.batch_count) == (3, 0)
    assert partition_log.log_end_offset == 5
    partition_log.close()


def test_a_duplicate_under_log_append_time_reports_its_original_stamp(tmp_path: Path) -> None:
    partition_log = open_log(tmp_path, message_timestamp_type=TimestampType.LOG_APPEND_TIME)
    first = asyncio.run(partition_log.append(batch(1, 0, 0), now_ms=NOW + 10))
    retry = asyncio.run(partition_log.append(batch(1, 0, 0), now_ms=NOW + 99))
    assert first.log_append_time_ms == retry.log_append_time_ms == NOW + 10
    assert retry.base_offset == 0 and partition_log.log_end_offset == 1
    partition_log.close()


def test_a_clean_restart_loads_the_snapshot_written_at_close(tmp_path: Path) -> None:
    partition_log = open_log(tmp_path)
    append(partition_log, batch(1, 0, 0, count=2))
    append(partition_log, batch(1, 0, 2))
    partition_log.close()
    assert (tmp_path / "t-0" / snapshot_name(3)).exists()
    reopened = open_log(tmp_path)
    assert reopened.producer_state.entry(1) is not None
    assert append(reopened, batch(1, 0, 0, count=2)).base_offset == 0
    assert append(reopened, batch(1, 0, 2)).base_offset == 2
    assert append_error(reopened, batch(1, 0, 4)) is ErrorCode.out_of_order_sequence_number
    assert append(reopened, batch(1, 0, 3)).base_offset == 3
    reopened.close()


def test_a_crash_rebuilds_state_from_the_roll_snapshot_and_the_batches_after_it(
    tmp_path: Path,
) -> None:
    size = len(batch(1, 0, 0))
    partition_log = open_log(tmp_path, segment_bytes=size * 3)
    for sequence in range(7):  # segments [0, 3), [3, 6), [6, 7)
        append(partition_log, batch(1, 0, sequence))
    append(partition_log, batch(2, 5, 0))
    assert [s.base_offset for s in partition_log.segments] == [0, 3, 6]
    directory = tmp_path / "t-0"
    assert partition_log.producer_state.snapshot_offsets() == [3, 6]
    partition_log.close(flush=False)  # no shutdown snapshot: as after kill -9
    reopened = open_log(tmp_path, segment_bytes=size * 3)
    assert sorted(p.name for p in directory.glob("*.snapshot")) == [
        snapshot_name(3), snapshot_name(6)]
    # Batches 2..6 of producer 1 are duplicates across the roll; producer 2 came from replay.
    for sequence in range(2, 7):
        assert append(reopened, batch(1, 0, sequence)).base_offset == sequence
    assert append(reopened, batch(2, 5, 0)).base_offset == 7
    assert append_error(reopened, batch(2, 4, 1)) is ErrorCode.invalid_producer_epoch
    assert append(reopened, batch(1, 0, 7)).base_offset == 8
    reopened.close()


def test_only_the_newest_snapshots_are_kept(tmp_path: Path) -> None:
    size = len(batch(1, 0, 0))
    partition_log = open_log(tmp_path, segment_bytes=size * 2)
    for sequence in range(9):  # rolls at 2, 4, 6 and 8
        append(partition_log, batch(1, 0, sequence))
    assert partition_log.producer_state.snapshot_offsets() == [6, 8]
    partition_log.close()
    assert partition_log.producer_state.snapshot_offsets() == [8, 9]


def test_an_unreadable_snapshot_falls_back_to_an_older_one_or_full_replay(
    tmp_path: Path,
) -> None:
    size = len(batch(1, 0, 0))
    partition_log = open_log(tmp_path, segment_bytes=size * 2)
    for sequence in range(5):  # segments [0, 2), [2, 4), [4, 5)
        append(partition_log, batch(1, 0, sequence))
    partition_log.close(flush=False)
    directory = tmp_path / "t-0"
    (directory / snapshot_name(4)).write_text('{"format": 1, "offs')  # torn
    # The data is known to be on disk (no segment is recovered): only the snapshot is torn.
    reopened = PartitionLog(directory, "t", 0, "", TopicConfig(segment_bytes=size * 2),
                            recovery_point=5)
    assert not (directory / snapshot_name(4)).exists()
    assert append(reopened, batch(1, 0, 4)).base_offset == 4
    reopened.close(flush=False)
    for path in directory.glob("*.snapshot"):
        path.unlink()
    again = open_log(tmp_path, segment_bytes=size * 2)
    assert again.producer_state.entry(1).last_seq == 4  # type: ignore[union-attr]
    assert append(again, batch(1, 0, 0)).base_offset == 0  # still cached: 0..4 is five
    again.close()


def test_a_snapshot_past_the_log_end_is_dropped(tmp_path: Path) -> None:
    partition_log = open_log(tmp_path)
    append(partition_log, batch(1, 0, 0))
    partition_log.close()
    directory = tmp_path / "t-0"
    # A snapshot from a future the log no longer has (its data was cut at recovery).
    (directory / snapshot_name(5)).write_text(json.dumps({
        "format": 1, "offset": 5, "producers": [
            {"id": 1, "epoch": 0, "last_timestamp": NOW, "batches": [[1, 4, 1, 4, NOW]]}]}))
    reopened = open_log(tmp_path)
    assert not (directory / snapshot_name(5)).exists()
    assert append(reopened, batch(1, 0, 1)).base_offset == 1
    reopened.close()


def test_deleting_records_keeps_the_producer_state(tmp_path: Path) -> None:
    size = len(batch(1, 0, 0))
    partition_log = open_log(tmp_path, segment_bytes=size * 2)
    for sequence in range(5):
        append(partition_log, batch(1, 0, sequence))
    assert asyncio.run(partition_log.delete_records(4)) == 4
    assert partition_log.segments[0].base_offset == 4
    assert append(partition_log, batch(1, 0, 2)).base_offset == 2
    assert append_error(partition_log, batch(1, 0, 7)) is ErrorCode.out_of_order_sequence_number
    partition_log.close(flush=False)
    reopened = open_log(tmp_path, segment_bytes=size * 2)
    assert append(reopened, batch(1, 0, 3)).base_offset == 3
    reopened.close()


# ----------------------------------------------------------------- random retries vs a model

_PRODUCERS = (100, 200)

_operation = st.one_of(
    st.tuples(st.just("send"), st.sampled_from(_PRODUCERS), st.integers(1, 3)),
    st.tuples(st.just("retry"), st.sampled_from(_PRODUCERS), st.integers(0, 7)),
    st.tuples(st.just("gap"), st.sampled_from(_PRODUCERS), st.integers(1, 3)),
    st.tuples(st.just("stale"), st.sampled_from(_PRODUCERS), st.just(0)),
    st.tuples(st.just("bump"), st.sampled_from(_PRODUCERS), st.integers(0, 2)),
    st.tuples(st.just("plain"), st.just(-1), st.integers(1, 2)),
    st.tuples(st.just("restart"), st.just(-1), st.booleans()),
)


class _Producer:
    def __init__(self) -> None:
        self.epoch = 1
        self.next_seq = 0
        # (epoch, first seq, count, first offset) of every batch stored, oldest first.
        self.sent: list[tuple[int, int, int, int]] = []


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_operation, min_size=1, max_size=40))
def test_random_retries_gaps_and_fencing_match_a_model(operations) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(scratch)
        segment_bytes = len(batch(1, 0, 0, count=3)) * 3
        partition_log = open_log(directory, segment_bytes=segment_bytes)
        producers = {pid: _Producer() for pid in _PRODUCERS}
        # What the log must hold: (producer id, epoch, first seq, count) in offset order.
        expected: list[tuple[int, int, int, int]] = []
        try:
            for kind, pid, arg in operations:
                if kind == "restart":
                    partition_log.close(flush=arg)
                    partition_log = open_log(directory, segment_bytes=segment_bytes)
                    continue
                if kind == "plain":
                    append(partition_log, build_batch(values(arg)))
                    expected.append((-1, -1, -1, arg))
                    continue
                p = producers[pid]
                if kind == "send":
                    info = append(partition_log, batch(pid, p.epoch, p.next_seq, count=arg))
                    p.sent.append((p.epoch, p.next_seq, arg, info.base_offset))
                    expected.append((pid, p.epoch, p.next_seq, arg))
                    p.next_seq += arg
                elif kind == "retry":
                    if not p.sent:
                        continue
                    epoch, first, count, offset = p.sent[-1 - arg % len(p.sent)]
                    # The log knows the epoch of the producer's last stored batch.
                    log_epoch = p.sent[-1][0]
                    current = [s for s in p.sent if s[0] == log_epoch][-BATCHES_TO_RETAIN:]
                    records = batch(pid, epoch, first, count=count)
                    if (epoch, first, count, offset) in current:
                        assert append(partition_log, records).base_offset == offset
                    elif epoch < log_epoch:
                        assert append_error(partition_log, records) is (
                            ErrorCode.invalid_producer_epoch)
                    else:
                        assert append_error(partition_log, records) is (
                            ErrorCode.out_of_order_sequence_number)
                elif kind == "gap":
                    if not p.sent:
                        continue  # an unknown producer's gap: see the next test
                    records = batch(pid, p.epoch, p.next_seq + arg)
                    assert append_error(partition_log, records) is (
                        ErrorCode.out_of_order_sequence_number)
                elif kind == "stale":
                    if not p.sent or p.sent[-1][0] == 0:
                        continue
                    records = batch(pid, p.sent[-1][0] - 1, p.next_seq)
                    assert append_error(partition_log, records) is (
                        ErrorCode.invalid_producer_epoch)
                elif kind == "bump":
                    p.epoch += 1
                    p.next_seq = 0
                    if arg and p.sent:
                        records = batch(pid, p.epoch, arg)
                        assert append_error(partition_log, records) is (
                            ErrorCode.out_of_order_sequence_number)
            held = [(pid, epoch, seq, count) for _, count, pid, epoch, seq in stored(partition_log)]
            assert held == expected
            read = partition_log.read(0, 1 << 30, LOG_END)
            assert sum(1 for _ in iter_batches(read)) <= len(expected)
        finally:
            partition_log.close()


def test_an_unknown_producer_starts_at_sequence_zero(tmp_path: Path) -> None:
    """A producer this partition has no state for must start at 0: a request refused before
    the log node (nothing stored) must not let the next one be taken as the first, or the
    client would count the refused records as stored."""
    state = ProducerStateManager(tmp_path)
    with pytest.raises(KafkaError) as caught:
        state.validate(validate_append(batch(7, 0, 4), 1 << 20))
    assert caught.value.code is ErrorCode.out_of_order_sequence_number
    assert state.entry(7) is None
    first = validate_append(batch(7, 0, 0, count=4), 1 << 20)
    state.complete(state.validate(first), 0)
    assert state.entry(7).last_seq == 3  # type: ignore[union-attr]
    # Several batches of one append: the later ones follow the first.
    both = validate_append(batch(8, 0, 0, count=2) + batch(8, 0, 2), 1 << 20)
    state.complete(state.validate(both), 4)
    assert state.entry(8).last_seq == 2  # type: ignore[union-attr]
