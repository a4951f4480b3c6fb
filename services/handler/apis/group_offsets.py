"""Committed offsets of groups (Kafka's ``KafkaApis`` handlers of OffsetCommit, OffsetFetch,
OffsetDelete and TxnOffsetCommit), over the :class:`~..groups.coordinator.GroupCoordinator`, on
the generated messages of ``kbroker.kafka.v1``.

    OffsetCommit Request => group_id generation_id_or_member_epoch member_id group_instance_id
                            retention_time_ms [topics => name [partitions => partition_index
                            committed_offset committed_leader_epoch committed_metadata]]
    OffsetCommit Response => [topics => name [partitions => partition_index error_code]]
    OffsetFetch Request => group_id [topics => name [partition_indexes]] require_stable
                           [groups => group_id member_id member_epoch [topics]]   (groups v8+)
    OffsetFetch Response => error_code [topics => name [partitions => partition_index
                            committed_offset committed_leader_epoch metadata error_code]]
                            [groups => group_id error_code [topics]]              (groups v8+)
    OffsetDelete Request => group_id [topics => name [partitions => partition_index]]
    OffsetDelete Response => error_code [topics => name [partitions => partition_index
                             error_code]]
    TxnOffsetCommit Request => transactional_id group_id producer_id producer_epoch
                               generation_id member_id group_instance_id (v3+)
                               [topics => name [partitions => partition_index
                               committed_offset committed_leader_epoch committed_metadata]]
    TxnOffsetCommit Response => [topics => name [partitions => partition_index error_code]]

OffsetCommit checks each partition first: an unknown topic or partition is
UNKNOWN_TOPIC_OR_PARTITION, metadata over ``offset.metadata.max.bytes`` is
OFFSET_METADATA_TOO_LARGE; the rest is committed in one write, all or nothing, after the
group's checks (generation, member) on fresh state. A retention time (v2-v4) becomes the
value's expire timestamp. OffsetFetch before v8 names one group at the top level and is
answered there, from v8 any number in ``groups`` (by the client's version, or, when unknown,
by the spelling the request uses); it answers -1 (no offset) for partitions without a commit,
a null topic list asks for every committed partition, and before v2 a group error is given in
every partition. With ``require_stable`` (v7+) a partition that has offsets pending in an open
transaction is UNSTABLE_OFFSET_COMMIT (offset -1), so the consumer retries until the
transaction ends. While the group's partition cannot be read here (its leader failing, moving
or being reloaded by this handler) OffsetFetch answers COORDINATOR_LOAD_IN_PROGRESS: the group
is being loaded, and that is the one coordinator error every client retries in place.
librdkafka does not retry an OffsetFetch answered NOT_COORDINATOR or
COORDINATOR_NOT_AVAILABLE, and the partitions it asked about are then never fetched until the
next rebalance; NOT_COORDINATOR stays the answer at a broker that does not coordinate the group.

TxnOffsetCommit stores offsets in the producer's transaction (they count once it commits, see
:mod:`..groups.state`), checked as OffsetCommit's are (unknown partitions, metadata size; a
member, and from v3 its generation, as Kafka's ``validateOffsetCommit`` for transactional
commits), after the transaction coordinator confirmed the offsets partition is in the
producer's transaction (AddOffsetsToTxn added it): TRANSACTION_ABORTABLE when it is not
(INVALID_TXN_STATE before v4), INVALID_PRODUCER_EPOCH for a fenced producer,
INVALID_PRODUCER_ID_MAPPING, CONCURRENT_TRANSACTIONS while it is being ended. From v5
(transactions v2, KIP-890) the offsets partition is added to the transaction instead (its
first TxnOffsetCommit begins one), with the same errors for a producer that cannot add it. Before v2
COORDINATOR_LOAD_IN_PROGRESS is COORDINATOR_NOT_AVAILABLE (clients of that age do not retry
it).

Authorization (Kafka's): OffsetCommit needs READ on the group (else GROUP_AUTHORIZATION_FAILED
for everything) and READ on each topic (else TOPIC_AUTHORIZATION_FAILED for its partitions,
before any other check); OffsetFetch DESCRIBE on each group (GROUP_AUTHORIZATION_FAILED for
it) and DESCRIBE on the topics: those asked for are TOPIC_AUTHORIZATION_FAILED, and a fetch of
every committed offset leaves them out; TxnOffsetCommit WRITE on the transactional id
(TRANSACTIONAL_ID_AUTHORIZATION_FAILED), READ on the group and on each topic as OffsetCommit;
OffsetDelete DELETE on the group and READ on each topic.

OffsetCommit v9 and OffsetFetch v9 are the versions KIP-848 consumers use. For a classic group
Kafka serves them as v8: the commit's ``generation_id_or_member_epoch`` is the generation, and
OffsetFetch's ``member_id`` and ``member_epoch`` are not checked. For a consumer group the
commit's epoch and the fetch's member and epoch are the member's (see
:mod:`..groups.offsets`: UNKNOWN_MEMBER_ID, STALE_MEMBER_EPOCH, and UNSUPPORTED_VERSION for a
consumer protocol member committing below v9); a fetch refused so is refused for the group.
"""

