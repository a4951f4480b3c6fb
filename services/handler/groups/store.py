"""One ``__consumer_offsets`` partition as this handler sees it: a cached
:class:`~.state.PartitionState`, brought up to date from the partition's leader before every
use, and conditional appends that keep concurrent handlers from corrupting it.

Freshness: :meth:`OffsetsPartition.refresh` reads from the cached end to the log end offset
(one Read call, usually empty). A log that went back behind the cache (its end offset below
it, its start past it, or another leader or leader epoch, which may have cut the tail) is read
again from its start. The cache is only an optimisation: a new handler builds it from the log.

Records: each update is one uncompressed v2 batch (:mod:`services.common.records`). Reading
skips control batches and, with a warning, compressed ones (nothing of ours writes them).

Serialising writers: an update is computed on fresh state and appended with
``expected_log_end_offset`` = the end that state corresponds to; the log node refuses it with
INVALID_UPDATE_VERSION if anything was appended in between (another handler won), and the
caller reads again and retries. Within one handler, :attr:`OffsetsPartition.lock` keeps its
own updates of the partition from racing each other.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from services.common.errors import ErrorCode
from services.common.records.record import build_batch, decode_records
from services.common.records.record_batch import MAGIC, RecordError, batches_end, iter_batches

from ..collaborators import (
    AppendResult,
    CallError,
    ConditionalAppender,
    LogNodes,
    PartitionAppend,
    PartitionRead,
    ReadLimit,
    ReadResult,
)
from ..metadata_cache import LogNode
from .state import LoggedRecord, PartitionState

log = logging.getLogger(__name__)

READ_CHUNK_BYTES = 8 * 1024 * 1024
CALL_TIME_LIMIT_S = 10.0
# Bound on reads per refresh: a partition far behind is read in chunks of READ_CHUNK_BYTES.
MAX_READS_PER_REFRESH = 10_000

CONFLICT = ErrorCode.invalid_update_version.value
OFFSET_OUT_OF_RANGE = ErrorCode.offset_out_of_range.value


class PartitionUnavailableError(Exception):
    """The partition's leader could not be read or written (the caller answers
    COORDINATOR_NOT_AVAILABLE or NOT_COORDINATOR); ``code`` is the Kafka error seen, if any."""

    def __init__(self, message: str, code: int = 0, outcome_unknown: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.outcome_unknown = outcome_unknown


def read_records(data: bytes) -> Iterator[LoggedRecord]:
    """The records of a run of whole batches, in offset order; a truncated tail ends the run.
    Raises :class:`RecordError` for a batch that is not v2 or whose records do not decode."""
    view = memoryview(data)
    for position, header in iter_batches(view):
        if header.magic != MAGIC:
            raise RecordError(f"record batch of magic {header.magic}")
        if header.is_control:
            continue
        if header.compression:
            log.warning("skipping a compressed batch at offset %d of the offsets topic",
                        header.base_offset)
            continue
        for record in decode_records(view[position:position + header.size], header):
            yield LoggedRecord(header.base_offset + record.offset_delta, record.key, record.value)


class LogClient(LogNodes, ConditionalAppender, Protocol):
    """What the store needs of the log nodes."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Leader:
    node: LogNode
    epoch: int


class OffsetsPartition:
    """The cached state of one offsets partition and the calls that keep it right."""

    def __init__(self, topic: str, partition: int, log_nodes: LogClient) -> None:
        self.topic = topic
        self.partition = partition
        self._log_nodes = log_nodes
        self.state = PartitionState()
        self.lock = asyncio.Lock()
        self._leader: Leader | None = None
        self.loaded = False

    async def refresh(self, leader: Leader) -> PartitionState:
        """Bring the state up to the log end offset of ``leader``; returns it (do not mutate
        it). Raises PartitionUnavailableError."""
        if self._leader is not None and self._leader != leader:
            log.info("offsets partition %d moved to node %d (epoch %d): reloading",
                     self.partition, leader.node.node_id, leader.epoch)
            self.state = PartitionState()
            self.loaded = False
        self._leader = leader
        for _ in range(MAX_READS_PER_REFRESH):
            result = await self._read(leader.node, self.state.end)
            if result.error_code == OFFSET_OUT_OF_RANGE or (
                    not result.error_code and result.log_end_offset < self.state.end):
                log.info("offsets partition %d went back behind offset %d: reloading from %d",
                         self.partition, self.state.end, max(result.log_start_offset, 0))
                self.state = PartitionState(start=max(result.log_start_offset, 0))
                continue
            if result.error_code:
                raise PartitionUnavailableError(
                    f"reading offsets partition {self.partition}: error {result.error_code}",
                    result.error_code)
            records = result.records
            if not records:
                self.state.end = max(self.state.end, result.log_end_offset)
                break
            end = batches_end(records)
            self.state.apply(read_records(records), end if end is not None else self.state.end)
            if self.state.end >= result.log_end_offset:
                break
        self.loaded = True
        return self.state

    async def _read(self, node: LogNode, offset: int) -> ReadResult:
        try:
            results = await self._log_nodes.read(
                node, [PartitionRead(topic=self.topic, partition=self.partition, offset=offset,
                                     max_bytes=READ_CHUNK_BYTES)],
                READ_CHUNK_BYTES, ReadLimit.LOG_END, CALL_TIME_LIMIT_S)
        except CallError as exc:
            raise PartitionUnavailableError(f"reading offsets partition {self.partition}: "
                                            f"{exc}") from exc
        if not results:
            raise PartitionUnavailableError(f"no answer for offsets partition {self.partition}")
        return results[0]

    async def append(self, leader: Leader, records: Sequence[tuple[bytes, bytes | None]],
                     timestamp: int) -> AppendResult | None:
        """Append ``records`` as one batch if nothing was appended since the state was read;
        on success apply them to the state and return the append's result, on a conflict
        return None. Raises PartitionUnavailableError."""
        expected = self.state.end
        batch = build_batch(records, timestamp)
        try:
            result = await self._log_nodes.append_if_end(
                leader.node, PartitionAppend(topic=self.topic, partition=self.partition,
                                             records=batch),
                expected, CALL_TIME_LIMIT_S)
        except CallError as exc:
            raise PartitionUnavailableError(
                f"appending to offsets partition {self.partition}: {exc}",
                outcome_unknown=True) from exc
        if result.error_code == CONFLICT:
            return None
        if result.error_code:
            raise PartitionUnavailableError(
                f"appending to offsets partition {self.partition}: error {result.error_code}",
                result.error_code)
        for key, value in records:
            self.state.apply_record(key, value)
        self.state.end = max(result.log_end_offset, expected + len(records))
        return result
