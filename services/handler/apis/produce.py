"""Produce: append record batches to the partitions' leader log nodes (Kafka's
``KafkaApis.handleProduceRequest`` with ``ReplicaManager.appendRecords``).

    Produce Request => transactional_id acks timeout_ms [topic_data]
      topic_data => name [partition_data]
        partition_data => index records
    Produce Response => [responses] throttle_time_ms
      responses => name [partition_responses]
        partition_responses => index error_code base_offset log_append_time_ms
                               log_start_offset error_message

The batches travel untouched to the leader, which validates them and assigns offsets. Work is
grouped per leader node, one Append per node, the nodes concurrently. Batches the frontend left
in its spool file (services.common.file_records) are named to the leader, which reads them
there; a leader that cannot (another host) gets them carried, read here, and nothing else
(only their first header) is looked at here.

- acks outside {0, 1, -1}: INVALID_REQUIRED_ACKS for every partition, nothing appended.
- Transactional records without a transactional id, or whose principal may not WRITE the
  transactional id: TRANSACTIONAL_ID_AUTHORIZATION_FAILED for every partition, nothing
  appended (Kafka's authorization of the transactional id).
- A topic the principal may not WRITE: TOPIC_AUTHORIZATION_FAILED for its partitions, whether
  or not it exists. (Idempotent producers were authorized when they got their producer id.)
- Transactional producers (KIP-890 part 1 verification, Kafka's ``AddPartitionsToTxnManager``
  as a partition leader uses it): a transactional batch that would start its producer's
  transaction on a partition is refused by the leader (INVALID_TXN_STATE, nothing stored) with
  a verification guard; the handler then asks the transaction coordinator whether the
  partition is in the producer's transaction and, if it is, appends again with the guard. If
  it is not: TRANSACTION_ABORTABLE from v11 (INVALID_TXN_STATE, "Partition was not added to
  the transaction", before); a fenced producer INVALID_PRODUCER_EPOCH; a coordinator that
  cannot answer now (CONCURRENT_TRANSACTIONS, COORDINATOR_*, NOT_COORDINATOR)
  NOT_ENOUGH_REPLICAS, which every client retries without a metadata refresh. Transactional
  batches of more than one producer in one request are INVALID_PRODUCER_ID_MAPPING.
- Transactions v2 (v12, KIP-890 part 2): the handler asks the coordinator to add the
  partition to the transaction instead of verifying it (the producer sends no
  AddPartitionsToTxn; its first batch begins the transaction), then appends with the guard;
  the add's errors are answered as the verification's (INVALID_PRODUCER_EPOCH,
  INVALID_PRODUCER_ID_MAPPING, NOT_ENOUGH_REPLICAS while the last transaction is being
  ended). A batch of a newer epoch than the transaction ongoing on the partition begins the
  next one and is added first too.
- Idempotent producers (batches with a producer id): the leader checks epochs and sequences.
  A retried batch it already stored is answered with its original base offset and no error;
  OUT_OF_ORDER_SEQUENCE_NUMBER and INVALID_PRODUCER_EPOCH come back as the leader gives them.
- A partition is appended only at the broker that leads it: sent to another broker (the port
  the client used names it), it is NOT_LEADER_OR_FOLLOWER, as Kafka answers, so the client
  refreshes its metadata. Routing it to the leader anyway would reorder it against an earlier
  request refused at the old leader: the leader answers OUT_OF_ORDER_SEQUENCE_NUMBER, and
  librdkafka then bumps its epoch and sends again, under new sequence numbers, records whose
  outcome it did not know (duplicates).
- A leader that cannot be reached: NOT_LEADER_OR_FOLLOWER when nothing was appended (the client
  refreshes metadata and retries), REQUEST_TIMED_OUT when the append may have happened. For an
  idempotent batch there is no safe answer then: the append may still reach the leader after
  the client's next request for the partition, which would be refused
  OUT_OF_ORDER_SEQUENCE_NUMBER (librdkafka then renumbers its unknown records under a new
  epoch, storing them twice). The request fails instead (``RequestOutcomeUnknownError``) and
  the frontend closes the connection, so the client resends everything in flight in order
  under the same sequence numbers, and the leader recognises what it already stored.
- acks=-1: the write is acknowledged once the high watermark passes its last offset, i.e.
  every in-sync replica has it. A leader alone in its ISR commits at once (its append answers
  with the high watermark at the log end); a replicated leader holds its answer until its
  followers have the records, for up to ``acks_all_leader_wait_ms`` (never past the timeout),
  and answers them committed. Partitions whose high watermark is still short then park a
  DelayedProduce in the purgatory (all keys must reach their threshold; the leaders report
  their high watermarks to it) and whatever is still short when it expires gets
  REQUEST_TIMED_OUT; the leader's wait counts in the timeout. The keys carry the leader epoch
  of the append and the topic id (``<topic>-<partition>@<epoch>@<topic id>``): a leader
  elected meanwhile, whose log may lack the append, never completes the wait; the end of the
  epoch fails it with NOT_LEADER_OR_FOLLOWER, also when the wait is parked after the end was
  reported.
- min.insync.replicas (topic config, default 1), acks=-1 only, as Kafka's leader checks it:
  the leader refuses the append when the partition's ISR is smaller, NOT_ENOUGH_REPLICAS and
  nothing stored. The check is the leader's, in the step that appends: this handler's
  metadata may lag an ISR change, and two pipelined writes checked against two views (a
  refused one, then an accepted one skipping its sequence numbers) would make an idempotent
  client renumber records whose outcome it did not know. A partition whose ISR shrank below it
  while the produce waited gets NOT_ENOUGH_REPLICAS_AFTER_APPEND (the records are stored, but
  not acknowledged), judged as Kafka judges it when the wait for a partition is satisfied: by
  the ISR the leader had when its high watermark passed the records, which it answers with
  (``commit_isr``) or reports with the high watermark (a shrink that leaves the leader alone
  moves its high watermark at once, so a view of the ISR taken later, or elsewhere, could
  acknowledge records only the leader holds).
  Without that report (a leader alone when it appended: it answered with its high watermark
  already past them) this handler's metadata decides, if it is no older than the leader's
  state at the append.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kbroker.kafka.v1 import kafka_pb2 as k
from kbroker.log.v1 import log_pb2
from kbroker.purgatory.v1 import purgatory_pb2
from services.common.acls import Operation, ResourceType
from services.common.error_answers import error_response
from services.common.errors import ErrorCode, KafkaError, NotEnoughReplicasError, error_name
from services.common.file_records import (
    CARRIED_AFTER_REFUSAL_SECONDS,
    SpooledRecords,
    local_host_key,
    spool_reader,
)
from services.common.records.record_batch import (
    ATTRIBUTES_OFFSET,
    HEADER_SIZE,
    TRANSACTIONAL_BIT,
    read_header,
)

from ..collaborators import (
    CallError,
    LogNodes,
    OutcomeUnknownError,
    Purgatory,
    RequestOutcomeUnknownError,
)
from ..coordinator.placement import CoordinatorError
from ..metadata_cache import (
    LogNode,
    MetadataCache,
    MetadataUnavailableError,
)
from ..metrics import add_remote_time, parked
from ..request_context import RequestContext
from ..routing import Route, call_leaders, locate, replication_key
from ..transactions.coordinator import TransactionCoordinator
from ..transactions.metadata import TV_2

log = logging.getLogger(__name__)

VALID_ACKS = (0, 1, -1)
ACKS_ALL = -1
# An append is a local disk write; a leader that takes longer than this is in trouble.
APPEND_TIMEOUT_S = 30.0
INVALID_TXN_STATE = ErrorCode.invalid_txn_state.value
# The first Produce version whose clients know TRANSACTION_ABORTABLE.
TRANSACTION_ABORTABLE_VERSION = 11
# The first Produce version of transactions v2 (KIP-890 part 2): the partition is added to the
# transaction here, no AddPartitionsToTxn before.
TRANSACTIONS_V2_PRODUCE = 12
# Verification errors that only mean "not now": answered so that every client retries.
_VERIFICATION_UNAVAILABLE = frozenset(code.value for code in (
    ErrorCode.concurrent_transactions, ErrorCode.network_exception,
    ErrorCode.coordinator_load_in_progress, ErrorCode.coordinator_not_available,
    ErrorCode.not_coordinator))


PartitionResponse = k.ProduceResponse.PartitionProduceResponse


def _failed(index: int, error_code: int, error_message: str | None = None,
            record_errors: Sequence[Any] = ()) -> PartitionResponse:
    """A partition's answer when its records were not appended; ``record_errors`` (the log
    node's) name the records that made it fail (KIP-467)."""
    return PartitionResponse(
        index=index, error_code=error_code, error_message=error_message, base_offset=-1,
        log_append_time_ms=-1, log_start_offset=-1, record_errors=[
            k.ProduceResponse.BatchIndexAndErrorMessage(
                batch_index=e.batch_index, batch_index_error_message=e.message or None)
            for e in record_errors])


