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

SEGMENT_BYTES = "segment.bytes"
INDEX_INTERVAL_BYTES = "index.interval.bytes"
MAX_MESSAGE_BYTES = "max.message.bytes"
MESSAGE_TIMESTAMP_TYPE = "message.timestamp.type"
SEGMENT_MS = "segment.ms"
RETENTION_MS = "retention.ms"
RETENTION_BYTES = "retention.bytes"
CLEANUP_POLICY = "cleanup.policy"
DELETE_RETENTION_MS = "delete.retention.ms"
MIN_COMPACTION_LAG_MS = "min.compaction.lag.ms"
MAX_COMPACTION_LAG_MS = "max.compaction.lag.ms"
MIN_CLEANABLE_DIRTY_RATIO = "min.cleanable.dirty.ratio"
FLUSH_MESSAGES = "flush.messages"
FLUSH_MS = "flush.ms"

# Kafka's "never" for flush.messages and flush.ms: rely on the page cache.
NEVER = 2**63 - 1
CLEANUP_DELETE = "delete"
CLEANUP_COMPACT = "compact"

# Kafka's lower bound for segment.bytes: the smallest (legacy) record.
MIN_SEGMENT_BYTES = 14


class TimestampType(StrEnum):
    """message.timestamp.type: keep the producer's time, or stamp the broker's."""

    CREATE_TIME = "CreateTime"
    LOG_APPEND_TIME = "LogAppendTime"


@dataclass(frozen=True, slots=True, kw_only=True)
class TopicConfig:
    """Effective settings of one partition log."""

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
        return CLEANUP_DELETE in self._policies()

    @property
    def compacts(self) -> bool:
        return CLEANUP_COMPACT in self._policies()

    def _policies(self) -> set[str]:
        return {item.strip() for item in self.cleanup_policy.split(",") if item.strip()}

    def __post_init__(self) -> None:
        if self.segment_bytes < MIN_SEGMENT_BYTES:
            raise _invalid(SEGMENT_BYTES, self.segment_bytes, f">= {MIN_SEGMENT_BYTES}")
        if self.index_interval_bytes < 0:
            raise _invalid(INDEX_INTERVAL_BYTES, self.index_interval_bytes, ">= 0")
        if self.max_message_bytes < 0:
            raise _invalid(MAX_MESSAGE_BYTES, self.max_message_bytes, ">= 0")
        if not isinstance(self.message_timestamp_type, TimestampType):
            try:
                kind = TimestampType(self.message_timestamp_type)
            except ValueError:
                raise _invalid(
                    MESSAGE_TIMESTAMP_TYPE, self.message_timestamp_type,
                    " or ".join(t.value for t in TimestampType),
                ) from None
            object.__setattr__(self, "message_timestamp_type", kind)
        if self.segment_ms < 1:
            raise _invalid(SEGMENT_MS, self.segment_ms, ">= 1")
        if self.retention_ms < -1:
            raise _invalid(RETENTION_MS, self.retention_ms, ">= -1")
        for name, value in ((DELETE_RETENTION_MS, self.delete_retention_ms),
                            (MIN_COMPACTION_LAG_MS, self.min_compaction_lag_ms),
                            (FLUSH_MS, self.flush_ms)):
            if value < 0:
                raise _invalid(name, value, ">= 0")
        if self.flush_messages < 1:
            raise _invalid(FLUSH_MESSAGES, self.flush_messages, ">= 1")
        if self.max_compaction_lag_ms < 1:
            raise _invalid(MAX_COMPACTION_LAG_MS, self.max_compaction_lag_ms, ">= 1")
        if not 0 <= self.min_cleanable_dirty_ratio <= 1:
            raise _invalid(MIN_CLEANABLE_DIRTY_RATIO, self.min_cleanable_dirty_ratio,
                           "between 0 and 1")
        if not self._policies() <= {CLEANUP_DELETE, CLEANUP_COMPACT}:
            raise _invalid(CLEANUP_POLICY, self.cleanup_policy, "delete, compact or both")

    def with_overrides(self, configs: Mapping[str, str]) -> TopicConfig:
        """These settings overridden by a topic's configs; raises INVALID_CONFIG on a bad
        value."""
        changes: dict[str, object] = {}
        for name, field in _FIELDS.items():
            if name not in configs:
                continue
            raw = configs[name]
            if field in _TEXT_FIELDS:
                changes[field] = raw
                continue
            if field in _FLOAT_FIELDS:
                try:
                    changes[field] = float(raw)
                except ValueError:
                    raise _invalid(name, raw, "a number") from None
                continue
            try:
                changes[field] = int(raw)
            except ValueError:
                raise _invalid(name, raw, "an integer") from None
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


_FIELDS = {
    SEGMENT_BYTES: "segment_bytes",
    INDEX_INTERVAL_BYTES: "index_interval_bytes",
    MAX_MESSAGE_BYTES: "max_message_bytes",
    MESSAGE_TIMESTAMP_TYPE: "message_timestamp_type",
    SEGMENT_MS: "segment_ms",
    RETENTION_MS: "retention_ms",
    RETENTION_BYTES: "retention_bytes",
    CLEANUP_POLICY: "cleanup_policy",
    DELETE_RETENTION_MS: "delete_retention_ms",
    MIN_COMPACTION_LAG_MS: "min_compaction_lag_ms",
    MAX_COMPACTION_LAG_MS: "max_compaction_lag_ms",
    MIN_CLEANABLE_DIRTY_RATIO: "min_cleanable_dirty_ratio",
    FLUSH_MESSAGES: "flush_messages",
    FLUSH_MS: "flush_ms",
}
_TEXT_FIELDS = frozenset({"message_timestamp_type", "cleanup_policy"})
_FLOAT_FIELDS = frozenset({"min_cleanable_dirty_ratio"})


def _invalid(name: str, value: object, expected: str) -> KafkaError:
    return KafkaError(ErrorCode.invalid_config, f"invalid {name} {value!r}: expected {expected}")
