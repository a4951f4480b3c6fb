"""Fetch for consumers: read record batches from the partitions' leaders, waiting for data when
there is too little (Kafka's ``KafkaApis.handleFetchRequest``, ``ReplicaManager.fetchMessages``
and ``DelayedFetch``).

    Fetch Request => replica_id max_wait_ms min_bytes max_bytes isolation_level session_id
                     session_epoch [topics] [forgotten_topics_data] rack_id
      topics => topic topic_id [partitions]
        partitions => partition current_leader_epoch fetch_offset log_start_offset
                      partition_max_bytes
    Fetch Response => throttle_time_ms error_code session_id [responses]
      responses => topic topic_id [partitions]
        partitions => partition_index error_code high_watermark last_stable_offset
                      log_start_offset [aborted_transactions] preferred_read_replica records

- Fetch sessions (KIP-227) are kept by the frontend (services/frontend/fetch_sessions.py),
  which sends handlers full, sessionless fetches of every partition in a session, so any
  handler serves any fetch. An incremental fetch reaching a handler (any epoch but 0 and -1)
  refers to a session it cannot know: FETCH_SESSION_ID_NOT_FOUND for the whole request.
- Only consumers fetch through Kafka (replica id < 0); log nodes replicate through the
  replicator, so a fetch from a broker id is answered NOT_LEADER_OR_FOLLOWER per partition
  (TOPIC_AUTHORIZATION_FAILED without CLUSTER_ACTION on the cluster, as Kafka answers a
  follower it does not trust).
- A consumer must be allowed to READ each topic: TOPIC_AUTHORIZATION_FAILED for the partitions
  of the others (whether they exist or not), which do not hold up the wait for the rest.
- Topics are named, or from v13 identified by topic id (unknown: UNKNOWN_TOPIC_ID).
- Reads stop at the high watermark. Sizes: the first partition with data returns at least one
  whole batch; after that, each partition gets at most ``partition_max_bytes`` and all of them
  at most ``max_bytes`` in total, in whole batches.
- Waiting: with fewer than ``min_bytes`` and ``max_wait_ms`` left, the fetch parks in the
  purgatory on every partition it reads (woken when any high watermark moves past the one
  seen), then reads again, until the deadline. A partition error or nothing to read answers at
  once. Without a reachable purgatory the fetch waits out the deadline and reads once more; if
  the purgatory fails while the fetch is parked (a restart) or stalls past the deadline, the
  fetch reads once more and answers at once instead of hanging.
- Isolation: read_uncommitted (0) reads up to the high watermark; read_committed (1) up to the
  last stable offset (the first offset of the oldest transaction not yet decided, at most the
  high watermark), with the aborted transactions the records returned overlap (producer id and
  first offset, which consumers use to skip aborted records), as the leader reports them
  (Kafka's ``FetchIsolation.TXN_COMMITTED`` and ``collectAbortedTransactions``). Every answer
  carries the last stable offset; aborted transactions are null under read_uncommitted. A
  read_committed fetch waits as any other: the markers that end a transaction move the high
  watermark, which wakes it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kbroker.kafka.v1 import kafka_pb2 as k
from kbroker.log.v1 import log_pb2
from kbroker.purgatory.v1 import purgatory_pb2
from services.common.acls import Operation, ResourceType
from services.common.errors import ErrorCode, KafkaError
from services.common.payloads import Detached, PayloadPath
from services.common.progress_reports import partition_key
from services.common.records.record_batch import LOG_OVERHEAD, read_log_overhead

from ..collaborators import CallError, LogNodes, Purgatory, UnreachableError
from ..metadata_cache import (
    ClusterMetadata,
    LogNode,
    MetadataCache,
    MetadataUnavailableError,
    TopicInfo,
)
from ..metrics import parked
from ..request_context import RequestContext
from ..routing import Route, call_leaders, leader_error, locate
from ..topic_identity import canonical_topic_id

log = logging.getLogger(__name__)

# Session epochs of KIP-227.
INITIAL_EPOCH = 0
FINAL_EPOCH = -1
READ_COMMITTED = 1
# A read is a local page-cache read; a leader that takes longer than this is in trouble.
READ_TIMEOUT_S = 10.0
# How long past its deadline a parked fetch waits for the purgatory's answer.
PURGATORY_SLACK_S = 0.2
# When unset (a hand-made request), a partition may return as much as consumers default to.
DEFAULT_PARTITION_MAX_BYTES = 1024 * 1024
# Where a response's record batches go: beside it for a caller that takes them so (they are
# views of what the log nodes answered, never copied here), else in it.
RESPONSE_RECORDS = PayloadPath(k.FetchResponse.DESCRIPTOR, "responses.partitions.records")
# Errors found before reading that do not end a wait early: as in Kafka, partitions of
# unknown topics are answered with their error while the others wait for data.
TOPIC_AUTHORIZATION_FAILED = ErrorCode.topic_authorization_failed.value
_NON_BLOCKING_ERRORS = frozenset(
    {ErrorCode.unknown_topic_or_partition.value, ErrorCode.unknown_topic_id.value,
     TOPIC_AUTHORIZATION_FAILED}
)


@dataclass(slots=True)
class _Slot:
    """One requested partition: what is asked of it, its route (None when it failed before
    reading), its fixed error if any, and the latest read."""

    partition: int
    fetch_offset: int
    max_bytes: int
    route: Route | None
    error_code: int = 0
    read: log_pb2.PartitionReadResult | None = None

    @property
    def topic_name(self) -> str:
        assert self.route is not None
        return self.route.topic.name


@dataclass(slots=True)
class _TopicSlots:
    # How the response names the topic: ``topic`` and ``topic_id`` when known (unset: null).
    names: dict[str, str]
    slots: list[_Slot]


class FetchApi:
    def __init__(self, cache: MetadataCache, log_nodes: LogNodes, purgatory: Purgatory) -> None:
        self._cache = cache
        self._log_nodes = log_nodes
        self._purgatory = purgatory

    async def handle(self, request: k.FetchRequest,
                     context: RequestContext) -> k.FetchResponse | Detached:
        """The response; its record batches beside it when the caller takes them so
        (``context.detached_payloads``)."""
        deadline = time.monotonic() + max(request.max_wait_ms, 0) / 1000
        if request.session_epoch not in (INITIAL_EPOCH, FINAL_EPOCH):
            return k.FetchResponse(error_code=ErrorCode.fetch_session_id_not_found.value)
        detached = context.detached_payloads
        try:
            metadata = await self._cache.current()
        except MetadataUnavailableError:
            return self._assemble(self._plan(None, request, context), request, detached)[0]
        plan = self._plan(metadata, request, context)
        reading = [s for t in plan for s in t.slots if s.route is not None]
        blocked = any(
            s.error_code and s.error_code not in _NON_BLOCKING_ERRORS
            for t in plan for s in t.slots)
        while True:
            response, size = await self._respond(plan, reading, request, context)
            remaining = deadline - time.monotonic()
            if (
                request.max_wait_ms <= 0
                or not reading
                or blocked
                or size >= request.min_bytes
                or remaining <= 0
                or any(s.read is not None and s.read.error_code for s in reading)
            ):
                return response
            if not await self._wait(reading, deadline):
                # Expired, or woken by a partition error: answer with one more read.
                return (await self._respond(plan, reading, request, context))[0]

    async def _respond(self, plan: list[_TopicSlots], reading: list[_Slot],
                       request: k.FetchRequest, context: RequestContext,
                       ) -> tuple[k.FetchResponse | Detached, int]:
        """Read every routed partition and assemble the answer (see :meth:`_assemble`). With
        ``context.local_reader``, leaders on that host may answer with ranges of their segment
        files instead of the batches; if a range is past the fetch's byte limits, which only
        cutting batches off would mend, the partitions are read again as batches."""
        committed = request.isolation_level == READ_COMMITTED
        detached = context.detached_payloads
        local = context.local_reader
        await self._read(reading, request.max_bytes, committed, local)
        try:
            return self._assemble(plan, request, detached)
        except _RangePastLimitsError:
            await self._read(reading, request.max_bytes, committed)
            return self._assemble(plan, request, detached)

    def _plan(
        self, metadata: ClusterMetadata | None, request: k.FetchRequest,
        context: RequestContext,
    ) -> list[_TopicSlots]:
        """Each requested partition routed to its leader, or failed with its error. Without
        metadata every partition is NOT_LEADER_OR_FOLLOWER, as from a broker that does not know
        it (clients refresh their metadata and retry)."""
        plan = []
        # From v15 the fetching replica is named in replica_state (replica_id is then -1).
        replica_id = request.replica_state.replica_id
        consumer = (request.replica_id if replica_id == -1 else replica_id) < 0
        # Kafka answers a follower without CLUSTER_ACTION per partition, as a topic error.
        follower_denied = 0 if consumer or context.access.allows(
            Operation.CLUSTER_ACTION, ResourceType.CLUSTER) else TOPIC_AUTHORIZATION_FAILED
        for topic in request.topics:
            topic_id = canonical_topic_id(topic.topic_id)
            info: TopicInfo | None
            if metadata is None:
                info, missing = None, ErrorCode.not_leader_or_follower.value
            elif topic_id is not None:
                info = metadata.topic_by_id(topic_id)
                missing = ErrorCode.unknown_topic_id.value
            else:
                info = metadata.topic(topic.topic)
                missing = ErrorCode.unknown_topic_or_partition.value
            name = info.name if info is not None else (topic.topic if topic_id is None else "")
            denied = follower_denied or (context.access.check(
                Operation.READ, ResourceType.TOPIC, name) if consumer and name else 0)
            slots = []
            for p in topic.partitions:
                # Unset (a hand-made request): as much as consumers ask for by default.
                max_bytes = (p.partition_max_bytes if p.HasField("partition_max_bytes")
                             else DEFAULT_PARTITION_MAX_BYTES)
                slot = _Slot(p.partition, p.fetch_offset, max_bytes, None)
                slots.append(slot)
                if denied and metadata is not None:
                    slot.error_code = denied
                    continue
                if info is None:
                    slot.error_code = missing
                    continue
                if not consumer:
                    slot.error_code = ErrorCode.not_leader_or_follower.value
                    continue
                try:
                    slot.route = locate(metadata, info, p.partition,  # type: ignore[arg-type]
                                        p.current_leader_epoch)
                except KafkaError as exc:
                    slot.error_code = exc.errno
            known_id = info.topic_id if info else topic_id
            names = {"topic_id": known_id} if known_id is not None else {}
            if info is not None or topic.HasField("topic"):
                names["topic"] = info.name if info else topic.topic
            plan.append(_TopicSlots(names, slots))
        return plan

    async def _read(self, slots: list[_Slot], max_bytes: int, committed: bool,
                    local_reader: str = "") -> None:
        """Read every routed partition from its leader, one Read per node, concurrently
        (``local_reader``: see :meth:`_respond`)."""
        limit = log_pb2.READ_LIMIT_LAST_STABLE if committed else (
            log_pb2.READ_LIMIT_HIGH_WATERMARK)

        async def read_on(node: LogNode, items: list[_Slot]) -> Sequence[Any]:
            reads = log_pb2.ReadRequest(
                max_bytes=max_bytes, limit=limit, local_reader=local_reader, partitions=[
                    log_pb2.PartitionRead(topic=s.topic_name, partition=s.partition,
                                          offset=s.fetch_offset, max_bytes=s.max_bytes)
                    for s in items])
            return (await self._log_nodes.read(node, reads, READ_TIMEOUT_S)).results

        routed = [(s.route, s) for s in slots if s.route is not None]
        for s, code, result in await call_leaders(routed, read_on, effect=False):
            s.read = result if not code else log_pb2.PartitionReadResult(error_code=code)

    @staticmethod
    def _assemble(
        plan: list[_TopicSlots], request: k.FetchRequest, detached: bool = False,
    ) -> tuple[k.FetchResponse | Detached, int]:
        """The response from the latest reads, sized as Kafka sizes it (with ``detached``, its
        record batches beside it); and its record bytes. Aborted transactions are null, except
        a list (maybe empty) for read_committed; an errored partition has high watermark -1
        and empty records (Kafka's ``FetchResponse.partitionResponse``). Raises
        _RangePastLimitsError for a range of a segment file that only cutting would fit."""
        committed = request.isolation_level == READ_COMMITTED
        budget = max(request.max_bytes, 0)
        first = True
        total = 0
        response = k.FetchResponse()
        # Every partition's records, in response order (each partition sets them: empty
        # ones too), and those a reader takes from segment files (see _respond).
        batches: list[bytes | memoryview] = []
        files: list[tuple[int, Any]] = []
        for t in plan:
            add = response.responses.add(**t.names).partitions.add
            for s in t.slots:
                read = s.read
                code = s.error_code or (leader_error(read.error_code) if read is not None else 0)
                if code or read is None:
                    add(partition_index=s.partition, error_code=code, high_watermark=-1)
                    batches.append(b"")
                    continue
                limit = min(max(s.max_bytes, 0), budget - total)
                if read.HasField("file_records"):
                    # Passed on whole: a log node answers past a limit only with one whole
                    # batch, which the first partition with data keeps (as trimming would).
                    if read.file_records.size > limit and not first:
                        raise _RangePastLimitsError
                    files.append((len(batches), read.file_records))
                    batches.append(b"")
                    first = False
                    total += read.file_records.size
                else:
                    records = trim_to_whole_batches(read.records, limit, at_least_one=first)
                    if records:
                        first = False
                        total += len(records)
                    batches.append(records)
                partition = add(partition_index=s.partition, high_watermark=read.high_watermark,
                                last_stable_offset=read.last_stable_offset,
                                log_start_offset=read.log_start_offset)
                if committed:
                    partition.aborted_transactions_is_null = False
                    for aborted in read.aborted_transactions:
                        partition.aborted_transactions.add(producer_id=aborted.producer_id,
                                                           first_offset=aborted.first_offset)
        answer = Detached(response, RESPONSE_RECORDS, batches, files)
        return (answer if detached else answer.whole()), total

    async def _wait(self, slots: list[_Slot], deadline: float) -> bool:
        """Park until a partition's high watermark moves past the one last read, or the
        deadline. True when woken by progress (worth reading and checking again); False when
        the wait expired or a partition reported an error (the fetch answers now)."""
        thresholds = {partition_key(s.topic_name, s.partition):
                      max(s.read.high_watermark if s.read else -1, s.fetch_offset) + 1
                      for s in slots}
        remaining = deadline - time.monotonic()
        timeout_ms = max(math.ceil(remaining * 1000), 1)
        try:
            # Bounded here too: a purgatory that stalls must not hold the fetch past its wait.
            with parked():
                outcome = await asyncio.wait_for(
                    self._purgatory.wait(purgatory_pb2.OPERATION_KIND_FETCH, thresholds,
                                         require_all=False, timeout_ms=timeout_ms),
                    max(remaining, 0) + PURGATORY_SLACK_S)
        except UnreachableError as exc:
            # No purgatory to park in: wait out the deadline rather than have consumers spin
            # (remote time too: the fetch waits as it would have parked).
            log.debug("purgatory unreachable (%s); waiting out the fetch", exc)
            with parked():
                await asyncio.sleep(max(deadline - time.monotonic(), 0))
            return False
        except (CallError, TimeoutError) as exc:
            # The purgatory went away while the fetch was parked (a restart) or stalled: answer
            # with what there is now, before the deadline, and let the consumer fetch again.
            log.debug("purgatory failed mid-wait (%r); answering the fetch now", exc)
            return False
        if outcome.outcome != purgatory_pb2.OUTCOME_COMPLETED:
            return False
        return not any(state.error_code for state in outcome.keys)


class _RangePastLimitsError(Exception):
    """A partition's range of a segment file is past the fetch's byte limits."""


def whole_batches_size(records: bytes | memoryview, limit: int, at_least_one: bool) -> int:
    """The size of the longest run of whole batches at the start of ``records`` that fits in
    ``limit`` bytes; with ``at_least_one`` the first batch counts even if it alone does not
    (Kafka's rule for the first partition of a fetch). A torn or malformed batch ends the run.
    A consumer gets whole batches of a partition or none."""
    size = len(records)
    pos = 0
    read = read_log_overhead  # 12 bytes a batch, not its whole header: this walk is hot
    while pos + LOG_OVERHEAD <= size:
        _, length = read(records, pos)
        end = pos + LOG_OVERHEAD + length
        if length < 0 or end > size or end > limit and not (at_least_one and pos == 0):
            break
        pos = end
    return pos


def trim_to_whole_batches(records: bytes | memoryview, limit: int,
                          at_least_one: bool) -> bytes | memoryview:
    """``records`` (whole batches, as log nodes return them) cut to :func:`whole_batches_size`;
    the same object when it fits, without walking its batches (the common case of a fetch)."""
    if len(records) <= limit:
        return records
    keep = whole_batches_size(records, limit, at_least_one)
    return records if keep == len(records) else records[:keep]
