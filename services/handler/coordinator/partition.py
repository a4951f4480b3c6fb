"""One partition of a coordinator's internal topic as this handler sees it: a cached state,
brought up to date from the partition's leader before every use, and conditional appends that
keep concurrent handlers from corrupting it (Kafka's coordinator loader and its writes, for a
coordinator that owns nothing in memory).

State: whatever the coordinator keeps (:class:`CoordinatorState`), built by replaying the
partition's records in offset order; :attr:`CoordinatorPartition.end` is the offset after the
last record replayed, the log end offset the state corresponds to, which is what a conditional
append expects. Records without a key mean nothing here and are skipped, as are records the
state cannot read (logged: one bad record must not make a whole partition unavailable).

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
from typing import Any, Generic, Protocol, TypeVar

from kbroker.log.v1 import log_pb2
from services.common.errors import ErrorCode
from services.common.records.record import build_batch, decode_records
from services.common.records.record_batch import MAGIC, RecordError, batches_end, iter_batches

from ..collaborators import CallError, LogNodes
from ..metadata_cache import LogNode
from .placement import leader_error

log = logging.getLogger(__name__)

READ_CHUNK_BYTES = 8 * 1024 * 1024
CALL_TIME_LIMIT_S = 10.0
# Bound on reads per refresh: a partition far behind is read in chunks of READ_CHUNK_BYTES.
MAX_READS_PER_REFRESH = 10_000

CONFLICT = ErrorCode.invalid_update_version.value
OFFSET_OUT_OF_RANGE = ErrorCode.offset_out_of_range.value

# Records to append together: (key, value), a None value being a tombstone.
Records = Sequence[tuple[bytes, bytes | None]]


@dataclass(frozen=True, slots=True)
class LoggedRecord:
    """One record of the partition as read back: its offset, key and value (None: a
    tombstone)."""

    offset: int
    key: bytes | None
    value: bytes | None


def read_records(data: bytes) -> Iterator[LoggedRecord]:
    """The records of a run of whole batches, in offset order, compressed batches included;
    control batches are skipped and a truncated tail ends the run. Raises
    :class:`RecordError` for a batch that is not v2 or whose records do not decode."""
    view = memoryview(data)
    for position, header in iter_batches(view):
        if header.magic != MAGIC:
            raise RecordError(f"record batch of magic {header.magic}")
        if header.is_control:
            continue
        for record in decode_records(view[position:position + header.size], header):
            yield LoggedRecord(header.base_offset + record.offset_delta, record.key, record.value)


class CoordinatorState(Protocol):
    """A coordinator's state of one partition, built from its records."""

    def replay(self, key: bytes, value: bytes | None) -> None:
        """Apply one record (later records win per key; None: a tombstone). May raise
        ValueError (such as RecordFormatError) for a record it cannot read."""
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
        self.end = 0
        self.lock = asyncio.Lock()
        self._leader: Leader | None = None
        self.loaded = False

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
            for record in read_records(records):
                if record.offset >= self.end:  # a read may start inside a batch
                    self._replay(record.key, record.value)
            self.end = max(self.end, batches_end(records) or self.end)
            if self.end >= result.log_end_offset:
                break
        self.loaded = True
        return self.state

    def _replay(self, key: bytes | None, value: bytes | None) -> None:
        if key is None:
            return
        try:
            self.state.replay(key, value)
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

    async def append(self, leader: Leader, records: Records,
                     timestamp: int) -> log_pb2.PartitionAppendResult | None:
        """Append ``records`` as one batch if nothing was appended since the state was read;
        on success replay them into the state and return the append's result, on a conflict
        return None. Raises CoordinatorError."""
        expected = self.end
        result = await self._call(self._log_nodes.append, leader.node, log_pb2.AppendRequest(
            partitions=[log_pb2.PartitionAppend(
                topic=self.topic, partition=self.partition, expected_log_end_offset=expected,
                records=build_batch(list(records), timestamp))]), "appending to")
        if result.error_code == CONFLICT:
            return None
        if result.error_code:
            raise leader_error(result.error_code, f"appending to {self.topic}-{self.partition}: "
                               f"error {result.error_code}")
        for key, value in records:
            self._replay(key, value)
        self.end = max(result.log_end_offset, expected + len(records))
        return result