# What partitions are told when their leader's Append call failed, by the error it means.
_CALL_FAILURES = {
    ErrorCode.not_leader_or_follower.value: "the partition leader cannot be reached",
    ErrorCode.request_timed_out.value: "the partition leader did not answer in time",
    ErrorCode.unknown_server_error.value: "the append failed",
}


@dataclass(slots=True)
class _Slot:
    """One requested partition on its way through the request."""

    index: int
    name: str
    response: PartitionResponse | None = None
    appended: log_pb2.PartitionAppendResult | None = None
    route: Route | None = None
    # The batches, or where the frontend spooled them.
    records: bytes | memoryview | SpooledRecords = b""
    # The ISR size the leader must have to append (acks=-1's min.insync.replicas; 0: any).
    min_insync: int = 0
    # The guard to append with (0: none), and the one the leader asked to be verified.
    guard: int = 0
    unverified: int = 0
    # The last append failed after it may have happened.
    outcome_unknown: bool = False
    # The leader's ISR when its high watermark passed the records (acks=-1; None: not known).
    isr_at_commit: Sequence[int] | None = None


# Spooled batches the leader could not read, read here to be sent carried (such a leader, on
# another host, is then sent them carried at once for CARRIED_AFTER_REFUSAL_SECONDS).
_SPOOL = spool_reader()


