"""The transaction APIs clients and admin tools send to a transaction coordinator (Kafka's
``KafkaApis`` handlers of AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, DescribeTransactions and
ListTransactions), over the :class:`~..transactions.coordinator.TransactionCoordinator`, on the
generated messages of ``kbroker.kafka.v1``.

    AddPartitionsToTxn Request => v3_and_below_transactional_id v3_and_below_producer_id
                                  v3_and_below_producer_epoch [v3_and_below_topics]  (v0-3)
                                  [transactions => transactional_id producer_id
                                   producer_epoch verify_only [topics => name [partitions]]]
                                                                                     (v4+)
    AddPartitionsToTxn Response => [results_by_topic_v3_and_below => name
                                    [results_by_partition => partition_index
                                     partition_error_code]]                          (v0-3)
                                   error_code [results_by_transaction => transactional_id
                                   [topic_results]]                                  (v4+)
    AddOffsetsToTxn Request => transactional_id producer_id producer_epoch group_id
    AddOffsetsToTxn Response => error_code
    EndTxn Request => transactional_id producer_id producer_epoch committed
    EndTxn Response => error_code producer_id producer_epoch                  (ids from v5)
    DescribeTransactions Request => [transactional_ids]
    DescribeTransactions Response => [transaction_states => error_code transactional_id
                                      transaction_state transaction_timeout_ms
                                      transaction_start_time_ms producer_id producer_epoch
                                      [topics => topic [partitions]]]
    ListTransactions Request => [state_filters] [producer_id_filters] duration_filter (v1+)
    ListTransactions Response => error_code [unknown_state_filters]
                                 [transaction_states => transactional_id producer_id
                                  transaction_state]

Answers as Kafka's broker gives them for each client version (the version is
``context.api_version``; unknown counts as the newest, or, for the shape, as whichever
spelling the request uses):

- the request must reach the coordinator of its transactional id (NOT_COORDINATOR, or the
  reason the id's partition cannot be served: COORDINATOR_NOT_AVAILABLE,
  COORDINATOR_LOAD_IN_PROGRESS);
- PRODUCER_FENCED is INVALID_PRODUCER_EPOCH for clients older than the version that knows it
  (AddPartitionsToTxn, AddOffsetsToTxn and EndTxn before v2);
- AddPartitionsToTxn: a partition the cluster does not have is UNKNOWN_TOPIC_OR_PARTITION, one
  of an internal topic TOPIC_AUTHORIZATION_FAILED from a client (before v4: only brokers may
  name them, as Kafka's authorisation has it), and the transaction's other partitions
  OPERATION_NOT_ATTEMPTED (nothing is added); otherwise one error for all of them. From v4 a
  request carries several transactions; ``verify_only`` asks
  whether the partitions are in the transaction (NONE, or TRANSACTION_ABORTABLE) without
  adding them (what a partition leader asks before it stores a transaction's first batch);
- AddOffsetsToTxn adds the group's ``__consumer_offsets`` partition to the transaction;
- EndTxn before v5 is a transaction of the original protocol; v5 is transactions v2 (KIP-890):
  the epoch is bumped at every commit or abort and the answer carries the producer id and
  epoch to continue with. The answer comes once the prepared state is written; markers follow;
- authorization (Kafka's): AddPartitionsToTxn before v4 (from clients) needs WRITE on the
  transactional id (TRANSACTIONAL_ID_AUTHORIZATION_FAILED for every partition) and WRITE on
  each topic (TOPIC_AUTHORIZATION_FAILED, the others OPERATION_NOT_ATTEMPTED), from v4 (from
  brokers) CLUSTER_ACTION on the cluster (CLUSTER_AUTHORIZATION_FAILED); AddOffsetsToTxn WRITE
  on the transactional id and READ on the group; EndTxn WRITE on the transactional id;
  DescribeTransactions DESCRIBE on each id (and shows only the topics the principal may
  DESCRIBE); ListTransactions lists only the ids the principal may DESCRIBE;
- DescribeTransactions and ListTransactions report the transactions of the partitions the
  receiving broker leads (each broker its own: admin clients ask them all);
  TRANSACTIONAL_ID_NOT_FOUND for an id it has none for. ListTransactions v1 filters out
  transactions that started less than ``duration_filter`` ms ago (none without: -1).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from kbroker.kafka.v1 import kafka_pb2 as k
from services.common.acls import Operation, ResourceType
from services.common.errors import ErrorCode

from ..coordinator.placement import CoordinatorError
from ..groups.coordinator import GroupCoordinator
from ..metadata_cache import ClusterMetadata, MetadataCache, MetadataUnavailableError
from ..request_context import RequestContext
from ..transactions.coordinator import TransactionCoordinator
from ..transactions.metadata import (
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    STATES_BY_NAME,
    TV_0,
    TV_2,
    TopicPartition,
    TxnState,
)
from .groups import newer_shape

NONE = 0
PRODUCER_FENCED = ErrorCode.producer_fenced.value
INVALID_PRODUCER_EPOCH = ErrorCode.invalid_producer_epoch.value
UNKNOWN_TOPIC_OR_PARTITION = ErrorCode.unknown_topic_or_partition.value
TOPIC_AUTHORIZATION_FAILED = ErrorCode.topic_authorization_failed.value
OPERATION_NOT_ATTEMPTED = ErrorCode.operation_not_attempted.value
# The first EndTxn version of transactions v2.
TRANSACTIONS_V2_END_TXN = 5

T = TypeVar("T")

TopicResult = k.AddPartitionsToTxnResponse.AddPartitionsToTxnTopicResult
TransactionResult = k.AddPartitionsToTxnResponse.AddPartitionsToTxnResult
DescribedTransaction = k.DescribeTransactionsResponse.TransactionState
ListedTransaction = k.ListTransactionsResponse.TransactionState


def fenced_as_of(error: int, context: RequestContext, version: int) -> int:
    """PRODUCER_FENCED as clients before ``version`` know it: INVALID_PRODUCER_EPOCH."""
    if error == PRODUCER_FENCED and context.api_version is not None and \
            context.api_version < version:
        return INVALID_PRODUCER_EPOCH
    return error


class TransactionApi:
    """An API served by the transaction coordinator, with its coordinator check."""

    def __init__(self, coordinator: TransactionCoordinator) -> None:
        self._coordinator = coordinator

    async def _serve(self, transactional_id: str, context: RequestContext,
                     operation: Callable[[], Awaitable[T]]) -> tuple[int, T | None]:
        """(0, what ``operation()`` gives) if this broker coordinates ``transactional_id``
        and the operation can be done; else (the error to answer, None)."""
        code = await self._coordinator.placement.not_coordinator(transactional_id,
                                                                 context.broker_id)
        if code:
            return code, None
        try:
            return 0, await operation()
        except CoordinatorError as exc:
            return exc.code, None


# --- AddPartitionsToTxn ----------------------------------------------------------------------


class AddPartitionsToTxnApi(TransactionApi):
    def __init__(self, cache: MetadataCache, coordinator: TransactionCoordinator) -> None:
        super().__init__(coordinator)
        self._cache = cache

    async def handle(self, request: k.AddPartitionsToTxnRequest,
                     context: RequestContext) -> k.AddPartitionsToTxnResponse:
        try:
            metadata: ClusterMetadata | None = await self._cache.current()
        except MetadataUnavailableError:
            metadata = None
        if newer_shape(context, 4, bool(request.transactions)):
            denied = context.access.check(Operation.CLUSTER_ACTION, ResourceType.CLUSTER)
            if denied:
                return k.AddPartitionsToTxnResponse(error_code=denied)
            return k.AddPartitionsToTxnResponse(error_code=0, results_by_transaction=[
                TransactionResult(transactional_id=t.transactional_id,
                                  topic_results=await self._add(
                                      t.transactional_id, t.producer_id, t.producer_epoch,
                                      t.verify_only, t.topics, metadata, context, False))
                for t in request.transactions])
        # Before v4 one transaction, named at the top level (added, never only verified), by a
        # client.
        return k.AddPartitionsToTxnResponse(results_by_topic_v3_and_below=await self._add(
            request.v3_and_below_transactional_id, request.v3_and_below_producer_id,
            request.v3_and_below_producer_epoch, False, request.v3_and_below_topics,
            metadata, context, True))

    async def _add(self, transactional_id: str, producer_id: int, epoch: int, verify_only: bool,
                   topics: Any, metadata: ClusterMetadata | None, context: RequestContext,
                   from_client: bool) -> list[TopicResult]:
        wanted = [(t.name, p) for t in topics for p in t.partitions]
        access = context.access
        if from_client:
            denied = access.check(Operation.WRITE, ResourceType.TRANSACTIONAL_ID,
                                  transactional_id)
            if denied:
                return _by_topic(dict.fromkeys(wanted, denied))
        refused = {tp: TOPIC_AUTHORIZATION_FAILED for tp in wanted if from_client and (
            _internal(metadata, tp[0])
            or not access.allows(Operation.WRITE, ResourceType.TOPIC, tp[0]))}
        refused.update({tp: UNKNOWN_TOPIC_OR_PARTITION for tp in wanted
                        if tp not in refused and not _exists(metadata, tp)})
        errors: dict[TopicPartition, int]
        if refused:
            errors = {tp: refused.get(tp, OPERATION_NOT_ATTEMPTED) for tp in wanted}
        elif verify_only:
            code, verified = await self._serve(transactional_id, context, lambda: (
                self._coordinator.verify(transactional_id, producer_id, epoch,
                                         frozenset(wanted))))
            errors = verified if verified is not None else dict.fromkeys(wanted, code)
        else:
            code, added = await self._serve(transactional_id, context, lambda: (
                self._coordinator.add_partitions(transactional_id, producer_id, epoch,
                                                 frozenset(wanted))))
            errors = dict.fromkeys(wanted, fenced_as_of(code or added or 0, context, 2))
        return _by_topic({tp: errors[tp] for tp in wanted})


def _by_topic(errors: dict[TopicPartition, int]) -> list[TopicResult]:
    """Each partition's error, grouped by topic (in the order given)."""
    by_topic: dict[str, dict[int, int]] = {}
    for (name, partition), error in errors.items():
        by_topic.setdefault(name, {})[partition] = error
    return [TopicResult(name=name, results_by_partition=[
        {"partition_index": p, "partition_error_code": error}
        for p, error in partitions.items()]) for name, partitions in by_topic.items()]