from __future__ import annotations

from typing import Any

from kbroker.kafka.v1 import kafka_pb2 as k
from services.common.acls import Operation, ResourceType
from services.common.error_answers import error_response
from services.common.errors import ErrorCode

from ..coordinator.placement import CoordinatorError
from ..groups.consumer_config import GroupError
from ..groups.coordinator import GroupCoordinator
from ..groups.group import INVALID_GROUP_ID
from ..groups.state import CommittedOffset, TopicPartition
from ..metadata_cache import ClusterMetadata, MetadataCache, MetadataUnavailableError
from ..request_context import RequestContext
from ..transactions.coordinator import TransactionCoordinator
from ..transactions.metadata import TV_2
from .groups import GroupApi, newer_shape, optional

UNKNOWN_TOPIC_OR_PARTITION = ErrorCode.unknown_topic_or_partition.value
TOPIC_AUTHORIZATION_FAILED = ErrorCode.topic_authorization_failed.value
OFFSET_METADATA_TOO_LARGE = ErrorCode.offset_metadata_too_large.value
UNSTABLE_OFFSET_COMMIT = ErrorCode.unstable_offset_commit.value
PRODUCER_FENCED = ErrorCode.producer_fenced.value
INVALID_PRODUCER_EPOCH = ErrorCode.invalid_producer_epoch.value
TRANSACTION_ABORTABLE = ErrorCode.transaction_abortable.value
INVALID_TXN_STATE = ErrorCode.invalid_txn_state.value
COORDINATOR_LOAD_IN_PROGRESS = ErrorCode.coordinator_load_in_progress.value
COORDINATOR_NOT_AVAILABLE = ErrorCode.coordinator_not_available.value
NO_OFFSET = -1
# The first TxnOffsetCommit version whose clients know TRANSACTION_ABORTABLE.
TRANSACTION_ABORTABLE_VERSION = 4
# The first TxnOffsetCommit version of transactions v2 (KIP-890 part 2): the offsets partition
# is added to the transaction here, no AddOffsetsToTxn before.
TRANSACTIONS_V2_TXN_OFFSET_COMMIT = 5

FetchGroup = k.OffsetFetchRequest.OffsetFetchRequestGroup


class _OffsetsApi(GroupApi):
    def __init__(self, cache: MetadataCache, coordinator: GroupCoordinator) -> None:
        super().__init__(coordinator)
        self._cache = cache

    async def _metadata(self) -> ClusterMetadata | None:
        try:
            return await self._cache.current()
        except MetadataUnavailableError:
            return None

    async def _checked(self, topics: Any, now: int, expire: int, context: RequestContext
                       ) -> tuple[dict[TopicPartition, int], dict[TopicPartition, CommittedOffset]]:
        """The offsets of a commit's ``topics`` split into (errors, valid offsets): topics
        the principal may not READ, unknown partitions and metadata over
        offset.metadata.max.bytes are errors."""
        metadata = await self._metadata()
        limit = self._coordinator.offset_metadata_max_bytes
        errors: dict[TopicPartition, int] = {}
        valid: dict[TopicPartition, CommittedOffset] = {}
        for topic in topics:
            denied = context.access.check(Operation.READ, ResourceType.TOPIC, topic.name)
            for p in topic.partitions:
                tp = (topic.name, p.partition_index)
                if denied:
                    errors[tp] = denied
                elif not _known(metadata, tp):
                    errors[tp] = UNKNOWN_TOPIC_OR_PARTITION
                elif len(p.committed_metadata.encode()) > limit:
                    errors[tp] = OFFSET_METADATA_TOO_LARGE
                else:
                    valid[tp] = CommittedOffset(
                        offset=p.committed_offset, leader_epoch=p.committed_leader_epoch,
                        metadata=p.committed_metadata, commit_timestamp=now,
                        expire_timestamp=expire)
        return errors, valid


def _known(metadata: ClusterMetadata | None, tp: TopicPartition) -> bool:
    topic = metadata.topic(tp[0]) if metadata is not None else None
    return topic is not None and tp[1] in topic.partitions