def _head(records: bytes | memoryview | SpooledRecords) -> bytes | memoryview:
    """The batches, or as much of them as their first header (for spooled ones)."""
    return records.head if isinstance(records, SpooledRecords) else records


def _idempotent(records: bytes | memoryview | SpooledRecords) -> bool:
    """Whether the first batch has a producer id (sequence numbers)."""
    records = _head(records)
    return len(records) >= HEADER_SIZE and read_header(records).producer_id >= 0


def _transactional_producer(records: bytes | memoryview | SpooledRecords,
                            ) -> tuple[int, int] | None:
    """(producer id, epoch) of the first batch when it is transactional (one byte looked at
    for the others: this runs for every partition of every produce)."""
    records = _head(records)
    if len(records) < HEADER_SIZE or not records[ATTRIBUTES_OFFSET + 1] & TRANSACTIONAL_BIT:
        return None
    header = read_header(records)
    return (header.producer_id, header.producer_epoch) if header.is_transactional and (
        header.producer_id >= 0) else None


def _unspooled(slot: _Slot) -> log_pb2.PartitionAppendResult:
    """The answer for a partition of an append not made: its spooled batches were gone (the
    frontend gave the request up meanwhile)."""
    return log_pb2.PartitionAppendResult(
        topic=slot.name, partition=slot.index,
        error_code=ErrorCode.kafka_storage_error.value,
        error_message="the request's spooled record batches could not be read")


