"""DescribeConfigs, AlterConfigs and IncrementalAlterConfigs (Kafka's ``ConfigHelper`` and
``ConfigAdminManager`` behind ``KafkaApis``), for TOPIC resources, and BROKER resources for
reading.

    DescribeConfigs Request => [resources] include_synonyms include_documentation
      resources => resource_type resource_name [configuration_keys]
    DescribeConfigs Response => throttle_time_ms [results]
      results => error_code error_message resource_type resource_name [configs]
        configs => name value read_only config_source is_sensitive [synonyms] config_type
                   documentation
    AlterConfigs Request => [resources] validate_only
      resources => resource_type resource_name [configs => name value]
    IncrementalAlterConfigs Request => [resources] validate_only
      resources => resource_type resource_name [configs => name config_operation value]
    (Alter)Response => throttle_time_ms [responses]
      responses => error_code error_message resource_type resource_name

A topic's configs are its overrides from the cluster metadata over the defaults below (the
defaults every log node applies, Kafka's). Brokers are described with the cluster-wide
defaults; they are not changed through these APIs (the log nodes take their defaults from their
own settings). Changes go to the replicator, which validates names and values, applies
APPEND/SUBTRACT, persists and pushes them to the log nodes; the handler checks what the
replicator's contract cannot express (duplicates, null values, unknown operations and resource
types). A replicator that cannot be reached leaves the resources REQUEST_TIMED_OUT.

Authorization (Kafka's): DESCRIBE_CONFIGS to describe and ALTER_CONFIGS to alter, on the topic
for a TOPIC resource (TOPIC_AUTHORIZATION_FAILED) and on the cluster for BROKER and
BROKER_LOGGER ones (CLUSTER_AUTHORIZATION_FAILED), per resource.
"""

from __future__ import annotations

import enum
import logging
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kbroker.kafka.v1 import kafka_pb2 as k
from kbroker.replicator.v1 import replicator_pb2
from services.common.acls import CLUSTER_NAME, Operation
from services.common.acls import ResourceType as AclResourceType
from services.common.errors import ErrorCode

from ..collaborators import CallError, Controller
from ..metadata_cache import ClusterMetadata, MetadataCache, MetadataUnavailableError
from ..request_context import RequestContext
from ..security.access import Access
from ..topic_identity import invalid_name_reason
from .topics import DEFAULT_CONTROLLER_TIMEOUT_S

log = logging.getLogger(__name__)


class ResourceType(enum.IntEnum):
    """Kafka's ConfigResource.Type codes."""

    TOPIC = 2
    BROKER = 4
    BROKER_LOGGER = 8


class ConfigSource(enum.IntEnum):
    """Kafka's DescribeConfigsResponse.ConfigSource codes."""

    TOPIC_CONFIG = 1
    DYNAMIC_BROKER_CONFIG = 2
    DYNAMIC_DEFAULT_BROKER_CONFIG = 3
    STATIC_BROKER_CONFIG = 4
    DEFAULT_CONFIG = 5


class ConfigType(enum.IntEnum):
    """Kafka's DescribeConfigsResponse.ConfigType codes (DescribeConfigs v3+)."""

    BOOLEAN = 1
    STRING = 2
    INT = 3
    SHORT = 4
    LONG = 5
    DOUBLE = 6
    LIST = 7


@dataclass(frozen=True, slots=True)
class ConfigDef:
    """A config: its Kafka default, type, the broker config that sets the default (None when
    there is none), and its documentation."""

    default: str
    type: ConfigType
    broker_synonym: str | None
    doc: str


_NEVER = str(2**63 - 1)