def _internal(metadata: ClusterMetadata | None, name: str) -> bool:
    topic = metadata.topic(name) if metadata is not None else None
    return topic is not None and topic.internal


def _exists(metadata: ClusterMetadata | None, tp: TopicPartition) -> bool:
    topic = metadata.topic(tp[0]) if metadata is not None else None
    return topic is not None and tp[1] in topic.partitions


# --- AddOffsetsToTxn -------------------------------------------------------------------------


class AddOffsetsToTxnApi(TransactionApi):
    """The group's offsets partition joins the transaction (Kafka's ``partitionFor(groupId)``
    of the group coordinator: by the partitions ``__consumer_offsets`` has, or will be created
    with)."""

    def __init__(self, coordinator: TransactionCoordinator, groups: GroupCoordinator) -> None:
        super().__init__(coordinator)
        self._groups = groups

    async def handle(self, request: k.AddOffsetsToTxnRequest,
                     context: RequestContext) -> k.AddOffsetsToTxnResponse:
        tid = request.transactional_id
        denied = context.access.check(Operation.WRITE, ResourceType.TRANSACTIONAL_ID, tid) or \
            context.access.check(Operation.READ, ResourceType.GROUP, request.group_id)
        if denied:
            return k.AddOffsetsToTxnResponse(error_code=denied)

        async def add() -> int:
            partition = await self._groups.offsets_partition(request.group_id)
            return await self._coordinator.add_partitions(
                tid, request.producer_id, request.producer_epoch, frozenset({partition}))

        code, error = await self._serve(tid, context, add)
        return k.AddOffsetsToTxnResponse(error_code=fenced_as_of(code or error or 0, context, 2))


