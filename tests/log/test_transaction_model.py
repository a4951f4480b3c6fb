"""A property test of transactions in a partition log on disk against a simple model: random
transactional and plain appends, commits and aborts, high watermark moves, truncations of the
log, and clean restarts and crashes (torn tails included). After every step the log's last
stable offset, ongoing transactions and transaction indexes must be what the model derives from
the batches the log holds, and read_committed reads must stop at the LSO with exactly the
aborted transactions overlapping what they returned."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.common.errors import ErrorCode, KafkaError
from services.common.records.record_batch import TRANSACTIONAL_BIT, iter_batches
from services.log import replica_state
from services.log.partition_log import PartitionLog
from services.log.replica_state import FOLLOWER, LEADER
from services.log.topic_config import TopicConfig
from services.log.transaction_index import AbortedTxn
from services.log.verification import VerificationRequiredError

from ..record_batches import build_batch, values

NOW = int(time.time() * 1000)
PRODUCERS = (1, 2, 3)


@dataclass(frozen=True)
class Stored:
    """A batch the model expects in the log."""

    offset: int
    count: int
    producer_id: int  # -1: none
    kind: str  # "txn", "idempotent", "plain", "commit" or "abort"
    last_seq: int = -1

    @property
    def next_offset(self) -> int:
        return self.offset + self.count


@dataclass(frozen=True)
class Derived:
    ongoing: dict[int, int]  # producer -> first offset
    # (producer, first offset, marker offset, aborted, LSO when it ended), in marker order.
    ended: list[tuple[int, int, int, bool, int]]


def derive(batches: list[Stored]) -> Derived:
    ongoing: dict[int, int] = {}
    ended = []
    for batch in batches:
        pid = batch.producer_id
        if batch.kind == "txn" and pid not in ongoing:
            ongoing[pid] = batch.offset
        elif batch.kind in ("commit", "abort") and pid in ongoing:
            first = ongoing.pop(pid)
            others = [start for producer, start in ongoing.items() if producer != pid]
            ended.append((pid, first, batch.offset, batch.kind == "abort",
                          min(others) if others else batch.offset + 1))
    return Derived(ongoing, ended)


def model_lso(batches: list[Stored], high_watermark: int) -> int:
    derived = derive(batches)
    unstable = list(derived.ongoing.values()) + [
        first for _, first, marker, _, _ in derived.ended if marker >= high_watermark]
    return min([*unstable, high_watermark])


def next_sequence(batches: list[Stored], producer_id: int) -> int:
    data = [b for b in batches if b.producer_id == producer_id and b.last_seq >= 0]
    return data[-1].last_seq + 1 if data else 0


_operation = st.one_of(
    st.tuples(st.just("txn"), st.sampled_from(PRODUCERS), st.integers(1, 3)),
    st.tuples(st.just("idempotent"), st.sampled_from(PRODUCERS), st.integers(1, 2)),
    st.tuples(st.just("plain"), st.just(-1), st.integers(1, 2)),
    st.tuples(st.just("commit"), st.sampled_from(PRODUCERS), st.just(0)),
    st.tuples(st.just("abort"), st.sampled_from(PRODUCERS), st.just(0)),
    st.tuples(st.just("hw"), st.just(-1), st.integers(0, 4)),
    st.tuples(st.just("read"), st.just(-1), st.integers(0, 100)),
    st.tuples(st.just("truncate"), st.just(-1), st.integers(0, 100)),
    st.tuples(st.just("restart"), st.just(-1), st.integers(0, 3)),
)


class Run:
    """The log under test, its model, and the leader epoch it is at."""

    def __init__(self, directory: Path, segment_bytes: int | None = None) -> None:
        self.directory = directory
        # About three small batches a segment by default: markers often land apart from
        # their data.
        self.segment_bytes = segment_bytes or 3 * len(build_batch(values(2)))
        self.batches: list[Stored] = []
        self.epoch = 0
        self.partition_log = self._open(recovery_point=0)

    @property
    def config(self) -> TopicConfig:
        return TopicConfig(segment_bytes=self.segment_bytes)

    def _open(self, recovery_point: int) -> PartitionLog:
        partition_log = PartitionLog(self.directory, "t", 0, "", self.config,
                                     recovery_point=recovery_point)
        self.epoch += 1
        asyncio.run(partition_log.become(replica_state.state(LEADER, self.epoch,
                                                             in_sync_alone=False)))
        return partition_log

    @property
    def end(self) -> int:
        return self.batches[-1].next_offset if self.batches else 0

    def append(self, kind: str, pid: int, count: int) -> None:
        log = self.partition_log
        ongoing = derive(self.batches).ongoing
        sequence = next_sequence(self.batches, pid) if pid >= 0 else -1
        records = build_batch(values(count, tag=f"{kind}{pid}-"), producer_id=pid,
                              producer_epoch=0 if pid >= 0 else -1, base_sequence=sequence,
                              base_timestamp=NOW,
                              attributes=TRANSACTIONAL_BIT if kind == "txn" else 0)
        if kind == "idempotent" and pid in ongoing:
            with pytest.raises(KafkaError) as caught:
                asyncio.run(log.append(records))
            assert caught.value.code is ErrorCode.invalid_txn_state
            return
        if kind == "txn" and pid not in ongoing:
            with pytest.raises(VerificationRequiredError) as needed:
                asyncio.run(log.append(records))
            info = asyncio.run(log.append(records, verification_guard=needed.value.guard))
        else:
            info = asyncio.run(log.append(records))
        assert info.base_offset == self.end
        self.batches.append(Stored(info.base_offset, count, pid, kind,
                                   sequence + count - 1 if pid >= 0 else -1))

    def marker(self, kind: str, pid: int) -> None:
        info = asyncio.run(self.partition_log.write_txn_marker(pid, 0, kind == "commit", 0))
        assert info.base_offset == self.end
        self.batches.append(Stored(info.base_offset, 1, pid, kind))

    def advance_high_watermark(self, batches: int) -> None:
        """Move the high watermark over that many more batches (it is always a batch
        boundary: the log end offset of the replicas in sync)."""
        log = self.partition_log
        ahead = [b.next_offset for b in self.batches if b.next_offset > log.high_watermark]
        if ahead and batches:
            log.advance_high_watermark(ahead[min(batches, len(ahead)) - 1])

    def cut_model(self, end: int) -> None:
        """The log now ends at ``end``, which must be a batch boundary of the model."""
        kept = [b for b in self.batches if b.next_offset <= end]
        assert (kept[-1].next_offset if kept else 0) == end
        self.batches = kept

    def truncate(self, fraction: int) -> None:
        log = self.partition_log
        target = self.end * fraction // 100
        self.epoch += 1
        asyncio.run(log.become(replica_state.state(FOLLOWER, self.epoch)))
        new_end = asyncio.run(log.truncate_to(target))
        # Whole batches go: the batch holding the target too.
        holding = next((b for b in self.batches if b.offset <= target < b.next_offset), None)
        assert new_end == (self.end if holding is None else holding.offset)
        self.cut_model(new_end)
        self.epoch += 1
        asyncio.run(log.become(replica_state.state(LEADER, self.epoch, in_sync_alone=False)))

    def restart(self, how: int) -> None:
        """0: clean; 1: a crash after the last roll was flushed; 2: a crash with nothing known
        to be on disk; 3: a crash that tore the last batch."""
        log = self.partition_log
        if how == 0:
            log.close()
            recovery_point = log.log_end_offset
        else:
            log.checkpoint_high_watermark()  # the periodic checkpoint is current
            log.close(flush=False)
            recovery_point = log.segments[-1].base_offset if how == 1 else 0
            if how == 3 and log.segments[-1].size:
                path = log.segments[-1].log_path
                path.write_bytes(path.read_bytes()[:-7])
        self.partition_log = self._open(recovery_point)
        self.cut_model(self.partition_log.log_end_offset)

    def read(self, fraction: int) -> None:
        log = self.partition_log
        offset = log.log_end_offset * fraction // 100
        records, aborted = log.read_committed(offset, 1 << 20)
        lso = log.last_stable_offset
        spans = [(b.header.base_offset, b.header.next_offset) for b in iter_batches(records)]
        if offset < lso:
            assert spans and spans[0][0] <= offset < spans[0][1]
        if not spans:
            assert aborted == []
            return
        returned_end = spans[-1][1]
        assert returned_end <= lso
        expected = sorted(
            (AbortedTxn(pid, first, marker, stable)
             for pid, first, marker, was_aborted, stable in derive(self.batches).ended
             if was_aborted and marker >= offset and first < returned_end),
            key=lambda txn: txn.first_offset)
        assert aborted == expected

    def check(self) -> None:
        log = self.partition_log
        assert log.log_end_offset == self.end
        derived = derive(self.batches)
        assert dict((pid, first) for first, pid in log.producer_state.ongoing_transactions()) == (
            derived.ongoing)
        assert log.last_stable_offset == model_lso(self.batches, log.high_watermark)
        indexed = [txn for segment in log.segments for txn in segment.txn_index.entries()]
        assert indexed == [AbortedTxn(pid, first, marker, stable)
                           for pid, first, marker, aborted, stable in derived.ended if aborted]
        for segment in log.segments:
            for txn in segment.txn_index.entries():
                assert segment.base_offset <= txn.last_offset < segment.next_offset


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_operation, min_size=1, max_size=40))
def test_the_lso_and_aborted_transactions_match_the_model(operations) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        run = Run(Path(scratch) / "t-0")
        try:
            for kind, pid, arg in operations:
                if kind in ("txn", "idempotent", "plain"):
                    run.append(kind, pid, arg)
                elif kind in ("commit", "abort"):
                    run.marker(kind, pid)
                elif kind == "hw":
                    run.advance_high_watermark(arg)
                elif kind == "read":
                    run.read(arg)
                elif kind == "truncate":
                    run.truncate(arg)
                else:
                    run.restart(arg)
                run.check()
        finally:
            run.partition_log.close()


def test_a_crash_at_any_byte_of_the_last_segment_recovers_a_consistent_state(
    tmp_path: Path,
) -> None:
    """A log whose last segment holds data, commits and aborts, torn at every byte (with its
    transaction index whole, or lost): start-up keeps the whole batches before the tear, and
    the transaction state and indexes are exactly those of what was kept."""
    run = Run(tmp_path / "history" / "t-0", segment_bytes=1 << 20)
    run.append("txn", 1, 1)
    run.append("txn", 2, 1)
    run.append("plain", -1, 1)
    run.marker("abort", 1)
    run.append("txn", 3, 2)
    run.marker("commit", 2)
    run.append("plain", -1, 1)
    run.advance_high_watermark(len(run.batches))
    # The last segment: a transaction begun, ended by an abort, one ended, one left open.
    run.partition_log._roll()
    run.append("txn", 2, 1)
    run.marker("abort", 2)
    run.marker("commit", 3)
    run.append("txn", 1, 2)
    run.check()
    log = run.partition_log
    log.checkpoint_high_watermark()
    last = log.segments[-1]
    base, size = last.base_offset, last.size
    assert last.txn_index.entries(), "the last segment must hold an abort"
    log.close(flush=False)
    history, model = run.directory, list(run.batches)
    checked = 0
    for cut in range(size + 1):
        for lost_index in (False, True):
            directory = tmp_path / f"cut-{cut}-{lost_index}" / "t-0"
            shutil.copytree(history, directory)
            log_path = directory / last.log_path.name
            log_path.write_bytes(log_path.read_bytes()[:cut])
            if lost_index:
                (directory / last.txn_index.path.name).unlink()
            reopened = PartitionLog(directory, "t", 0, "", run.config, recovery_point=base)
            try:
                kept = [b for b in model if b.next_offset <= reopened.log_end_offset]
                assert reopened.log_end_offset == (kept[-1].next_offset if kept else 0)
                assert all(b.offset < base or b in kept for b in model
                           if b.next_offset <= base)
                derived = derive(kept)
                assert dict((pid, first) for first, pid in
                            reopened.producer_state.ongoing_transactions()) == derived.ongoing
                assert reopened.last_stable_offset == model_lso(kept,
                                                                reopened.high_watermark)
                assert [txn for s in reopened.segments for txn in s.txn_index.entries()] == [
                    AbortedTxn(pid, first, marker, stable)
                    for pid, first, marker, aborted, stable in derived.ended if aborted]
                checked += 1
            finally:
                reopened.close()
            shutil.rmtree(directory.parent)
    assert checked == 2 * (size + 1)