TOPIC_CONFIGS: dict[str, ConfigDef] = {
    "cleanup.policy": ConfigDef("delete", ConfigType.LIST, "log.cleanup.policy",
                                "Retention policy of old log segments: delete, compact or both."),
    "compression.type": ConfigDef("producer", ConfigType.STRING, "compression.type",
                                  "Final compression type of the topic's data."),
    "compression.gzip.level": ConfigDef("-1", ConfigType.INT, "compression.gzip.level",
                                        "Compression level for gzip."),
    "compression.lz4.level": ConfigDef("9", ConfigType.INT, "compression.lz4.level",
                                       "Compression level for lz4."),
    "compression.zstd.level": ConfigDef("3", ConfigType.INT, "compression.zstd.level",
                                        "Compression level for zstd."),
    "delete.retention.ms": ConfigDef("86400000", ConfigType.LONG,
                                     "log.cleaner.delete.retention.ms",
                                     "How long tombstones are kept in compacted topics."),
    "file.delete.delay.ms": ConfigDef("60000", ConfigType.LONG, "log.segment.delete.delay.ms",
                                      "Time to wait before deleting a file from the filesystem."),
    "flush.messages": ConfigDef(_NEVER, ConfigType.LONG, "log.flush.interval.messages",
                                "Force an fsync after this many messages."),
    "flush.ms": ConfigDef(_NEVER, ConfigType.LONG, "log.flush.interval.ms",
                          "Force an fsync after this much time."),
    "follower.replication.throttled.replicas": ConfigDef(
        "", ConfigType.LIST, None, "Replicas whose log replication is throttled on followers."),
    "index.interval.bytes": ConfigDef("4096", ConfigType.INT, "log.index.interval.bytes",
                                      "How often an offset index entry is added."),
    "leader.replication.throttled.replicas": ConfigDef(
        "", ConfigType.LIST, None, "Replicas whose log replication is throttled on leaders."),
    "local.retention.bytes": ConfigDef("-2", ConfigType.LONG, "log.local.retention.bytes",
                                       "Local size limit with tiered storage."),
    "local.retention.ms": ConfigDef("-2", ConfigType.LONG, "log.local.retention.ms",
                                    "Local time limit with tiered storage."),
    "max.compaction.lag.ms": ConfigDef(_NEVER, ConfigType.LONG,
                                       "log.cleaner.max.compaction.lag.ms",
                                       "Longest time a record stays ineligible for compaction."),
    "max.message.bytes": ConfigDef("1048588", ConfigType.INT, "message.max.bytes",
                                   "Largest record batch size allowed."),
    "message.downconversion.enable": ConfigDef(
        "true", ConfigType.BOOLEAN, "log.message.downconversion.enable",
        "Whether old message formats are converted for old consumers."),
    "message.timestamp.after.max.ms": ConfigDef(
        _NEVER, ConfigType.LONG, "log.message.timestamp.after.max.ms",
        "How far a record timestamp may be ahead of the broker's time."),
    "message.timestamp.before.max.ms": ConfigDef(
        _NEVER, ConfigType.LONG, "log.message.timestamp.before.max.ms",
        "How far a record timestamp may be behind the broker's time."),
    "message.timestamp.difference.max.ms": ConfigDef(
        _NEVER, ConfigType.LONG, "log.message.timestamp.difference.max.ms",
        "Deprecated: the largest allowed difference of a record timestamp."),
    "message.timestamp.type": ConfigDef("CreateTime", ConfigType.STRING,
                                        "log.message.timestamp.type",
                                        "CreateTime or LogAppendTime."),
    "min.cleanable.dirty.ratio": ConfigDef("0.5", ConfigType.DOUBLE,
                                           "log.cleaner.min.cleanable.ratio",
                                           "Dirty ratio at which the log is compacted."),
    "min.compaction.lag.ms": ConfigDef("0", ConfigType.LONG, "log.cleaner.min.compaction.lag.ms",
                                       "Shortest time a record stays uncompacted."),
    "min.insync.replicas": ConfigDef("1", ConfigType.INT, "min.insync.replicas",
                                     "Fewest in-sync replicas for an acks=all write."),
    "preallocate": ConfigDef("false", ConfigType.BOOLEAN, "log.preallocate",
                             "Preallocate the file of a new segment."),
    "remote.log.copy.disable": ConfigDef("false", ConfigType.BOOLEAN, None,
                                         "Stop copying segments to tiered storage."),
    "remote.log.delete.on.disable": ConfigDef("false", ConfigType.BOOLEAN, None,
                                              "Delete tiered data when tiering is disabled."),
    "remote.storage.enable": ConfigDef("false", ConfigType.BOOLEAN, None,
                                       "Tiered storage (not supported by this cluster)."),
    "retention.bytes": ConfigDef("-1", ConfigType.LONG, "log.retention.bytes",
                                 "Largest size of a partition before old segments go."),
    "retention.ms": ConfigDef("604800000", ConfigType.LONG, "log.retention.ms",
                              "Longest time a segment is kept before it is deleted."),
    "segment.bytes": ConfigDef("1073741824", ConfigType.INT, "log.segment.bytes",
                               "Segment file size."),
    "segment.index.bytes": ConfigDef("10485760", ConfigType.INT, "log.index.size.max.bytes",
                                     "Size of the offset index of a segment."),
    "segment.jitter.ms": ConfigDef("0", ConfigType.LONG, "log.roll.jitter.ms",
                                   "Random jitter subtracted from segment.ms."),
    "segment.ms": ConfigDef("604800000", ConfigType.LONG, "log.roll.ms",
                            "Time after which a segment is rolled."),
    "unclean.leader.election.enable": ConfigDef(
        "false", ConfigType.BOOLEAN, "unclean.leader.election.enable",
        "Whether an out-of-sync replica may become leader."),
}