class OffsetCommitApi(_OffsetsApi):
    async def handle(self, request: k.OffsetCommitRequest,
                     context: RequestContext) -> k.OffsetCommitResponse:
        denied = context.access.check(Operation.READ, ResourceType.GROUP, request.group_id)
        if denied:
            return error_response(request, denied)  # type: ignore[return-value]
        now = self._coordinator.now()
        expire = now + request.retention_time_ms if request.retention_time_ms >= 0 else -1
        errors, valid = await self._checked(request.topics, now, expire, context)
        if valid or not errors:
            code = await self._not_coordinator(request.group_id, context)
            if code:
                return error_response(request, code)  # type: ignore[return-value]
            try:
                code = await self._coordinator.offsets.commit(
                    request.group_id, request.member_id, optional(request, "group_instance_id"),
                    request.generation_id_or_member_epoch, valid, context.api_version)
            except CoordinatorError as exc:
                code = exc.code
            if code == INVALID_GROUP_ID:
                return error_response(request, code)  # type: ignore[return-value]
            errors.update(dict.fromkeys(valid, code))
        return k.OffsetCommitResponse(topics=[
            {"name": t.name, "partitions": [
                {"partition_index": p.partition_index,
                 "error_code": errors[(t.name, p.partition_index)]} for p in t.partitions]}
            for t in request.topics])


class OffsetFetchApi(GroupApi):
    async def handle(self, request: k.OffsetFetchRequest,
                     context: RequestContext) -> k.OffsetFetchResponse:
        # Before v2 there is no top-level error: the group's error goes into every partition.
        in_partitions = context.api_version is None or context.api_version < 2
        stable = request.require_stable
        if newer_shape(context, 8, bool(request.groups)):
            return k.OffsetFetchResponse(groups=[
                await self._fetch(group, context, in_partitions, stable)
                for group in request.groups])
        # Before v8 one group, named and answered at the top level.
        single = await self._fetch(request, context, in_partitions, stable)
        return k.OffsetFetchResponse(error_code=single["error_code"], topics=single["topics"])

    async def _fetch(self, group: FetchGroup | k.OffsetFetchRequest, context: RequestContext,
                     in_partitions: bool, stable: bool) -> dict[str, Any]:
        """One group's answer, as the fields of either shape's group (before v8 the request
        names its one group with the same fields as a group of v8)."""
        access = context.access
        code = access.check(Operation.DESCRIBE, ResourceType.GROUP, group.group_id)
        if code:
            return {"group_id": group.group_id, "error_code": code,
                    "topics": [] if group.topics_is_null or not in_partitions else [
                        _topic(t.name, [(p, None, code if in_partitions else 0)
                                        for p in t.partition_indexes]) for t in group.topics]}
        refused = access.denied(Operation.DESCRIBE, ResourceType.TOPIC,
                                (t.name for t in group.topics))
        wanted = None if group.topics_is_null else [
            (t.name, p) for t in group.topics if t.name not in refused
            for p in t.partition_indexes]
        code, fetched = await self._not_coordinator(group.group_id, context), None
        if not code:
            member_id = getattr(group, "member_id", "") or None
            member_epoch = getattr(group, "member_epoch", -1) if isinstance(group, FetchGroup) \
                else -1
            # A consumer group's member names itself and its epoch (v9); others do not.
            member = {"member_id": member_id, "member_epoch": member_epoch} \
                if member_id or member_epoch >= 0 else {}
            try:
                fetched = await self._coordinator.offsets.fetch(group.group_id, wanted,
                                                                **member)
            except CoordinatorError:
                code = COORDINATOR_LOAD_IN_PROGRESS
            except GroupError as exc:
                code = exc.code
        if code or fetched is None:
            return {"group_id": group.group_id, "error_code": code, "topics": [] if wanted is None
                    else [_topic(t.name, [(p, None, code if in_partitions else 0)
                                          for p in t.partition_indexes]) for t in group.topics]}
        committed, pending = fetched
        by_topic: dict[str, list[tuple[int, CommittedOffset | None, int]]] = {}
        for t in group.topics:
            if t.name in refused:
                by_topic[t.name] = [(p, None, TOPIC_AUTHORIZATION_FAILED)
                                    for p in t.partition_indexes]
        for (name, partition), offset in committed.items():
            if wanted is None and not access.allows(Operation.DESCRIBE, ResourceType.TOPIC,
                                                    name):
                continue
            if stable and (name, partition) in pending:
                by_topic.setdefault(name, []).append((partition, None, UNSTABLE_OFFSET_COMMIT))
            else:
                by_topic.setdefault(name, []).append((partition, offset, 0))
        if wanted is None:
            topics = [_topic(name, sorted(by_topic[name], key=lambda p: p[0]))
                      for name in sorted(by_topic)]
        else:
            topics = [_topic(t.name, by_topic.get(t.name, [])) for t in group.topics]
        return {"group_id": group.group_id, "error_code": 0, "topics": topics}