# --- EndTxn ----------------------------------------------------------------------------------


class EndTxnApi(TransactionApi):
    async def handle(self, request: k.EndTxnRequest, context: RequestContext) -> k.EndTxnResponse:
        tid = request.transactional_id
        denied = context.access.check(Operation.WRITE, ResourceType.TRANSACTIONAL_ID, tid)
        if denied:
            return k.EndTxnResponse(error_code=denied, producer_id=NO_PRODUCER_ID,
                                    producer_epoch=NO_PRODUCER_EPOCH)
        version = TV_2 if newer_shape(context, TRANSACTIONS_V2_END_TXN, False) else TV_0
        code, decision = await self._serve(tid, context, lambda: (
            self._coordinator.end_transaction(tid, request.producer_id, request.producer_epoch,
                                              request.committed, version)))
        if decision is None or decision.error:
            error = code or (decision.error if decision is not None else 0)
            return k.EndTxnResponse(error_code=fenced_as_of(error, context, 2),
                                    producer_id=NO_PRODUCER_ID, producer_epoch=NO_PRODUCER_EPOCH)
        return k.EndTxnResponse(error_code=0, producer_id=decision.producer_id,
                                producer_epoch=decision.producer_epoch)


# --- DescribeTransactions, ListTransactions --------------------------------------------------