class ProduceApi:
    def __init__(self, cache: MetadataCache, log_nodes: LogNodes, purgatory: Purgatory,
                 transactions: TransactionCoordinator | None = None, *,
                 leader_wait_ms: int = 0) -> None:
        """``leader_wait_ms``: how long a leader may hold an acks=-1 append's answer for its
        high watermark to pass the records (AppendRequest.commit_wait_ms)."""
        self._cache = cache
        self._log_nodes = log_nodes
        self._purgatory = purgatory
        self._transactions = transactions
        self._leader_wait_ms = leader_wait_ms
        # Log node id -> until when (monotonic) it is sent spooled batches carried.
        self._spool_declined: dict[int, float] = {}

    async def handle(self, request: k.ProduceRequest,
                     context: RequestContext) -> k.ProduceResponse:
        if request.acks not in VALID_ACKS:
            return error_response(request, ErrorCode.invalid_required_acks.value)
        # Each partition's batches, in request order: beside the request when the frontend's
        # stream brought them so (views, never copied here), else read out of it once.
        records = context.record_payloads
        if records is None:
            records = [p.records for t in request.topic_data for p in t.partition_data]
        producers = {producer for batches in records
                     if batches is not None
                     and (producer := _transactional_producer(batches)) is not None}
        # A null transactional id may arrive as an empty string; neither names a transaction.
        if producers and (not request.transactional_id or context.access.check(
                Operation.WRITE, ResourceType.TRANSACTIONAL_ID, request.transactional_id)):
            return error_response(request,
                                  ErrorCode.transactional_id_authorization_failed.value)
        if len({producer_id for producer_id, _ in producers}) > 1:
            return error_response(request, ErrorCode.invalid_producer_id_mapping.value,
                                  "Transactional records contained more than one producer ID")
        try:
            metadata = await self._cache.current()
        except MetadataUnavailableError as exc:
            return error_response(request, ErrorCode.not_leader_or_follower.value, exc.message)

        slots: list[list[_Slot]] = []
        routed: list[_Slot] = []
        batches_of = iter(records)
        for topic in request.topic_data:
            info = metadata.topic(topic.name) if topic.name else metadata.topic_by_id(
                topic.topic_id)
            name = info.name if info else (topic.name or "")
            denied = context.access.check(Operation.WRITE, ResourceType.TOPIC, name) if (
                name) else 0
            row = []
            for p in topic.partition_data:
                batches = next(batches_of)
                slot = _Slot(p.index, name)
                row.append(slot)
                if denied:
                    slot.response = _failed(p.index, denied)
                    continue
                try:
                    # Only at the leader's broker: a request that reached the new leader
                    # behind one its old leader refused would skip that one's sequence
                    # numbers, and an idempotent client answered OUT_OF_ORDER_SEQUENCE_NUMBER
                    # bumps its epoch and sends again what may already be stored.
                    route = locate(metadata, info, p.index, broker_id=context.broker_id)
                except KafkaError as exc:
                    code = exc.errno
                    if info is None and not topic.name and topic.topic_id:
                        code = ErrorCode.unknown_topic_id.value
                    slot.response = _failed(p.index, code, exc.message)
                    continue
                if request.acks == ACKS_ALL:
                    slot.min_insync = route.topic.min_insync_replicas
                slot.route, slot.records = route, batches if batches is not None else b""
                routed.append(slot)
            slots.append(row)

        # acks=-1: the leaders answer once committed, if that comes within the wait; the
        # produce's timeout covers that wait and the purgatory's after it.
        commit_wait_ms = min(self._leader_wait_ms, max(request.timeout_ms, 0)) if (
            request.acks == ACKS_ALL) else 0
        waited = await self._append(routed, commit_wait_ms)
        unverified = [s for s in routed if s.unverified]
        if unverified:
            await self._verify(request, context, unverified)
            waited += await self._append([s for s in unverified if s.guard], commit_wait_ms)
        unknown = [s for s in routed if s.outcome_unknown and _idempotent(s.records)]
        if unknown:
            raise RequestOutcomeUnknownError(
                "the appends of idempotent batches to " + ", ".join(
                    f"{s.name}-{s.index}" for s in unknown) + " may or may not have happened")

        if request.acks == ACKS_ALL:
            appended = [s for row in slots for s in row if s.appended is not None]
            await self._await_high_watermarks(appended,
                                              request.timeout_ms - int(waited * 1000))
            self._check_insync_after_append(appended)

        response = k.ProduceResponse()
        for topic, row in zip(request.topic_data, slots, strict=True):
            answer = response.responses.add(partition_responses=[
                s.response or _success(s) for s in row])
            if topic.HasField("name"):
                answer.name = topic.name
            if topic.HasField("topic_id"):
                answer.topic_id = topic.topic_id
        return response

    async def _append(self, slots: list[_Slot], commit_wait_ms: int = 0) -> float:
        """Append each slot's records on its leader (one Append per node, concurrently), the
        leaders holding their answers up to ``commit_wait_ms`` for commits. Returns how long
        the longest of them held its answer, in seconds (counted as remote time)."""
        waits_us = [0]

        async def append_on(node: LogNode, items: list[_Slot]) -> Sequence[Any]:
            # The batches travel beside the request, as they came (no copy here), or stay
            # where the frontend spooled them for the leader to read.
            appends = log_pb2.AppendRequest(commit_wait_ms=commit_wait_ms, partitions=[
                log_pb2.PartitionAppend(topic=slot.name, partition=slot.index,
                                        verification_guard=slot.guard,
                                        min_insync_replicas=slot.min_insync)
                for slot in items])
            records = [slot.records for slot in items]
            if any(isinstance(batches, SpooledRecords) for batches in records):
                answer = await self._append_spooled(node, appends, records)
                if answer is None:
                    return [_unspooled(slot) for slot in items]
            else:
                answer = await self._log_nodes.append(node, appends, APPEND_TIMEOUT_S,
                                                      records=records)
            waits_us.append(answer.commit_wait_us)
            return answer.results

        routed = [(slot.route, slot) for slot in slots if slot.route is not None]
        for slot, code, detail in await call_leaders(routed, append_on, effect=True):
            slot.unverified = 0
            slot.outcome_unknown = isinstance(detail, OutcomeUnknownError)
            if not code:
                slot.appended = detail
                slot.response = None
            elif isinstance(detail, Exception):
                slot.response = _failed(slot.index, code, _CALL_FAILURES[code])
            elif detail is None:
                slot.response = _failed(slot.index, code,
                                        "the log node returned no result for this partition")
            else:
                slot.response = _failed(slot.index, code, detail.error_message or None,
                                        detail.record_errors)
                if code == INVALID_TXN_STATE and detail.verification_guard and not slot.guard:
                    slot.unverified = detail.verification_guard
        waited = max(waits_us) / 1e6
        add_remote_time(waited)
        return waited

    async def _append_spooled(self, node: LogNode, appends: log_pb2.AppendRequest,
                              records: Sequence[bytes | memoryview | SpooledRecords],
                              ) -> log_pb2.AppendResponse | None:
        """``appends`` naming the spooled batches for the leader to read, or, when it cannot
        (it is on another host; it then stored nothing), carrying them, read here. None when
        they cannot be read here either (the frontend gave the request up meanwhile). A leader
        that could not read them is sent them carried at once for
        :data:`~services.common.file_records.CARRIED_AFTER_REFUSAL_SECONDS`."""
        if time.monotonic() >= self._spool_declined.get(node.node_id, 0.0):
            appends.local_reader = local_host_key()
            for item, batches in zip(appends.partitions, records, strict=True):
                if isinstance(batches, SpooledRecords):
                    item.file_records.MergeFrom(log_pb2.FileRecords(
                        path=batches.path, inode=batches.inode, position=batches.position,
                        size=batches.size))
            try:
                answer = await self._log_nodes.append(node, appends, APPEND_TIMEOUT_S, records=[
                    None if isinstance(b, SpooledRecords) else b for b in records])
            except BaseException:
                # Unanswered: the leader may still read the ranges.
                for batches in records:
                    if isinstance(batches, SpooledRecords):
                        batches.reads.unsettled = True
                raise
            if not answer.records_unreadable:
                return answer
            self._spool_declined[node.node_id] = time.monotonic() + CARRIED_AFTER_REFUSAL_SECONDS
        carried = [_SPOOL.read(b.path, b.inode, b.position, b.size)
                   if isinstance(b, SpooledRecords) else b for b in records]
        if any(batches is None for batches in carried):
            return None
        appends.local_reader = ""
        for item in appends.partitions:
            item.ClearField("file_records")
        return await self._log_nodes.append(node, appends, APPEND_TIMEOUT_S, records=carried)

    async def _verify(self, request: k.ProduceRequest, context: RequestContext,
                      slots: list[_Slot]) -> None:
        """Ask the transaction coordinator about the partitions whose leaders want the
        transaction verified: a verified one gets its guard (to append again with), the
        others their answer. From v12 (transactions v2) the coordinator adds them to the
        transaction instead, beginning one if none is ongoing (Kafka's ``addPartition``
        operation of ``AddPartitionsToTxnManager``)."""
        coordinator = self._transactions
        add = context.api_version is not None and context.api_version >= TRANSACTIONS_V2_PRODUCE
        by_producer: dict[tuple[int, int], list[_Slot]] = {}
        for slot in slots:
            producer = _transactional_producer(slot.records)
            if producer is not None and coordinator is not None:
                by_producer.setdefault(producer, []).append(slot)
        for (producer_id, epoch), waiting in by_producer.items():
            assert coordinator is not None
            partitions = frozenset((s.name, s.index) for s in waiting)
            try:
                if add:
                    errors = dict.fromkeys(partitions, await coordinator.add_partitions(
                        request.transactional_id, producer_id, epoch, partitions, TV_2))
                else:
                    errors = await coordinator.verify(request.transactional_id, producer_id,
                                                      epoch, partitions)
            except CoordinatorError as exc:
                errors = dict.fromkeys(partitions, exc.code)
            for slot in waiting:
                error = errors.get((slot.name, slot.index), 0)
                if not error:
                    slot.guard = slot.unverified
                else:
                    slot.response = _unverified(slot.index, error, context)

    def _check_insync_after_append(self, slots: list[_Slot]) -> None:
        """Kafka's check when a DelayedProduce's partition is satisfied: the ISR must still
        satisfy min.insync.replicas, or the write is not acknowledged. The ISR is the one the
        leader reported with the high watermark that satisfied the wait; without one, this
        handler's metadata, only when it is not older than the leader's state at the append
        (its version at least the partition epoch the leader answered with): an older view
        knows less of the ISR than the leader's own check did."""
        metadata = self._cache.snapshot
        for slot in slots:
            if slot.response is not None:
                continue
            isr, required = slot.isr_at_commit, slot.min_insync
            if not isr:
                topic = metadata.topic(slot.name) if metadata is not None else None
                partition = topic.partitions.get(slot.index) if topic is not None else None
                if metadata is None or topic is None or partition is None:
                    continue
                assert slot.appended is not None
                if metadata.version < slot.appended.partition_epoch:
                    continue
                isr, required = partition.isr, topic.min_insync_replicas
            if len(isr) < required:
                refused = NotEnoughReplicasError(isr, required, slot.name, slot.index,
                                                 ErrorCode.not_enough_replicas_after_append)
                slot.response = _failed(slot.index, refused.errno, refused.message)

    async def _await_high_watermarks(self, slots: list[_Slot], timeout_ms: int) -> None:
        """Hold acks=-1 answers until each partition's high watermark passes the appended
        batches (log end right after the append = last offset + 1): Kafka's DelayedProduce,
        for the partitions whose leaders did not answer them committed."""
        pending = {}
        for slot in slots:
            assert slot.appended is not None
            if slot.appended.high_watermark < slot.appended.log_end_offset:
                pending[replication_key(slot.name, slot.index, slot.appended.leader_epoch,
                                        slot.appended.topic_id)] = slot
            elif slot.appended.commit_isr:
                slot.isr_at_commit = tuple(slot.appended.commit_isr)
        if not pending:
            return
        thresholds = {key: s.appended.log_end_offset for key, s in pending.items()
                      if s.appended is not None}
        try:
            with parked():
                outcome = await self._purgatory.wait(
                    purgatory_pb2.OPERATION_KIND_PRODUCE, thresholds, require_all=True,
                    timeout_ms=max(timeout_ms, 0))
            states = {state.key: state for state in outcome.keys}
        except CallError as exc:  # a purgatory outage is logged once, by its client
            log.debug("awaiting replication failed: %s", exc)
            states = {}
        for key, slot in pending.items():
            state = states.get(key)
            if state is not None and state.error_code:
                slot.response = _failed(slot.index, state.error_code)
            elif state is None or state.position < thresholds[key]:
                slot.response = _failed(slot.index, ErrorCode.request_timed_out.value)
            elif state.isr:
                slot.isr_at_commit = tuple(state.isr)