class TxnOffsetCommitApi(_OffsetsApi):
    def __init__(self, cache: MetadataCache, coordinator: GroupCoordinator,
                 transactions: TransactionCoordinator | None = None) -> None:
        super().__init__(cache, coordinator)
        self._transactions = transactions

    async def handle(self, request: k.TxnOffsetCommitRequest,
                     context: RequestContext) -> k.TxnOffsetCommitResponse:
        denied = context.access.check(
            Operation.WRITE, ResourceType.TRANSACTIONAL_ID, request.transactional_id
        ) or context.access.check(Operation.READ, ResourceType.GROUP, request.group_id)
        if denied:
            return error_response(request, denied)  # type: ignore[return-value]
        errors, valid = await self._checked(request.topics, self._coordinator.now(), -1, context)
        if valid:
            code = INVALID_GROUP_ID if not request.group_id else \
                await self._coordinator.placement.not_coordinator(
                    request.group_id, context.broker_id, strict=True)
            if not code:
                try:
                    code = await self._coordinator.offsets.commit_transactional(
                        request.group_id, request.producer_id, request.producer_epoch,
                        request.member_id, optional(request, "group_instance_id"),
                        request.generation_id, valid, lambda: self._verify(request, context))
                except CoordinatorError as exc:
                    code = exc.code
            if code == COORDINATOR_LOAD_IN_PROGRESS and context.api_version is not None \
                    and context.api_version < 2:
                code = COORDINATOR_NOT_AVAILABLE
            errors.update(dict.fromkeys(valid, code))
        return k.TxnOffsetCommitResponse(topics=[
            {"name": t.name, "partitions": [
                {"partition_index": p.partition_index,
                 "error_code": errors[(t.name, p.partition_index)]} for p in t.partitions]}
            for t in request.topics])

    async def _verify(self, request: k.TxnOffsetCommitRequest, context: RequestContext) -> int:
        """Whether the group's offsets partition is in the producer's transaction (0), else
        the error to answer, as a partition leader's verification maps the coordinator's.
        From v5 (transactions v2) the partition is added to the transaction instead (Kafka's
        ``addPartition`` operation of the group coordinator's verification), which begins
        one if none is ongoing."""
        if self._transactions is None:
            return 0
        tp = await self._coordinator.offsets_partition(request.group_id)
        try:
            if newer_shape(context, TRANSACTIONS_V2_TXN_OFFSET_COMMIT, False):
                code = await self._transactions.add_partitions(
                    request.transactional_id, request.producer_id, request.producer_epoch,
                    frozenset({tp}), TV_2)
            else:
                code = (await self._transactions.verify(
                    request.transactional_id, request.producer_id, request.producer_epoch,
                    frozenset({tp}))).get(tp, 0)
        except CoordinatorError as exc:
            return exc.code
        if code == PRODUCER_FENCED:
            return INVALID_PRODUCER_EPOCH
        if code == TRANSACTION_ABORTABLE and context.api_version is not None and \
                context.api_version < TRANSACTION_ABORTABLE_VERSION:
            return INVALID_TXN_STATE
        return code


def _topic(name: str, partitions: list[tuple[int, CommittedOffset | None, int]]
           ) -> dict[str, Any]:
    return {"name": name, "partitions": [
        {"partition_index": index, "error_code": code,
         "committed_offset": NO_OFFSET if offset is None else offset.offset,
         "committed_leader_epoch": -1 if offset is None else offset.leader_epoch,
         "metadata": "" if offset is None else offset.metadata}
        for index, offset, code in partitions]}


class OffsetDeleteApi(_OffsetsApi):
    async def handle(self, request: k.OffsetDeleteRequest,
                     context: RequestContext) -> k.OffsetDeleteResponse:
        denied = context.access.check(Operation.DELETE, ResourceType.GROUP, request.group_id)
        if denied:
            return k.OffsetDeleteResponse(error_code=denied)
        if not request.group_id:
            return k.OffsetDeleteResponse(error_code=INVALID_GROUP_ID)
        metadata = await self._metadata()
        refused = {t.name: context.access.check(Operation.READ, ResourceType.TOPIC, t.name)
                   for t in request.topics}
        wanted = [(t.name, p.partition_index) for t in request.topics if not refused[t.name]
                  for p in t.partitions]
        code, outcome = await self._serve(request.group_id, context, lambda: (
            self._coordinator.offsets.delete(request.group_id,
                                             [tp for tp in wanted if _known(metadata, tp)])))
        error, errors = outcome if outcome is not None else (code, {})
        if error:
            return k.OffsetDeleteResponse(error_code=error)
        return k.OffsetDeleteResponse(error_code=0, topics=[
            {"name": t.name, "partitions": [
                {"partition_index": p.partition_index,
                 "error_code": refused[t.name] or errors.get((t.name, p.partition_index),
                                                             UNKNOWN_TOPIC_OR_PARTITION)}
                for p in t.partitions]}
            for t in request.topics])
