"""Topic-level log configuration (Kafka's ``LogConfig``): the node's defaults for every topic,
overridden per topic by the configs given at partition creation (Kafka's names, string values).

Only the settings the log node acts on are typed here; other topic configs (retention, cleanup
policy, ...) are stored with the partition and ignored until a feature needs them.
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

    def with_overrides(self, configs: Mapping[str, str]) -> TopicConfig:
        """These settings overridden by a topic's configs; raises INVALID_CONFIG on a bad
        value."""
        changes: dict[str, object] = {}
        for name, field in _FIELDS.items():
            if name not in configs:
                continue
            raw = configs[name]
            if field == "message_timestamp_type":
                changes[field] = raw
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
}


def _invalid(name: str, value: object, expected: str) -> KafkaError:
    return KafkaError(ErrorCode.invalid_config, f"invalid {name} {value!r}: expected {expected}")