class DescribeTransactionsApi(TransactionApi):
    async def handle(self, request: k.DescribeTransactionsRequest,
                     context: RequestContext) -> k.DescribeTransactionsResponse:
        response = k.DescribeTransactionsResponse()
        access = context.access
        for tid in request.transactional_ids:
            denied = access.check(Operation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, tid)
            if denied:
                response.transaction_states.add(transactional_id=tid, error_code=denied)
                continue
            code, described = await self._serve(tid, context, lambda tid=tid: (  # type: ignore[misc]
                self._coordinator.describe(tid)))
            error, meta = described if described is not None else (code, None)
            if error or meta is None:
                response.transaction_states.add(transactional_id=tid, error_code=error)
                continue
            topics: dict[str, list[int]] = {}
            for topic, partition in sorted(meta.partitions):
                if access.allows(Operation.DESCRIBE, ResourceType.TOPIC, topic):
                    topics.setdefault(topic, []).append(partition)
            response.transaction_states.append(DescribedTransaction(
                error_code=0, transactional_id=tid, transaction_state=meta.state.kafka_name,
                transaction_timeout_ms=meta.timeout_ms, transaction_start_time_ms=meta.start_ms,
                producer_id=meta.producer_id, producer_epoch=meta.producer_epoch,
                topics=[{"topic": t, "partitions": ps} for t, ps in topics.items()]))
        return response


class ListTransactionsApi(TransactionApi):
    async def handle(self, request: k.ListTransactionsRequest,
                     context: RequestContext) -> k.ListTransactionsResponse:
        states: set[TxnState] = set()
        unknown: list[str] = []
        for name in request.state_filters:
            state = STATES_BY_NAME.get(name)
            if state is None:
                unknown.append(name)
            else:
                states.add(state)
        producers = set(request.producer_id_filters)
        duration = request.duration_filter if request.HasField("duration_filter") else -1
        try:
            listed = await self._coordinator.list_transactions(context.broker_id)
        except CoordinatorError as exc:
            return k.ListTransactionsResponse(error_code=exc.code)
        now = self._coordinator.now()
        return k.ListTransactionsResponse(error_code=0, unknown_state_filters=unknown,
                                          transaction_states=[
            ListedTransaction(transactional_id=m.transactional_id, producer_id=m.producer_id,
                              transaction_state=m.state.kafka_name)
            for m in listed
            if (not producers or m.producer_id in producers)
            and (not request.state_filters or m.state in states)
            and not (duration >= 0 and now - m.start_ms <= duration)
            and context.access.allows(Operation.DESCRIBE, ResourceType.TRANSACTIONAL_ID,
                                      m.transactional_id)])
