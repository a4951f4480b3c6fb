"""Which handler a coordinator request goes to first: the requests of one partition of
``__consumer_offsets`` (group APIs) or ``__transaction_state`` (transaction APIs) go to one
handler, picked by rendezvous hashing over the handlers, so every frontend picks the same one.

Handlers are stateless and any of them can serve any group: a coordinator change is a
conditional append to the key's partition, read again and retried when another handler wrote
there first (``services.handler.coordinator``). When one handler writes a partition, its cached
state is current and its writes do not race: it appends without reading the partition again
first. The partition is found as the handlers find it (the key's Java string hash over the
topic's partition count, from the cluster metadata the frontend follows); before the topic is
known, the key alone is hashed."""

from __future__ import annotations

from typing import Any

from services.common.coordinator_keys import (
    OFFSETS_TOPIC,
    TRANSACTION_STATE_TOPIC,
    partition_for,
)

_GROUP_APIS = frozenset({8, 11, 12, 13, 14, 28, 47, 68})  # the coordinator is the group's
_TRANSACTION_APIS = frozenset({22, 25, 26})  # the coordinator is the transactional id's
OFFSET_FETCH = 9
ADD_PARTITIONS_TO_TXN = 24


def _optional(message: Any, field: str) -> str | None:
    return getattr(message, field) if message.HasField(field) else None


def coordinator_key(api_key: int, message: Any) -> tuple[str, str] | None:
    """(internal topic, key) of the coordinator a request writes to or reads, None for a
    request of no single coordinator key."""
    if api_key in _GROUP_APIS:
        key = _optional(message, "group_id")
        return None if key is None else (OFFSETS_TOPIC, key)
    if api_key in _TRANSACTION_APIS:
        key = _optional(message, "transactional_id")
        return None if key is None else (TRANSACTION_STATE_TOPIC, key)
    if api_key == OFFSET_FETCH:
        key = _optional(message, "group_id") or (
            message.groups[0].group_id if len(message.groups) == 1 else None)
        return None if not key else (OFFSETS_TOPIC, key)
    if api_key == ADD_PARTITIONS_TO_TXN:
        key = _optional(message, "v3_and_below_transactional_id") or (
            message.transactions[0].transactional_id if len(message.transactions) == 1
            else None)
        return None if not key else (TRANSACTION_STATE_TOPIC, key)
    return None


class CoordinatorAffinity:
    """The affinity of coordinator requests; a cluster metadata listener (partition counts of
    the internal topics)."""

    def __init__(self) -> None:
        self._partitions: dict[str, int] = {}

    def on_metadata(self, snapshot: Any) -> None:
        self._partitions = {t.name: len(t.partitions) for t in snapshot.topics
                            if t.name in (OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC)}

    def of(self, api_key: int, message: Any) -> str | None:
        """What a request's handler is chosen by: its coordinator partition (e.g.
        ``__consumer_offsets-7``), or its key while the partitions are unknown; None for
        requests of no coordinator key."""
        found = coordinator_key(api_key, message)
        if found is None:
            return None
        topic, key = found
        partitions = self._partitions.get(topic)
        return f"{topic}:{key}" if not partitions else f"{topic}-{partition_for(key, partitions)}"
