"""What makes a topic creation request valid, with the error codes and messages Kafka's
controller gives (``Topic.validate``, ``LogConfig.validate``, ``ReplicationControlManager``).

- Names: 1..249 characters of ``[a-zA-Z0-9._-]``, not ``.`` or ``..``; names that differ only
  by ``.`` versus ``_`` collide (metric names cannot tell them apart).
- Partition count and replication factor: -1 means the broker default; anything below 1 is
  invalid; the factor cannot exceed the live log nodes.
- Manual assignments: counts must be -1; partitions 0..n-1, each a non-empty list of distinct
  known nodes, all of the same length, at least one of them alive.
- Configs: known topic config names only, values parsed and range-checked per config.
- Config changes (``apply_config_changes``): SET, DELETE, and APPEND/SUBTRACT for list configs
  only, applied to the current overrides or, for a list config without one, to its default
  (as Kafka's ``ConfigAdminManager`` does).

Every check raises :class:`KafkaError` with the Kafka code; nothing here has side effects.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence

from kbroker.replicator.v1 import replicator_pb2 as pb
from services.common.errors import ErrorCode, KafkaError

from .metadata import NodeId

MAX_NAME_LENGTH = 249
_LEGAL_NAME = re.compile(r"[a-zA-Z0-9._-]+")


def validate_topic_name(name: str) -> None:
    """Raise INVALID_TOPIC_EXCEPTION unless ``name`` is a legal topic name."""
    if not name:
        raise KafkaError(ErrorCode.invalid_topic_exception,
                         "Topic name is illegal, it can't be empty")
    if name in (".", ".."):
        raise KafkaError(ErrorCode.invalid_topic_exception,
                         'Topic name cannot be "." or ".."')
    if len(name) > MAX_NAME_LENGTH:
        raise KafkaError(
            ErrorCode.invalid_topic_exception,
            f"Topic name is illegal, it can't be longer than {MAX_NAME_LENGTH} characters, "
            f"topic name: {name}",
        )
    if not _LEGAL_NAME.fullmatch(name):
        raise KafkaError(
            ErrorCode.invalid_topic_exception,
            f'Topic name "{name}" is illegal, it contains a character other than ASCII '
            "alphanumerics, '.', '_' and '-'",
        )


def collision_key(name: str) -> str:
    """Names with equal keys collide: '.' and '_' look the same in metric names."""
    return name.replace(".", "_")


def resolve_num_partitions(requested: int, default: int) -> int:
    if requested == -1:
        return default
    if requested < 1:
        raise KafkaError(ErrorCode.invalid_partitions,
                         "Number of partitions was set to an invalid non-positive value.")
    return requested


def resolve_replication_factor(requested: int, default: int, live_nodes: int) -> int:
    factor = default if requested == -1 else requested
    if factor < 1:
        raise KafkaError(
            ErrorCode.invalid_replication_factor,
            "Replication factor must be larger than 0, or -1 to use the default value.",
        )
    if factor > live_nodes:
        raise KafkaError(
            ErrorCode.invalid_replication_factor,
            f"Unable to replicate the partition {factor} time(s): The target replication "
            f"factor of {factor} cannot be reached because only {live_nodes} log node(s) "
            "are alive.",
        )
    return factor


def validate_assignment(
    assignments: Mapping[int, Sequence[int]],
    *,
    num_partitions: int,
    replication_factor: int,
    known_nodes: Collection[int],
    live_nodes: Collection[int],
) -> list[tuple[NodeId, ...]]:
    """Check a manual assignment; returns the replica lists by partition index."""
    if num_partitions != -1:
        raise KafkaError(ErrorCode.invalid_request,
                         "A manual partition assignment was specified, but numPartitions "
                         "was not set to -1.")
    if replication_factor != -1:
        raise KafkaError(ErrorCode.invalid_request,
                         "A manual partition assignment was specified, but replication "
                         "factor was not set to -1.")
    if sorted(assignments) != list(range(len(assignments))):
        raise KafkaError(ErrorCode.invalid_replica_assignment,
                         "Partitions should be a consecutive 0-based integer sequence.")
    result: list[tuple[NodeId, ...]] = []
    for index in range(len(assignments)):
        replicas = list(assignments[index])
        if not replicas:
            raise KafkaError(ErrorCode.invalid_replica_assignment,
                             "The manual partition assignment includes an empty replica list.")
        seen: set[int] = set()
        for node in replicas:
            if node not in known_nodes:
                raise KafkaError(
                    ErrorCode.invalid_replica_assignment,
                    f"The manual partition assignment includes log node {node}, but no such "
                    "log node is configured.",
                )
            if node in seen:
                raise KafkaError(
                    ErrorCode.invalid_replica_assignment,
                    f"The manual partition assignment includes the log node {node} more than "
                    "once.",
                )
            seen.add(node)
        if result and len(replicas) != len(result[0]):
            raise KafkaError(
                ErrorCode.invalid_replica_assignment,
                f"The manual partition assignment includes a partition with {len(replicas)} "
                "replica(s), but this is not consistent with previous partitions, which have "
                f"{len(result[0])} replica(s).",
            )
        if not seen & set(live_nodes):
            raise KafkaError(
                ErrorCode.invalid_replica_assignment,
                f"All log nodes specified in the manual partition assignment for partition "
                f"{index} are offline.",
            )
        result.append(tuple(NodeId(n) for n in replicas))
    return result


# -- topic configs ----------------------------------------------------------------------------

_INTEGER = re.compile(r"[+-]?[0-9]+")
_DECIMAL = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")
_THROTTLED_REPLICA = re.compile(r"[0-9]+:[0-9]+")

Validator = Callable[[str], str | None]
"""Returns None when the value is valid, else why not."""


def _integer(bits: int, at_least: int | None = None, at_most: int | None = None) -> Validator:
    low, high = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1

    def check(value: str) -> str | None:
        text = value.strip()
        if not _INTEGER.fullmatch(text):
            return f"Expected value to be a {bits}-bit integer, but it was a string"
        number = int(text)
        if not low <= number <= high:
            return f"Not a number of type {'INT' if bits == 32 else 'LONG'}"
        if at_least is not None and number < at_least:
            return f"Value must be at least {at_least}"
        if at_most is not None and number > at_most:
            return f"Value must be no more than {at_most}"
        return None

    return check


_int = functools.partial(_integer, 32)
_long = functools.partial(_integer, 64)


def _ratio(value: str) -> str | None:
    text = value.strip()
    if not _DECIMAL.fullmatch(text):
        return "Expected value to be a double"
    number = float(text)
    if math.isnan(number) or not 0.0 <= number <= 1.0:
        return "Value must be between 0 and 1"
    return None


def _boolean(value: str) -> str | None:
    if value.strip().lower() not in ("true", "false"):
        return "Expected value to be either true or false"
    return None


def _one_of(*allowed: str) -> Validator:
    def check(value: str) -> str | None:
        if value.strip() not in allowed:
            return f"String must be one of: {', '.join(allowed)}"
        return None

    return check


def _list_of(*allowed: str) -> Validator:
    def check(value: str) -> str | None:
        items = [item.strip() for item in value.split(",")] if value.strip() else []
        for item in items:
            if item not in allowed:
                return f"Invalid value {item} for configuration: String must be one of: " + (
                    ", ".join(allowed))
        return None

    return check


def _throttled_replicas(value: str) -> str | None:
    text = value.strip()
    if text == "*":
        return None
    items = [item.strip() for item in text.split(",")] if text else []
    if all(_THROTTLED_REPLICA.fullmatch(item) for item in items):
        return None
    return ("Must be the literal '*' or a list of replicas in the following format: "
            "[partitionId]:[brokerId],[partitionId]:[brokerId],...")


def _local_storage_only(value: str) -> str | None:
    problem = _boolean(value)
    if problem is None and value.strip().lower() == "true":
        return "Tiered storage is not supported by this cluster"
    return problem


TOPIC_CONFIGS: dict[str, Validator] = {
    "cleanup.policy": _list_of("compact", "delete"),
    "compression.type": _one_of("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer"),
    "compression.gzip.level": _int(-1, 9),
    "compression.lz4.level": _int(1, 17),
    "compression.zstd.level": _int(-131072, 22),
    "delete.retention.ms": _long(0),
    "file.delete.delay.ms": _long(0),
    "flush.messages": _long(1),
    "flush.ms": _long(0),
    "follower.replication.throttled.replicas": _throttled_replicas,
    "index.interval.bytes": _int(0),
    "leader.replication.throttled.replicas": _throttled_replicas,
    "local.retention.bytes": _long(-2),
    "local.retention.ms": _long(-2),
    "max.compaction.lag.ms": _long(1),
    "max.message.bytes": _int(0),
    "message.downconversion.enable": _boolean,
    "message.timestamp.after.max.ms": _long(0),
    "message.timestamp.before.max.ms": _long(0),
    "message.timestamp.difference.max.ms": _long(0),
    "message.timestamp.type": _one_of("CreateTime", "LogAppendTime"),
    "min.cleanable.dirty.ratio": _ratio,
    "min.compaction.lag.ms": _long(0),
    "min.insync.replicas": _int(1),
    "preallocate": _boolean,
    "remote.log.copy.disable": _boolean,
    "remote.log.delete.on.disable": _boolean,
    "remote.storage.enable": _local_storage_only,
    "retention.bytes": _long(),
    "retention.ms": _long(-1),
    # Kafka's historical minimum: the overhead of one legacy record.
    "segment.bytes": _int(14),
    "segment.index.bytes": _int(4),
    "segment.jitter.ms": _long(0),
    "segment.ms": _long(1),
    "unclean.leader.election.enable": _boolean,
}


def validate_configs(configs: Mapping[str, str]) -> dict[str, str]:
    """Raise INVALID_CONFIG for an unknown name or a bad value; returns the configs to store."""
    for name in sorted(configs):
        validator = TOPIC_CONFIGS.get(name)
        if validator is None:
            raise KafkaError(ErrorCode.invalid_config, f"Unknown topic config name: {name}")
        problem = validator(configs[name])
        if problem is not None:
            raise KafkaError(
                ErrorCode.invalid_config,
                f"Invalid value {configs[name]} for configuration {name}: {problem}",
            )
    return dict(configs)


# List-valued topic configs and their defaults: APPEND and SUBTRACT start from the default
# when the topic has no override.
LIST_CONFIG_DEFAULTS: dict[str, str] = {
    "cleanup.policy": "delete",
    "follower.replication.throttled.replicas": "",
    "leader.replication.throttled.replicas": "",
}


def _items(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


def apply_config_changes(
    current: Mapping[str, str], changes: Iterable[pb.ConfigChange], *, replace: bool = False
) -> dict[str, str]:
    """The topic configs after ``changes`` are applied to ``current`` (or, with ``replace``,
    to nothing), validated.

    Deleting a config that is not set (even an unknown name) is not an error, as in Kafka.
    Raises INVALID_CONFIG for APPEND/SUBTRACT of a config that is not a list, and for unknown
    names or bad values in the result."""
    configs = {} if replace else dict(current)
    for change in changes:
        name, operation = change.name, change.operation
        if operation == pb.ConfigChange.SET:
            configs[name] = change.value
        elif operation == pb.ConfigChange.DELETE:
            configs.pop(name, None)
        elif operation not in (pb.ConfigChange.APPEND, pb.ConfigChange.SUBTRACT):
            raise KafkaError(ErrorCode.invalid_request,
                             f"Unknown operation type {operation} for config {name}")
        else:
            if name not in LIST_CONFIG_DEFAULTS:
                verb = "append" if operation == pb.ConfigChange.APPEND else "subtract"
                raise KafkaError(ErrorCode.invalid_config,
                                 f"Config value {verb} is not allowed for config key: {name}")
            items = _items(configs.get(name, LIST_CONFIG_DEFAULTS[name]))
            given = _items(change.value)
            if operation == pb.ConfigChange.APPEND:
                items += [item for item in given if item not in items]
            else:
                items = [item for item in items if item not in given]
            configs[name] = ",".join(items)
    return validate_configs(configs)
