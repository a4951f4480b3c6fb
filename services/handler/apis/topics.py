"""CreateTopics and DeleteTopics, carried out by the replicator in its controller role (Kafka's
``ControllerApis.createTopics`` / ``deleteTopics`` in front of the quorum controller).

    CreateTopics Request => [topics] timeout_ms validate_only
      topics => name num_partitions replication_factor [assignments] [configs]
    CreateTopics Response => throttle_time_ms [topics]
      topics => name topic_id error_code error_message num_partitions replication_factor
                [configs]
        configs => name value read_only config_source is_sensitive

    DeleteTopics Request => [topic_names] timeout_ms   (v6: [topics] => name topic_id)
    DeleteTopics Response => throttle_time_ms [responses]
      responses => name topic_id error_code error_message

The handler checks what the replicator's contract cannot express (names given twice, manual
assignments next to explicit counts, assignments naming a partition twice, null config values,
a topic named by both name and id) and what must never reach it (illegal names); everything
else (existing topics, partition counts, replication factors, configs) is the controller's to
judge. A hand-made request (grpcurl) that leaves a topic's partition count or replication
factor unset asks for the broker default, as -1 does. A replicator that cannot be reached
leaves the request timed out (REQUEST_TIMED_OUT, which admin clients retry). After a change the
metadata cache is reloaded, so a Metadata request that follows on this handler sees it.

Authorization (Kafka's ``ControllerApis``): creating a topic needs CREATE on the cluster or on
the topic (TOPIC_AUTHORIZATION_FAILED, "Authorization failed."), and its configs are shown only
with DESCRIBE_CONFIGS on it (else ``topic_config_error_code`` TOPIC_AUTHORIZATION_FAILED);
deleting one needs DELETE on the cluster or on the topic, and a topic the principal may not
DESCRIBE is TOPIC_AUTHORIZATION_FAILED whether it exists or not (named by id: without its name).
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from collections.abc import Awaitable, Iterable
from typing import Any

from kbroker.kafka.v1 import kafka_pb2 as k
from kbroker.replicator.v1 import replicator_pb2
from services.common.acls import Operation, ResourceType
from services.common.errors import ErrorCode

from ..collaborators import CallError, Controller
from ..metadata_cache import ClusterMetadata, MetadataCache, MetadataUnavailableError
from ..request_context import RequestContext
from ..topic_identity import canonical_topic_id, invalid_name_reason

log = logging.getLogger(__name__)

TOPIC_AUTHORIZATION_FAILED = ErrorCode.topic_authorization_failed.value

# Kafka's ConfigSource codes for topic configs.
TOPIC_CONFIG = 1
DEFAULT_CONFIG = 5
# Bounds on how long the replicator may take, whatever the client's timeout says.
MIN_CONTROLLER_TIMEOUT_S = 5.0
DEFAULT_CONTROLLER_TIMEOUT_S = 30.0


def controller_timeout(timeout_ms: int) -> float:
    """Seconds to give the replicator for a request with this ``timeout_ms``."""
    if timeout_ms <= 0:
        return DEFAULT_CONTROLLER_TIMEOUT_S
    return max(timeout_ms / 1000, MIN_CONTROLLER_TIMEOUT_S)


async def controller_results(
    cache: MetadataCache, call: Awaitable[Any], names: Iterable[str], validate_only: bool,
) -> dict[str, replicator_pb2.TopicResult]:
    """The controller's result (``call``'s answer) for each topic of ``names``: with
    REQUEST_TIMED_OUT when the controller did not answer, UNKNOWN_SERVER_ERROR when it gave
    none for the topic. After a change the metadata cache is reloaded."""
    try:
        results = {r.name: r for r in (await call).topics}
    except CallError as exc:
        log.warning("the controller did not answer: %s", exc)
        failed = replicator_pb2.TopicResult(error_code=ErrorCode.request_timed_out.value,
                                            error_message=f"the controller did not answer: {exc}")
        return dict.fromkeys(names, failed)
    if not validate_only and any(not r.error_code for r in results.values()):
        await cache.reload()
    missing = replicator_pb2.TopicResult(
        error_code=ErrorCode.unknown_server_error.value,
        error_message="the controller returned no result for this topic")
    return {name: results.get(name, missing) for name in names}


# --- CreateTopics ------------------------------------------------------------------------------

CreatableTopic = k.CreateTopicsRequest.CreatableTopic
CreatableTopicResult = k.CreateTopicsResponse.CreatableTopicResult


def _count(topic: CreatableTopic, field: str) -> int:
    """A partition count or replication factor; unset (a hand-made request) is the default."""
    return getattr(topic, field) if topic.HasField(field) else -1


def creation_error(topic: CreatableTopic) -> tuple[ErrorCode, str] | None:
    """What is wrong with ``topic`` before the controller sees it, or None."""
    reason = invalid_name_reason(topic.name)
    if reason is not None:
        return ErrorCode.invalid_topic_exception, reason
    if topic.assignments:
        if _count(topic, "replication_factor") != -1:
            return ErrorCode.invalid_request, (
                "A manual partition assignment was specified, but replication factor was not"
                " set to -1.")
        if _count(topic, "num_partitions") != -1:
            return ErrorCode.invalid_request, (
                "A manual partition assignment was specified, but numPartitions was not set"
                " to -1.")
        counts = Counter(a.partition_index for a in topic.assignments)
        for index, count in counts.items():
            if count > 1:
                return ErrorCode.invalid_replica_assignment, (
                    f"Found multiple manual partition assignments for partition {index}")
    for config in topic.configs:
        if not config.HasField("value"):
            return ErrorCode.invalid_config, (
                f"Null value not supported for topic configs: {config.name}")
    return None


def _failed(name: str, code: int, message: str | None) -> CreatableTopicResult:
    return CreatableTopicResult(name=name, error_code=code, error_message=message)


class CreateTopicsApi:
    def __init__(self, cache: MetadataCache, controller: Controller) -> None:
        self._cache = cache
        self._controller = controller

    async def handle(self, request: k.CreateTopicsRequest,
                     context: RequestContext) -> k.CreateTopicsResponse:
        counts = Counter(t.name for t in request.topics)
        answers: dict[str, CreatableTopicResult] = {}
        to_create: list[CreatableTopic] = []
        access = context.access
        any_topic = access.allows(Operation.CREATE, ResourceType.CLUSTER)
        for topic in request.topics:
            if topic.name in answers:
                continue
            if counts[topic.name] > 1:
                answers[topic.name] = _failed(topic.name, ErrorCode.invalid_request.value,
                                              "Duplicate topic name.")
                continue
            if not any_topic and not access.allows(Operation.CREATE, ResourceType.TOPIC,
                                                   topic.name):
                answers[topic.name] = _failed(topic.name, TOPIC_AUTHORIZATION_FAILED,
                                              "Authorization failed.")
                continue
            problem = creation_error(topic)
            if problem is not None:
                answers[topic.name] = _failed(topic.name, problem[0].value, problem[1])
                continue
            to_create.append(topic)

        if to_create:
            answers.update(await self._create(to_create, request))
        for name, answer in answers.items():
            if not answer.error_code and not access.allows(Operation.DESCRIBE_CONFIGS,
                                                           ResourceType.TOPIC, name):
                answer.topic_config_error_code = TOPIC_AUTHORIZATION_FAILED
                del answer.configs[:]
        names = dict.fromkeys(t.name for t in request.topics)
        return k.CreateTopicsResponse(topics=[answers[n] for n in names])

    async def _create(self, topics: list[CreatableTopic],
                      request: k.CreateTopicsRequest) -> dict[str, CreatableTopicResult]:
        creation = replicator_pb2.CreateTopicsRequest(
            validate_only=request.validate_only, topics=[replicator_pb2.NewTopic(
                name=t.name, num_partitions=_count(t, "num_partitions"),
                replication_factor=_count(t, "replication_factor"),
                configs={c.name: c.value for c in t.configs},
                assignments={a.partition_index: replicator_pb2.Replicas(node_ids=a.broker_ids)
                             for a in t.assignments})
                for t in topics])
        results = await controller_results(
            self._cache, self._controller.create_topics(
                creation, controller_timeout(request.timeout_ms)),
            [t.name for t in topics], request.validate_only)
        return {t.name: _created(t, results[t.name]) for t in topics}


def _created(topic: CreatableTopic,
             result: replicator_pb2.TopicResult) -> CreatableTopicResult:
    if result.error_code:
        return _failed(topic.name, result.error_code, result.error_message or None)
    overridden = {c.name for c in topic.configs}
    return CreatableTopicResult(
        name=topic.name,
        topic_id=canonical_topic_id(result.topic_id),
        num_partitions=result.num_partitions,
        replication_factor=result.replication_factor,
        configs=[
            k.CreateTopicsResponse.CreatableTopicConfigs(
                name=name, value=value, read_only=False, is_sensitive=False,
                config_source=TOPIC_CONFIG if name in overridden else DEFAULT_CONFIG)
            for name, value in sorted(result.configs.items())
        ],
    )


# --- DeleteTopics ------------------------------------------------------------------------------

DeletableTopicResult = k.DeleteTopicsResponse.DeletableTopicResult


class DeleteTopicsApi:
    def __init__(self, cache: MetadataCache, controller: Controller) -> None:
        self._cache = cache
        self._controller = controller

    async def _names_of_ids(self, refs: list[tuple[str | None, str | None]],
                            needed: bool) -> ClusterMetadata | None:
        """Metadata to find the names of the topics ``refs`` names by id; when they are
        ``needed`` (to authorize by) and some id is unknown, fresh metadata."""
        metadata = self._cache.snapshot
        ids = [topic_id for name, topic_id in refs if name is None and topic_id]
        if needed and ids and (metadata is None or any(
                metadata.topic_by_id(i) is None for i in ids)):
            with contextlib.suppress(MetadataUnavailableError):
                metadata = await self._cache.refresh()
        return metadata

    async def handle(self, request: k.DeleteTopicsRequest,
                     context: RequestContext) -> k.DeleteTopicsResponse:
        # Versions before 6 name topics in topic_names (the frontend moves them into topics;
        # a hand-made request may still use either).
        refs = [(name, None) for name in request.topic_names]
        refs += [(t.name if t.HasField("name") else None, canonical_topic_id(t.topic_id))
                 for t in request.topics]
        # Only entries naming a topic one way count towards duplicates, as in Kafka.
        name_counts: Counter[str | None] = Counter(name for name, topic_id in refs
                              if name is not None and topic_id is None)
        id_counts = Counter(topic_id for name, topic_id in refs
                            if topic_id is not None and name is None)
        out: list[DeletableTopicResult] = []
        # The answers to fill from the controller's, with the topic's name or else its id.
        pending: list[tuple[DeletableTopicResult, str | None, str | None]] = []
        access = context.access
        any_topic = access.allows(Operation.DELETE, ResourceType.CLUSTER)
        metadata = await self._names_of_ids(refs, access.enabled and not any_topic)
        for name, topic_id in refs:
            error: str | None = None
            if name is None and topic_id is None:
                error = "Neither topic name nor id were specified."
            elif name is not None and topic_id is not None:
                error = "You may not specify both topic name and topic id."
            elif name is not None and name_counts[name] > 1:
                error = "Duplicate topic name."
            elif topic_id is not None and id_counts[topic_id] > 1:
                error = "Duplicate topic id."
            out.append(answer := DeletableTopicResult(name=name, topic_id=topic_id))
            if error is not None:
                answer.error_code, answer.error_message = ErrorCode.invalid_request.value, error
                continue
            # By id: authorized by the name it has; an id the metadata does not know is
            # UNKNOWN_TOPIC_ID when it must be authorized (no name to check it by).
            known = metadata.topic_by_id(topic_id) if metadata and topic_id else None
            checked = name if name is not None else (known.name if known else None)
            if checked is None and access.enabled and not any_topic:
                answer.error_code = ErrorCode.unknown_topic_id.value
                continue
            if checked is not None and not any_topic and not access.allows(
                    Operation.DELETE, ResourceType.TOPIC, checked):
                answer.error_code = TOPIC_AUTHORIZATION_FAILED
                if name is None and access.allows(Operation.DESCRIBE, ResourceType.TOPIC,
                                                  checked):
                    answer.name = checked
                continue
            pending.append((answer, name, topic_id))
        if not pending:
            return k.DeleteTopicsResponse(responses=out)

        deletion = replicator_pb2.DeleteTopicsRequest(
            names=[name for _, name, _ in pending if name is not None],
            topic_ids=[topic_id for _, name, topic_id in pending if name is None])
        try:
            results = (await self._controller.delete_topics(
                deletion, controller_timeout(request.timeout_ms))).topics
        except CallError as exc:
            log.warning("deleting topics failed: %s", exc)
            for answer, _, _ in pending:
                answer.error_code = ErrorCode.request_timed_out.value
                answer.error_message = f"the controller did not answer: {exc}"
            return k.DeleteTopicsResponse(responses=out)

        by_name = {r.name: r for r in results if r.name}
        by_id = {tid: r for r in results if (tid := canonical_topic_id(r.topic_id))}
        for answer, name, topic_id in pending:
            result = by_name.get(name) if name is not None else by_id.get(topic_id or "")
            if result is None:
                answer.error_code = ErrorCode.unknown_server_error.value
                answer.error_message = "the controller returned no result for this topic"
                continue
            if result.name:
                answer.name = result.name
            if canonical_topic_id(result.topic_id):
                answer.topic_id = canonical_topic_id(result.topic_id)
            answer.error_code = result.error_code
            if result.error_message:
                answer.error_message = result.error_message
        if any(not r.error_code for r in results):
            await self._cache.reload()
        return k.DeleteTopicsResponse(responses=out)
