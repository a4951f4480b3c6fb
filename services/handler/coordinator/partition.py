"""One partition of a coordinator's internal topic as this handler sees it: a cached state,
brought up to date from the partition's leader before every use, and conditional appends that
keep concurrent handlers from corrupting it (Kafka's coordinator loader and its writes, for a
coordinator that owns nothing in memory).

State: whatever the coordinator keeps (:class:`CoordinatorState`), built by replaying the
partition's records in offset order; :attr:`CoordinatorPartition.end` is the offset after the
last record replayed, the log end offset the state corresponds to, which is what a conditional
append expects. Records without a key mean nothing here and are skipped, as are records the
state cannot read (logged: one bad record must not make a whole partition unavailable).

Transactions (Kafka's ``CoordinatorShard.replay`` with its producer id, and
``replayEndTransactionMarker``): a state that also implements
:class:`TransactionalCoordinatorState` is given every record with its offset and, for records
of a transactional batch, the batch's producer id, and every COMMIT or ABORT marker as (producer
id, committed); a state without it is given the records outside transactions only. A change
may write its records as one transactional batch of a producer (:class:`TransactionalRecords`):
they count for the state only once a COMMIT marker of that producer follows them.

Freshness: :meth:`CoordinatorPartition.refresh` reads from the cached end to the log end offset
(one Read call, usually empty). A log that went back behind the cache (its end offset below
it, its start past it, or another leader or leader epoch, which may have cut the tail) is
replayed again from its start. The cache is only an optimisation: a new handler builds it from
the log.

Serialising writers: a change is computed on fresh state and appended with
``expected_log_end_offset`` = :attr:`~CoordinatorPartition.end`; the log node refuses it with
INVALID_UPDATE_VERSION if anything was appended in between (another handler won), and the
caller reads again and retries. Within one handler, :attr:`CoordinatorPartition.lock` keeps its
own changes of the partition from racing each other. Not thread-safe (one event loop).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

from kbroker.log.v1 import log_pb2
from services.common.errors import ErrorCode, error_name
from services.common.records.control_records import (
    ControlRecordType,
    read_end_transaction_marker,
)
from services.common.records.record import Record, build_batch, decode_records, encode_batch
from services.common.records.record_batch import (
    MAGIC,
    TRANSACTIONAL_BIT,
    BatchHeader,
    RecordError,
    batches_end,
    iter_batches,
)

from ..collaborators import CallError, LogNodes
from ..metadata_cache import LogNode
from .placement import CoordinatorError, leader_error

log = logging.getLogger(__name__)

READ_CHUNK_BYTES = 8 * 1024 * 1024
CALL_TIME_LIMIT_S = 10.0
# Bound on reads per refresh: a partition far behind is read in chunks of READ_CHUNK_BYTES.
MAX_READS_PER_REFRESH = 10_000

CONFLICT = ErrorCode.invalid_update_version.value
OFFSET_OUT_OF_RANGE = ErrorCode.offset_out_of_range.value
NO_PRODUCER_ID = -1
# A coordinator's transactional writes skip the log node's sequence checks (Kafka's
# AppendOrigin.COORDINATOR); their batches carry sequence 0, as Kafka's group coordinator's do.
COORDINATOR_BASE_SEQUENCE = 0
# Errors of a transactional append that are the producer's, answered as they are (Kafka's
# coordinators pass them through to the client).
PRODUCER_ERRORS = frozenset(code.value for code in (
    ErrorCode.invalid_producer_epoch, ErrorCode.producer_fenced, ErrorCode.invalid_txn_state,
    ErrorCode.invalid_producer_id_mapping, ErrorCode.transaction_coordinator_fenced))

# Records to append together: (key, value), a None value being a tombstone.
Records = Sequence[tuple[bytes, bytes | None]]


@dataclass(frozen=True, slots=True, kw_only=True)
class TransactionalRecords:
    """Records to append as one transactional batch of a producer (Kafka's transactional
    coordinator writes, such as TxnOffsetCommit's): part of that producer's transaction on the
    partition, which its COMMIT or ABORT marker ends."""

    producer_id: int
    producer_epoch: int
    records: Records


@dataclass(frozen=True, slots=True)
class LoggedRecord:
    """One record of the partition as read back: its offset, key and value (None: a
    tombstone), and the producer whose transactional batch holds it (-1: none)."""

    offset: int
    key: bytes | None
    value: bytes | None
    producer_id: int = NO_PRODUCER_ID


@dataclass(frozen=True, slots=True)
class LoggedMarker:
    """The end of a producer's transaction on the partition: a COMMIT (``committed``) or ABORT
    control record, at ``offset``."""

    offset: int
    producer_id: int
    committed: bool


def read_records(data: bytes) -> Iterator[LoggedRecord | LoggedMarker]:
    """The records and transaction markers of a run of whole batches, in offset order,
    compressed batches included; control batches other than markers, and markers the log
    cleaner emptied, are skipped and a truncated tail ends the run. Raises
    :class:`RecordError` for a batch that is not v2 or whose records do not decode."""
    view = memoryview(data)
    for position, header in iter_batches(view):
        if header.magic != MAGIC:
            raise RecordError(f"record batch of magic {header.magic}")
        batch = view[position:position + header.size]
        if header.is_control:
            if header.record_count == 0:  # a marker the log cleaner emptied: nothing to replay
                continue
            marker = read_end_transaction_marker(batch, header)
            if marker is not None:
                yield LoggedMarker(header.base_offset, header.producer_id,
                                   marker.type is ControlRecordType.COMMIT)
            continue
        producer_id = header.producer_id if header.is_transactional else NO_PRODUCER_ID
        for record in decode_records(batch, header):
            yield LoggedRecord(header.base_offset + record.offset_delta, record.key, record.value,
                               producer_id)


def transactional_batch(records: TransactionalRecords, timestamp: int) -> bytes:
    """One uncompressed transactional batch of ``records`` for their producer, stamped
    ``timestamp``; the log node assigns its offsets."""
    entries = records.records
    if not entries:
        raise ValueError("a batch needs at least one record")
    header = BatchHeader(attributes=TRANSACTIONAL_BIT, last_offset_delta=len(entries) - 1,
                         base_timestamp=timestamp, max_timestamp=timestamp,
                         producer_id=records.producer_id, producer_epoch=records.producer_epoch,
                         base_sequence=COORDINATOR_BASE_SEQUENCE)
    return encode_batch(header, [Record(delta, 0, key, value)
                                 for delta, (key, value) in enumerate(entries)])


class CoordinatorState(Protocol):
    """A coordinator's state of one partition, built from its records."""

    def replay(self, key: bytes, value: bytes | None) -> None:
        """Apply one record (later records win per key; None: a tombstone). May raise
        ValueError (such as RecordFormatError) for a record it cannot read."""
        ...


@runtime_checkable
class TransactionalCoordinatorState(CoordinatorState, Protocol):
    """A state that takes part in transactions: it is given every record with its offset and
    producer (instead of :meth:`replay`), and the markers that end transactions."""

    def replay_record(self, offset: int, producer_id: int, key: bytes,
                      value: bytes | None) -> None:
        """Apply the record at ``offset``; ``producer_id`` is the producer whose transaction
        holds it, -1 for a record outside transactions (which applies at once)."""
        ...

    def replay_end_transaction(self, producer_id: int, committed: bool) -> None:
        """The transaction of ``producer_id`` on this partition ended: its records now count
        (``committed``) or never will."""
        ...


S = TypeVar("S", bound=CoordinatorState)


@dataclass(frozen=True, slots=True, kw_only=True)
class Leader:
    node: LogNode
    epoch: int


class CoordinatorPartition(Generic[S]):
    """The cached state of one partition and the calls that keep it right."""

    def __init__(self, topic: str, partition: int, log_nodes: LogNodes,
                 new_state: Callable[[], S]) -> None:
        self.topic = topic
        self.partition = partition
        self._log_nodes = log_nodes
        self._new_state = new_state
        self.state = new_state()
        self._transactional = isinstance(self.state, TransactionalCoordinatorState)
        self.end = 0
        self.lock = asyncio.Lock()
        # The topic's min.insync.replicas, as the runtime last found it: what an append needs.
        self.min_insync_replicas = 1
        # Until when (monotonic) appends do not ask the leader to hold their answers for the
        # commit: one was not committed within the hold (the runtime sets it).
        self.hold_commits_after = 0.0
        self._leader: Leader | None = None
        self.loaded = False

    def current(self, leader: Leader) -> bool:
        """Whether the cached state was read from ``leader`` (at its epoch): a conditional
        append then proves whether it is still the partition's current state."""
        return self.loaded and self._leader == leader

    def _reset(self, start: int) -> None:
        self.state = self._new_state()
        self.end = start

    async def refresh(self, leader: Leader) -> S:
        """Bring the state up to the log end offset of ``leader``; returns it (do not mutate
        it). Raises CoordinatorError."""
        if self._leader is not None and self._leader != leader:
            log.info("%s-%d moved to node %d (epoch %d): reloading", self.topic,
                     self.partition, leader.node.node_id, leader.epoch)
            self._reset(0)
            self.loaded = False
        self._leader = leader
        for _ in range(MAX_READS_PER_REFRESH):
            result = await self._read(leader.node, self.end)
            if result.error_code == OFFSET_OUT_OF_RANGE or (
                    not result.error_code and result.log_end_offset < self.end):
                log.info("%s-%d went back behind offset %d: reloading from %d", self.topic,
                         self.partition, self.end, max(result.log_start_offset, 0))
                self._reset(max(result.log_start_offset, 0))
                continue
            if result.error_code:
                raise leader_error(result.error_code, f"reading {self.topic}-{self.partition}: "
                                   f"error {result.error_code}")
            records = result.records
            if not records:
                self.end = max(self.end, result.log_end_offset)
                break
            for entry in read_records(records):
                if entry.offset >= self.end:  # a read may start inside a batch
                    self._replay(entry)
            self.end = max(self.end, batches_end(records) or self.end)
            if self.end >= result.log_end_offset:
                break
        self.loaded = True
        return self.state

    def _replay(self, entry: LoggedRecord | LoggedMarker) -> None:
        state = self.state
        transactional = self._transactional
        if isinstance(entry, LoggedMarker):
            if transactional:
                state.replay_end_transaction(  # type: ignore[attr-defined]
                    entry.producer_id, entry.committed)
            return
        if entry.key is None:
            return
        try:
            if transactional:
                state.replay_record(  # type: ignore[attr-defined]
                    entry.offset, entry.producer_id, entry.key, entry.value)
            elif entry.producer_id == NO_PRODUCER_ID:
                state.replay(entry.key, entry.value)
            else:
                log.debug("%s-%d: skipping a transactional record at offset %d", self.topic,
                          self.partition, entry.offset)
        except ValueError as exc:
            log.warning("skipping an unreadable record of %s-%d: %s", self.topic,
                        self.partition, exc)

    async def _call(self, call: Callable[..., Awaitable[Any]], node: LogNode, request: Any,
                    doing: str) -> Any:
        """The result for this partition of a log node call. Raises CoordinatorError."""
        try:
            results = (await call(node, request, CALL_TIME_LIMIT_S)).results
        except CallError as exc:
            raise leader_error(0, f"{doing} {self.topic}-{self.partition}: {exc}") from exc
        if not results:
            raise leader_error(0, f"no answer for {self.topic}-{self.partition}")
        return results[0]

    async def _read(self, node: LogNode, offset: int) -> log_pb2.PartitionReadResult:
        return await self._call(self._log_nodes.read, node, log_pb2.ReadRequest(
            max_bytes=READ_CHUNK_BYTES, limit=log_pb2.READ_LIMIT_LOG_END, partitions=[
                log_pb2.PartitionRead(topic=self.topic, partition=self.partition,
                                      offset=offset, max_bytes=READ_CHUNK_BYTES)]), "reading")

    async def append(self, leader: Leader, records: Records | TransactionalRecords,
                     timestamp: int, commit_wait_ms: int = 0,
                     ) -> log_pb2.PartitionAppendResult | None:
        """Append ``records`` as one batch if nothing was appended since the state was read;
        on success replay them into the state and return the append's result, on a conflict
        return None. With ``commit_wait_ms`` the leader holds its answer until the high
        watermark passes the batch, for at most that long (``AppendRequest.commit_wait_ms``).
        Raises CoordinatorError (for transactional records, with the producer's
        error when the log node refuses the producer: a fenced epoch, say; a leader whose ISR
        is smaller than :attr:`min_insync_replicas` refuses the append, NOT_ENOUGH_REPLICAS,
        which coordinators answer COORDINATOR_NOT_AVAILABLE as Kafka's do)."""
        expected = self.end
        if isinstance(records, TransactionalRecords):
            entries, producer_id = records.records, records.producer_id
            batch = transactional_batch(records, timestamp)
        else:
            entries, producer_id = records, NO_PRODUCER_ID
            batch = build_batch(list(records), timestamp)
        result = await self._call(self._log_nodes.append, leader.node, log_pb2.AppendRequest(
            commit_wait_ms=commit_wait_ms, partitions=[log_pb2.PartitionAppend(
                topic=self.topic, partition=self.partition, expected_log_end_offset=expected,
                min_insync_replicas=self.min_insync_replicas, records=batch)]),
            "appending to")
        if result.error_code == CONFLICT:
            return None
        if result.error_code:
            message = (f"appending to {self.topic}-{self.partition}: "
                       f"{error_name(result.error_code)}"
                       + (f": {result.error_message}" if result.error_message else ""))
            if producer_id != NO_PRODUCER_ID and result.error_code in PRODUCER_ERRORS:
                raise CoordinatorError(result.error_code, message)
            raise leader_error(result.error_code, message)
        # A conditional append lands at the expected end: its records' offsets follow from it.
        for delta, (key, value) in enumerate(entries):
            self._replay(LoggedRecord(expected + delta, key, value, producer_id))
        self.end = max(result.log_end_offset, expected + len(entries))
        return result