# Broker configs that change at runtime (AlterConfigs of a BROKER resource: a log node's id,
# or "" for every node), kept by the replicator with the cluster metadata.
DYNAMIC_BROKER_CONFIGS: dict[str, ConfigDef] = {
    "leader.replication.throttled.rate": ConfigDef(
        str((1 << 63) - 1), ConfigType.LONG, None,
        "Bytes/s a log node's throttled leader replicas may send to followers "
        "(leader.replication.throttled.replicas)."),
    "follower.replication.throttled.rate": ConfigDef(
        str((1 << 63) - 1), ConfigType.LONG, None,
        "Bytes/s a log node's throttled follower replicas may receive "
        "(follower.replication.throttled.replicas)."),
}

# Broker configs that cannot change at runtime in Kafka (read-only there and here); the
# broker synonyms of topic configs are Kafka's dynamic, cluster-wide ones.
_STATIC_BROKER_CONFIGS: dict[str, ConfigDef] = {
    "num.partitions": ConfigDef("1", ConfigType.INT, None,
                                "Default partition count of a new topic."),
    "default.replication.factor": ConfigDef("1", ConfigType.INT, None,
                                            "Default replication factor of a new topic."),
}


def config_denied(access: Access, operation: Operation, resource_type: int, name: str) -> int:
    """The error when ``operation`` (DESCRIBE_CONFIGS, ALTER_CONFIGS) on a config resource is
    denied, else 0; resource types without ACLs are left to the request's checks."""
    if resource_type == ResourceType.TOPIC:
        return access.check(operation, AclResourceType.TOPIC, name)
    if resource_type in (ResourceType.BROKER, ResourceType.BROKER_LOGGER):
        return access.check(operation, AclResourceType.CLUSTER, CLUSTER_NAME)
    return 0


# --- DescribeConfigs ---------------------------------------------------------------------------

DescribeResource = k.DescribeConfigsRequest.DescribeConfigsResource
DescribeConfigsResult = k.DescribeConfigsResponse.DescribeConfigsResult
ConfigEntry = k.DescribeConfigsResponse.DescribeConfigsResourceResult
ConfigSynonym = k.DescribeConfigsResponse.DescribeConfigsSynonym