def _success(slot: _Slot) -> PartitionResponse:
    result = slot.appended
    assert result is not None
    return PartitionResponse(index=slot.index, base_offset=result.base_offset,
                             log_append_time_ms=result.log_append_time_ms,
                             log_start_offset=result.log_start_offset)


def _unverified(index: int, error: int, context: RequestContext) -> PartitionResponse:
    """A partition's answer when the coordinator did not confirm it is in the transaction
    (Kafka's ``AddPartitionsToTxnManager`` and ``ReplicaManager`` mappings)."""
    if error == ErrorCode.producer_fenced.value:
        return _failed(index, ErrorCode.invalid_producer_epoch.value)
    if error == ErrorCode.transaction_abortable.value and (
            context.api_version is None or context.api_version >= TRANSACTION_ABORTABLE_VERSION):
        return _failed(index, error)
    if error in (ErrorCode.transaction_abortable.value, INVALID_TXN_STATE):
        return _failed(index, INVALID_TXN_STATE, "Partition was not added to the transaction")
    if error in _VERIFICATION_UNAVAILABLE:
        return _failed(index, ErrorCode.not_enough_replicas.value,
                       "Unable to verify the partition has been added to the transaction. "
                       f"Underlying error: {error_name(error)}")
    return _failed(index, error)

