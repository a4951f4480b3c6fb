"""Committed offsets of groups (Kafka's ``KafkaApis`` handlers of OffsetCommit, OffsetFetch and
OffsetDelete), over the :class:`~..groups.coordinator.GroupCoordinator`.

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

OffsetCommit checks each partition first: an unknown topic or partition is
UNKNOWN_TOPIC_OR_PARTITION, metadata over ``offset.metadata.max.bytes`` is
OFFSET_METADATA_TOO_LARGE; the rest is committed in one write, all or nothing, after the
group's checks (generation, member) on fresh state. A retention time (v2-v4) becomes the
value's expire timestamp. OffsetFetch answers -1 (no offset) for partitions without a commit,
a null topic list asks for every committed partition, and before v2 a group error is given in
every partition. Transactions do not exist here, so ``require_stable`` changes nothing.

OffsetCommit v9 and OffsetFetch v9 are the versions KIP-848 consumers use; their groups are
classic here, and Kafka serves classic groups at these versions as at v8: the commit's
``generation_id_or_member_epoch`` is the generation, and OffsetFetch's ``member_id`` and
``member_epoch`` are not checked.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from services.common.errors import ErrorCode

from ..groups.coordinator import CoordinatorError, GroupCoordinator
from ..groups.state import CommittedOffset, TopicPartition
from ..metadata_cache import ClusterMetadata, MetadataCache, MetadataUnavailableError
from ..request_context import RequestContext

UNKNOWN_TOPIC_OR_PARTITION = ErrorCode.unknown_topic_or_partition.value
OFFSET_METADATA_TOO_LARGE = ErrorCode.offset_metadata_too_large.value
COORDINATOR_NOT_AVAILABLE = ErrorCode.coordinator_not_available.value
NO_OFFSET = -1
NO_RETENTION = -1


def _known(metadata: ClusterMetadata | None, tp: TopicPartition) -> bool:
    if metadata is None:
        return False
    topic = metadata.topic(tp[0])
    return topic is not None and tp[1] in topic.partitions


async def _metadata(cache: MetadataCache) -> ClusterMetadata | None:
    try:
        return await cache.current()
    except MetadataUnavailableError:
        return None


# --- OffsetCommit ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class CommitPartition:
    partition_index: int
    committed_offset: int
    committed_leader_epoch: int = -1
    committed_metadata: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CommitTopic:
    name: str
    partitions: Sequence[CommitPartition] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetCommitRequest:
    group_id: str
    generation_id: int = -1
    member_id: str = ""
    group_instance_id: str | None = None
    retention_time_ms: int = NO_RETENTION
    topics: Sequence[CommitTopic] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetCommitResponse:
    # name -> [(partition index, error code)], in request order.
    topics: Sequence[tuple[str, Sequence[tuple[int, int]]]] = ()


def offset_commit_error(request: OffsetCommitRequest, code: int) -> OffsetCommitResponse:
    return OffsetCommitResponse(topics=[
        (t.name, [(p.partition_index, code) for p in t.partitions]) for t in request.topics])


class OffsetCommitApi:
    def __init__(self, cache: MetadataCache, coordinator: GroupCoordinator) -> None:
        self._cache = cache
        self._coordinator = coordinator

    async def handle(self, request: OffsetCommitRequest,
                     context: RequestContext) -> OffsetCommitResponse:
        metadata = await _metadata(self._cache)
        limit = self._coordinator.config.offset_metadata_max_bytes
        now = self._coordinator.now()
        expire = now + request.retention_time_ms if request.retention_time_ms >= 0 else -1
        errors: dict[TopicPartition, int] = {}
        valid: dict[TopicPartition, CommittedOffset] = {}
        for topic in request.topics:
            for p in topic.partitions:
                tp = (topic.name, p.partition_index)
                metadata_text = p.committed_metadata or ""
                if not _known(metadata, tp):
                    errors[tp] = UNKNOWN_TOPIC_OR_PARTITION
                elif len(metadata_text.encode()) > limit:
                    errors[tp] = OFFSET_METADATA_TOO_LARGE
                else:
                    valid[tp] = CommittedOffset(
                        offset=p.committed_offset, leader_epoch=p.committed_leader_epoch,
                        metadata=metadata_text, commit_timestamp=now,
                        expire_timestamp=expire)
        if valid or not errors:
            code = await self._coordinator.not_coordinator(request.group_id, context.broker_id)
            if code:
                return offset_commit_error(request, code)
            try:
                code = await self._coordinator.commit_offsets(
                    request.group_id, request.member_id, request.group_instance_id,
                    request.generation_id, valid)
            except CoordinatorError as exc:
                code = exc.code
            if code == ErrorCode.invalid_group_id.value:
                return offset_commit_error(request, code)
            for tp in valid:
                errors[tp] = code
        return OffsetCommitResponse(topics=[
            (t.name, [(p.partition_index, errors[(t.name, p.partition_index)])
                      for p in t.partitions])
            for t in request.topics])


# --- OffsetFetch -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class FetchGroup:
    group_id: str
    # None: every committed partition of the group.
    topics: Sequence[tuple[str, Sequence[int]]] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetFetchRequest:
    groups: Sequence[FetchGroup] = ()
    # v8+: groups answered in ``groups``; else the one group at the top level.
    batched: bool = False
    require_stable: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class FetchedPartition:
    partition_index: int
    committed_offset: int = NO_OFFSET
    committed_leader_epoch: int = -1
    metadata: str = ""
    error_code: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class FetchedGroup:
    group_id: str
    error_code: int = 0
    topics: Sequence[tuple[str, Sequence[FetchedPartition]]] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetFetchResponse:
    groups: Sequence[FetchedGroup] = field(default_factory=list)
    batched: bool = False


def _group_error(group: FetchGroup, code: int, in_partitions: bool) -> FetchedGroup:
    topics = [] if group.topics is None else [
        (name, [FetchedPartition(partition_index=p, error_code=code if in_partitions else 0)
                for p in partitions])
        for name, partitions in group.topics]
    return FetchedGroup(group_id=group.group_id, error_code=code, topics=topics)


def offset_fetch_error(request: OffsetFetchRequest, code: int) -> OffsetFetchResponse:
    return OffsetFetchResponse(groups=[_group_error(g, code, True) for g in request.groups],
                               batched=request.batched)


class OffsetFetchApi:
    def __init__(self, coordinator: GroupCoordinator) -> None:
        self._coordinator = coordinator

    async def handle(self, request: OffsetFetchRequest,
                     context: RequestContext) -> OffsetFetchResponse:
        version = context.api_version
        # Before v2 there is no top-level error: the group's error goes into every partition.
        in_partitions = version is None or version < 2
        groups = []
        for group in request.groups:
            wanted = None if group.topics is None else [
                (name, p) for name, partitions in group.topics for p in partitions]
            code = await self._coordinator.not_coordinator(group.group_id, context.broker_id)
            if code:
                groups.append(_group_error(group, code, in_partitions))
                continue
            try:
                committed = await self._coordinator.fetch_offsets(group.group_id, wanted)
            except CoordinatorError as exc:
                groups.append(_group_error(group, exc.code, in_partitions))
                continue
            by_topic: dict[str, list[FetchedPartition]] = {}
            for (name, partition), offset in committed.items():
                by_topic.setdefault(name, []).append(
                    FetchedPartition(partition_index=partition) if offset is None else
                    FetchedPartition(partition_index=partition,
                                     committed_offset=offset.offset,
                                     committed_leader_epoch=offset.leader_epoch,
                                     metadata=offset.metadata))
            if group.topics is None:
                for partitions in by_topic.values():
                    partitions.sort(key=lambda p: p.partition_index)
                topics = sorted(by_topic.items())
            else:
                topics = [(name, by_topic.get(name, [])) for name, _ in group.topics]
            groups.append(FetchedGroup(group_id=group.group_id, topics=topics))
        return OffsetFetchResponse(groups=groups, batched=request.batched)


# --- OffsetDelete ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetDeleteRequest:
    group_id: str
    topics: Sequence[tuple[str, Sequence[int]]] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetDeleteResponse:
    error_code: int = 0
    topics: Sequence[tuple[str, Sequence[tuple[int, int]]]] = ()


def offset_delete_error(request: OffsetDeleteRequest, code: int) -> OffsetDeleteResponse:
    return OffsetDeleteResponse(error_code=code)


class OffsetDeleteApi:
    def __init__(self, cache: MetadataCache, coordinator: GroupCoordinator) -> None:
        self._cache = cache
        self._coordinator = coordinator

    async def handle(self, request: OffsetDeleteRequest,
                     context: RequestContext) -> OffsetDeleteResponse:
        if not request.group_id:
            return offset_delete_error(request, ErrorCode.invalid_group_id.value)
        code = await self._coordinator.not_coordinator(request.group_id, context.broker_id)
        if code:
            return offset_delete_error(request, code)
        metadata = await _metadata(self._cache)
        wanted = [(name, p) for name, partitions in request.topics for p in partitions]
        known = [tp for tp in wanted if _known(metadata, tp)]
        try:
            code, errors = await self._coordinator.delete_offsets(request.group_id, known)
        except CoordinatorError as exc:
            return offset_delete_error(request, exc.code)
        if code:
            return offset_delete_error(request, code)
        return OffsetDeleteResponse(topics=[
            (name, [(p, errors.get((name, p), UNKNOWN_TOPIC_OR_PARTITION)) for p in partitions])
            for name, partitions in request.topics])