class DescribeConfigsApi:
    def __init__(self, cache: MetadataCache, *, auto_create_topics_enable: bool = True) -> None:
        self._cache = cache
        self._auto_create = auto_create_topics_enable

    async def handle(self, request: k.DescribeConfigsRequest,
                     context: RequestContext) -> k.DescribeConfigsResponse:
        try:
            snapshot = await self._cache.current()
        except MetadataUnavailableError as exc:
            return k.DescribeConfigsResponse(results=[
                _describe_failed(r, ErrorCode.request_timed_out, str(exc))
                for r in request.resources])
        return k.DescribeConfigsResponse(results=[
            self._describe(r, snapshot, request, context.access) for r in request.resources])

    def _describe(
        self, resource: DescribeResource, snapshot: ClusterMetadata,
        request: k.DescribeConfigsRequest, access: Access,
    ) -> DescribeConfigsResult:
        denied = config_denied(access, Operation.DESCRIBE_CONFIGS, resource.resource_type,
                               resource.resource_name)
        if denied:
            return DescribeConfigsResult(resource_type=resource.resource_type,
                                         resource_name=resource.resource_name,
                                         error_code=denied)
        if resource.resource_type == ResourceType.TOPIC:
            reason = invalid_name_reason(resource.resource_name)
            if reason is not None:
                return _describe_failed(resource, ErrorCode.invalid_topic_exception, reason)
            topic = snapshot.topic(resource.resource_name)
            if topic is None:
                return _describe_failed(
                    resource, ErrorCode.unknown_topic_or_partition,
                    f"The topic '{resource.resource_name}' does not exist.")
            entries = topic_config_entries(topic.configs, request.include_synonyms,
                                           request.include_documentation)
        elif resource.resource_type == ResourceType.BROKER:
            name = resource.resource_name
            if name:
                try:
                    node_id = int(name)
                except ValueError:
                    return _describe_failed(
                        resource, ErrorCode.invalid_request,
                        f"Broker id must be an integer, but it is: {name}")
                if node_id not in snapshot.log_nodes:
                    return _describe_failed(resource, ErrorCode.invalid_request,
                                            f"Unexpected broker id, expected one of "
                                            f"{sorted(snapshot.log_nodes)}"
                                            f" or empty string, but received {name}")
            entries = self._broker_entries(name, snapshot, request.include_synonyms,
                                           request.include_documentation)
        else:
            return _describe_failed(resource, ErrorCode.invalid_request,
                                    f"Unsupported resource type {resource.resource_type}")
        # A null key list asks for every config, and so does a hand-made request that says
        # nothing about it.
        keys = resource.configuration_keys
        if not resource.configuration_keys_is_null and (
                keys or resource.HasField("configuration_keys_is_null")):
            wanted = set(keys)
            entries = [e for e in entries if e.name in wanted]
        return DescribeConfigsResult(error_code=0, resource_type=resource.resource_type,
                                     resource_name=resource.resource_name, configs=entries)

    def _broker_entries(
        self, name: str, snapshot: ClusterMetadata, synonyms: bool, documentation: bool
    ) -> list[ConfigEntry]:
        entries = [_dynamic_broker_entry(key, definition, name, snapshot, synonyms,
                                         documentation)
                   for key, definition in DYNAMIC_BROKER_CONFIGS.items()]
        dynamic = {d.broker_synonym: d for d in TOPIC_CONFIGS.values() if d.broker_synonym}
        for key, definition in sorted({**dynamic, **_STATIC_BROKER_CONFIGS}.items()):
            entries.append(_entry(key, definition.default, definition, ConfigSource.DEFAULT_CONFIG,
                                  read_only=key in _STATIC_BROKER_CONFIGS,
                                  synonyms=synonyms, documentation=documentation))
        auto = ConfigDef("true", ConfigType.BOOLEAN, None, "Create topics a client asks for.")
        entries.append(_entry("auto.create.topics.enable", str(self._auto_create).lower(), auto,
                              ConfigSource.STATIC_BROKER_CONFIG, read_only=True,
                              synonyms=synonyms, documentation=documentation))
        if name:
            broker = ConfigDef("-1", ConfigType.INT, None, "The broker id.")
            entries.append(_entry("broker.id", name, broker, ConfigSource.STATIC_BROKER_CONFIG,
                                  read_only=True, synonyms=synonyms,
                                  documentation=documentation))
        return sorted(entries, key=lambda e: e.name)


def _dynamic_broker_entry(key: str, definition: ConfigDef, broker: str,
                          snapshot: ClusterMetadata, synonyms: bool,
                          documentation: bool) -> ConfigEntry:
    """A dynamic broker config of broker ``broker`` ("": the cluster-wide view): its own
    value, else the cluster-wide one, else the default; the synonyms list each level set."""
    levels = []
    if broker:
        own = snapshot.config_resources.get((ResourceType.BROKER, broker), {})
        if key in own:
            levels.append((own[key], ConfigSource.DYNAMIC_BROKER_CONFIG))
    default = snapshot.config_resources.get((ResourceType.BROKER, ""), {})
    if key in default:
        levels.append((default[key], ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG))
    levels.append((definition.default, ConfigSource.DEFAULT_CONFIG))
    value, source = levels[0]
    return ConfigEntry(
        name=key, value=value, read_only=False, config_source=source, is_sensitive=False,
        synonyms=[ConfigSynonym(name=key, value=v, source=s) for v, s in levels]
        if synonyms else [],
        config_type=definition.type, documentation=definition.doc if documentation else None)


