"""Replication throttles on one log node (Kafka's ``ReplicationQuotaManager``, one per
direction), as an operator sets them for a reassignment: which replicas are throttled is each
topic's ``leader.replication.throttled.replicas`` (what this node serves while it leads the
replica's partition) and ``follower.replication.throttled.replicas`` (what it fetches while it
follows), as ``partition:node`` items naming this node, or ``*`` for every replica; how fast is
this node's ``leader.replication.throttled.rate`` and ``follower.replication.throttled.rate``
(bytes/s, dynamic broker configs the replicator sends; unlimited when unset).

Each direction has a token bucket holding one second of its rate. As in Kafka, a throttled
replica that is in sync is never held back: the leader leaves a throttled partition's records
out of its answer to a follower outside the ISR while its bucket is empty (the fetch then waits
like one without data), and a follower that has not caught up leaves a throttled partition out
of its fetch while its bucket is empty; the bytes of throttled replicas are taken from the
bucket once sent (leader) or appended (follower). Not thread-safe.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping

from . import metrics

LEADER, FOLLOWER = "leader", "follower"
# Kafka's unlimited replication quota (Long.MAX_VALUE).
UNLIMITED = 2**63 - 1


@functools.lru_cache(maxsize=1024)
def throttled_replicas(value: str) -> frozenset[tuple[int, int]] | None:
    """The (partition, node) pairs a ``*.replication.throttled.replicas`` value names; None
    for ``*`` (all of them)."""
    text = value.strip()
    if text == "*":
        return None
    pairs = set()
    for item in text.split(","):
        partition, _, node = item.strip().partition(":")
        if partition.strip().isdigit() and node.strip().isdigit():
            pairs.add((int(partition), int(node)))
    return frozenset(pairs)


class ReplicationQuota:
    """One direction (``leader`` or ``follower``) of this node's replication throttle."""

    def __init__(self, direction: str, node_id: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.direction = direction
        self.node_id = node_id
        self._config = f"{direction}.replication.throttled.replicas"
        self._clock = clock
        self.rate = UNLIMITED
        self._tokens = 0.0
        self._at = clock()

    def set_rate(self, rate: int) -> None:
        """Bytes per second (:data:`UNLIMITED`: no throttle); a new rate starts full."""
        if rate != self.rate:
            self.rate = max(rate, 1)
            self._tokens, self._at = float(self.rate), self._clock()

    @property
    def limited(self) -> bool:
        return self.rate < UNLIMITED

    def is_throttled(self, topic_configs: Mapping[str, str], partition: int) -> bool:
        """Whether this node's replica of ``partition`` is throttled in this direction by its
        topic's configs (and a rate is set)."""
        if not self.limited:
            return False
        value = topic_configs.get(self._config, "")
        if not value.strip():
            return False
        pairs = throttled_replicas(value)
        return pairs is None or (partition, self.node_id) in pairs

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(float(self.rate), self._tokens + (now - self._at) * self.rate)
        self._at = now

    def exceeded(self) -> bool:
        """Whether the bucket is empty (throttled replicas wait)."""
        if not self.limited:
            return False
        self._refill()
        return self._tokens <= 0

    def delay(self) -> float:
        """Seconds until the bucket holds a token again (0: now)."""
        if not self.exceeded():
            return 0.0
        return -self._tokens / self.rate + 0.001

    def record(self, size: int) -> None:
        """``size`` bytes of throttled replicas went through."""
        if not self.limited or not size:
            return
        self._refill()
        self._tokens -= size
        metrics.THROTTLED_REPLICATION_BYTES.labels(self.direction).inc(size)
