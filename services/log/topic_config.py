"""Topic-level log configuration (Kafka's ``LogConfig``): the node's defaults for every topic,
overridden per topic by the configs given at partition creation (Kafka's names, string values).

Only the settings the log node acts on are typed here (segments and indexes, validation,
retention, compaction, flushing); other topic configs (min.insync.replicas, compression.type,
...) are stored with the partition and left to the services that act on them. Validation of
names and ranges is the controller's job; values that reach a log node are parsed, and a bad one
is INVALID_CONFIG.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from services.common.errors import ErrorCode, KafkaError

# Kafka's "never" for flush.messages and flush.ms: rely on the page cache.
NEVER = 2**63 - 1
CLEANUP_DELETE = "delete"
CLEANUP_COMPACT = "compact"

# The lowest value of each integer setting that has one (Kafka's; for segment.bytes, the
# smallest legacy record), in the order they are checked.
_MINIMUMS = {"segment_bytes": 14, "index_interval_bytes": 0, "max_message_bytes": 0,
             "segment_ms": 1, "retention_ms": -1, "delete_retention_ms": 0,
             "min_compaction_lag_ms": 0, "flush_ms": 0, "flush_messages": 1,
             "max_compaction_lag_ms": 1}


class TimestampType(StrEnum):
    """message.timestamp.type: keep the producer's time, or stamp the broker's."""

    CREATE_TIME = "CreateTime"
    LOG_APPEND_TIME = "LogAppendTime"


@dataclass(frozen=True, slots=True, kw_only=True)
class TopicConfig:
    """Effective settings of one partition log: each field is the topic config of its name
    with dots (``segment_bytes`` is ``segment.bytes``)."""

    segment_bytes: int = 1073741824
    index_interval_bytes: int = 4096
    max_message_bytes: int = 1048588
    message_timestamp_type: TimestampType = TimestampType.CREATE_TIME
    # Roll the active segment when its first batch is this much older than an append's.
    segment_ms: int = 604800000
    # Delete non-active segments whose newest batch is older than this (-1: never).
    retention_ms: int = 604800000
    # Delete the oldest non-active segments while the log is larger than this (-1: never).
    retention_bytes: int = -1
    # "delete", "compact" or both (comma-separated, as Kafka writes lists).
    cleanup_policy: str = CLEANUP_DELETE
    # How long the cleaner keeps tombstones (records with a key and no value).
    delete_retention_ms: int = 86400000
    # Records younger than this are never compacted away.
    min_compaction_lag_ms: int = 0
    # A dirty record older than this makes the log worth cleaning whatever its dirty ratio.
    max_compaction_lag_ms: int = NEVER
    # Clean a compacted log when its dirty bytes exceed this share of its cleanable bytes.
    min_cleanable_dirty_ratio: float = 0.5
    # Force appended data to disk every this many messages / milliseconds.
    flush_messages: int = NEVER
    flush_ms: int = NEVER

    @property
    def deletes(self) -> bool:
        # A substring test (asked at every append): the policies were checked to be these two.
        return CLEANUP_DELETE in self.cleanup_policy

    @property
    def compacts(self) -> bool:
        return CLEANUP_COMPACT in self.cleanup_policy

    def _policies(self) -> set[str]:
        return {item.strip() for item in self.cleanup_policy.split(",") if item.strip()}

    def __post_init__(self) -> None:
        for field, minimum in _MINIMUMS.items():
            if getattr(self, field) < minimum:
                raise _invalid(field, getattr(self, field), f">= {minimum}")
        if not isinstance(self.message_timestamp_type, TimestampType):
            try:
                kind = TimestampType(self.message_timestamp_type)
            except ValueError:
                raise _invalid("message_timestamp_type", self.message_timestamp_type,
                               " or ".join(t.value for t in TimestampType)) from None
            object.__setattr__(self, "message_timestamp_type", kind)
        if not 0 <= self.min_cleanable_dirty_ratio <= 1:
            raise _invalid("min_cleanable_dirty_ratio", self.min_cleanable_dirty_ratio,
                           "between 0 and 1")
        if not self._policies() <= {CLEANUP_DELETE, CLEANUP_COMPACT}:
            raise _invalid("cleanup_policy", self.cleanup_policy, "delete, compact or both")

    def with_overrides(self, configs: Mapping[str, str]) -> TopicConfig:
        """These settings overridden by a topic's configs; raises INVALID_CONFIG on a bad
        value."""
        changes: dict[str, object] = {}
        for field in dataclasses.fields(self):
            raw = configs.get(field.name.replace("_", "."))
            parse, expected = _PARSERS.get(str(field.type), (str, ""))
            if raw is not None:
                try:
                    changes[field.name] = parse(raw)
                except ValueError:
                    raise _invalid(field.name, raw, expected) from None
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


_PARSERS = {"int": (int, "an integer"), "float": (float, "a number")}


def _invalid(field: str, value: object, expected: str) -> KafkaError:
    return KafkaError(ErrorCode.invalid_config,
                      f"invalid {field.replace('_', '.')} {value!r}: expected {expected}")