def topic_config_entries(
    set_on_topic: Mapping[str, str], synonyms: bool, documentation: bool
) -> list[ConfigEntry]:
    """Every topic config with its effective value, overrides first in the synonym list."""
    entries = []
    for name, definition in TOPIC_CONFIGS.items():
        if name in set_on_topic:
            value, source = set_on_topic[name], ConfigSource.TOPIC_CONFIG
        else:
            value, source = definition.default, ConfigSource.DEFAULT_CONFIG
        entries.append(_entry(name, value, definition, source, read_only=False,
                              synonyms=synonyms, documentation=documentation))
    return entries


def _entry(
    name: str, value: str, definition: ConfigDef, source: ConfigSource, *, read_only: bool,
    synonyms: bool, documentation: bool,
) -> ConfigEntry:
    synonym_list: list[ConfigSynonym] = []
    if synonyms:
        if source != ConfigSource.DEFAULT_CONFIG:
            synonym_list.append(ConfigSynonym(name=name, value=value, source=source))
        synonym_list.append(ConfigSynonym(name=definition.broker_synonym or name,
                                          value=definition.default,
                                          source=ConfigSource.DEFAULT_CONFIG))
    return ConfigEntry(
        name=name, value=value, read_only=read_only, config_source=source, is_sensitive=False,
        synonyms=synonym_list, config_type=definition.type,
        documentation=definition.doc if documentation else None,
    )


def _describe_failed(
    resource: DescribeResource, code: ErrorCode, message: str
) -> DescribeConfigsResult:
    return DescribeConfigsResult(resource_type=resource.resource_type,
                                 resource_name=resource.resource_name, error_code=code.value,
                                 error_message=message)


# --- AlterConfigs / IncrementalAlterConfigs ----------------------------------------------------

AlterRequest = k.AlterConfigsRequest | k.IncrementalAlterConfigsRequest


# How a config change applies: IncrementalAlterConfigs' codes, which the replicator's are.
ConfigOperation = replicator_pb2.ConfigChange.Operation


def _operation(config: Any) -> int:
    """A config's operation: AlterConfigs sets every config it names."""
    return getattr(config, "config_operation", ConfigOperation.SET)


def _alter_problem(resource: Any) -> tuple[ErrorCode, str] | None:
    """What is wrong with ``resource`` before the controller sees it, or None."""
    names = Counter(c.name for c in resource.configs)
    duplicates = sorted(n for n, count in names.items() if count > 1)
    if duplicates:
        return ErrorCode.invalid_request, (
            f"Error due to duplicate config keys: {', '.join(duplicates)}")
    for config in resource.configs:
        operation = _operation(config)
        if operation not in ConfigOperation.values():
            return ErrorCode.invalid_request, (
                f"Unknown operation type {operation} for config {config.name}")
        if not config.HasField("value") and operation != ConfigOperation.DELETE:
            return ErrorCode.invalid_request, (
                f"Null value not supported for : {config.name}")
    if resource.resource_type == ResourceType.TOPIC:
        reason = invalid_name_reason(resource.resource_name)
        if reason is not None:
            return ErrorCode.invalid_topic_exception, reason
        return None
    if resource.resource_type == ResourceType.BROKER:
        return None  # which configs may change is the controller's to say
    return ErrorCode.invalid_request, f"Unsupported resource type {resource.resource_type}"


