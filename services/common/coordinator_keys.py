"""Where a coordinator key lives: Kafka places a group id in a partition of
``__consumer_offsets`` and a transactional id in one of ``__transaction_state`` by the key's
Java string hash. The handlers' coordinator runtime stores the key's state there; the frontend
sends the requests of one such partition to one handler, so that its writes seldom race another
handler's."""

from __future__ import annotations

OFFSETS_TOPIC = "__consumer_offsets"
TRANSACTION_STATE_TOPIC = "__transaction_state"


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode``: over UTF-16 code units, 32-bit wrapping."""
    data = text.encode("utf-16-be")
    h = 0
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for(key: str, partitions: int) -> int:
    """Kafka's ``Utils.abs(key.hashCode) % partitions`` (abs of MIN_VALUE is 0)."""
    h = java_string_hash(key)
    return (0 if h == -(1 << 31) else abs(h)) % partitions