class AlterConfigsApi:
    """AlterConfigs (the named configs become a topic's whole set) and IncrementalAlterConfigs
    (operations apply to the current configs); the request's type says which."""

    def __init__(self, cache: MetadataCache, admin: Controller) -> None:
        self._cache = cache
        self._admin = admin

    async def handle(self, request: AlterRequest, context: RequestContext) -> Any:
        incremental = isinstance(request, k.IncrementalAlterConfigsRequest)
        response = (k.IncrementalAlterConfigsResponse() if incremental
                    else k.AlterConfigsResponse())
        keys = Counter((r.resource_type, r.resource_name) for r in request.resources)
        # Index in ``response.responses`` -> the topic (broker) changes to send.
        pending: dict[int, replicator_pb2.TopicConfigChanges] = {}
        brokers: dict[int, replicator_pb2.ConfigResourceChanges] = {}
        for index, resource in enumerate(request.resources):
            denied = config_denied(context.access, Operation.ALTER_CONFIGS,
                                   resource.resource_type, resource.resource_name)
            problem: tuple[ErrorCode, str] | None = None
            if keys[(resource.resource_type, resource.resource_name)] > 1:
                problem = (ErrorCode.invalid_request, "Error due to duplicate resource.")
            elif not denied:
                problem = _alter_problem(resource)
            result = response.responses.add(resource_type=resource.resource_type,
                                            resource_name=resource.resource_name,
                                            error_code=0)
            changes = [replicator_pb2.ConfigChange(name=c.name, operation=_operation(c),
                                                   value=c.value) for c in resource.configs]
            if denied and problem is None:
                result.error_code = denied
            elif problem is not None:
                result.error_code, result.error_message = problem[0].value, problem[1]
            elif resource.resource_type == ResourceType.TOPIC:
                pending[index] = replicator_pb2.TopicConfigChanges(
                    topic=resource.resource_name, replace=not incremental, changes=changes)
            elif resource.resource_type == ResourceType.BROKER:
                brokers[index] = replicator_pb2.ConfigResourceChanges(
                    resource_type=resource.resource_type, name=resource.resource_name,
                    replace=not incremental, changes=changes)
        changed = await self._alter_topics(pending, response.responses, request.validate_only)
        changed |= await self._alter_brokers(brokers, response.responses,
                                             request.validate_only)
        if changed:
            await self._cache.reload()
        return response

    async def _alter_topics(self, pending: dict[int, replicator_pb2.TopicConfigChanges],
                            results: Any, validate_only: bool) -> bool:
        """Send the topic changes; their answers into ``results``. True if any took effect."""
        if not pending:
            return False
        try:
            answers = (await self._admin.alter_topic_configs(
                replicator_pb2.AlterTopicConfigsRequest(topics=list(pending.values()),
                                                        validate_only=validate_only),
                DEFAULT_CONTROLLER_TIMEOUT_S)).topics
        except CallError as exc:
            log.warning("altering configs failed: %s", exc)
            for index in pending:
                _alter_failed(results[index], ErrorCode.request_timed_out,
                              f"the controller did not answer: {exc}")
            return False
        if len(answers) != len(pending):
            for index in pending:
                _alter_failed(results[index], ErrorCode.unknown_server_error,
                              "the controller returned no result for this topic")
            return False
        for index, answer in zip(pending, answers, strict=True):
            if answer.error_code:
                results[index].error_code = answer.error_code
                if answer.error_message:
                    results[index].error_message = answer.error_message
        return not validate_only and any(not a.error_code for a in answers)

    async def _alter_brokers(self, pending: dict[int, replicator_pb2.ConfigResourceChanges],
                             results: Any, validate_only: bool) -> bool:
        """Send the broker config changes; their answers into ``results``. True if any took
        effect."""
        if not pending:
            return False
        try:
            answers = (await self._admin.alter_config_resources(
                replicator_pb2.AlterConfigResourcesRequest(resources=list(pending.values()),
                                                           validate_only=validate_only),
                DEFAULT_CONTROLLER_TIMEOUT_S)).results
        except CallError as exc:
            log.warning("altering broker configs failed: %s", exc)
            for index in pending:
                _alter_failed(results[index], ErrorCode.request_timed_out,
                              f"the controller did not answer: {exc}")
            return False
        for index, answer in zip(pending, answers, strict=False):
            if answer.error_code:
                _alter_failed(results[index], ErrorCode(answer.error_code),
                              answer.error_message)
        return not validate_only and any(not a.error_code for a in answers)


def _alter_failed(result: Any, code: ErrorCode, message: str) -> None:
    result.error_code, result.error_message = code.value, message
