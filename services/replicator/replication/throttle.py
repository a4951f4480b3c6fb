"""Replication throttles (Kafka's replication quotas, ``ReplicationQuotaManager``), as an
operator sets them for a reassignment: which replicas are throttled is each topic's
``leader.replication.throttled.replicas`` (``partition:node`` items, or ``*`` for every
replica; the throttle applies to what that replica sends while it leads) and
``follower.replication.throttled.replicas`` (what that replica receives while it follows); how
fast is each log node's ``leader.replication.throttled.rate`` and
``follower.replication.throttled.rate`` (bytes/s, dynamic broker configs, per node or
cluster-wide; unlimited by default).

Each (node, direction) has a token bucket of one second of its rate. A copy to a follower is
held back while a bucket it counts against is empty (Kafka leaves throttled partitions out of
the fetch while the quota is exceeded) and its bytes are taken from the buckets once
appended. Copies of replicas that are not throttled are never held back and take nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from .. import metrics
from ..controller.config_resources import FOLLOWER_RATE, LEADER_RATE, UNLIMITED, broker_config
from ..metadata import MetadataImage, NodeId

LEADER_REPLICAS = "leader.replication.throttled.replicas"
FOLLOWER_REPLICAS = "follower.replication.throttled.replicas"

TopicPartition = tuple[str, int]


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


@dataclass(slots=True)
class Bucket:
    rate: float
    tokens: float
    at: float

    def refill(self, now: float) -> None:
        self.tokens = min(self.rate, self.tokens + (now - self.at) * self.rate)
        self.at = now

    def delay(self, now: float) -> float:
        self.refill(now)
        return 0.0 if self.tokens > 0 else -self.tokens / self.rate + 0.001


class ReplicationThrottle:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._rates: dict[tuple[str, NodeId], int] = {}
        self._buckets: dict[tuple[str, NodeId], Bucket] = {}
        # topic -> (leader-side pairs, follower-side pairs); None inside: every replica.
        self._replicas: dict[str, tuple[frozenset[tuple[int, int]] | None,
                                        frozenset[tuple[int, int]] | None]] = {}

    def update(self, image: MetadataImage) -> None:
        """Take the throttled replicas and rates of ``image``."""
        replicas: dict[str, tuple[frozenset[tuple[int, int]] | None,
                                  frozenset[tuple[int, int]] | None]] = {}
        for topic in image.topics.values():
            leader = topic.configs.get(LEADER_REPLICAS, "")
            follower = topic.configs.get(FOLLOWER_REPLICAS, "")
            if leader.strip() or follower.strip():
                replicas[topic.name] = (throttled_replicas(leader),
                                        throttled_replicas(follower))
        self._replicas = replicas
        rates: dict[tuple[str, NodeId], int] = {}
        for node in image.log_nodes:
            for direction, name in (("leader", LEADER_RATE), ("follower", FOLLOWER_RATE)):
                value = broker_config(image, node.node_id, name)
                rate = int(value) if value is not None else UNLIMITED
                if rate < UNLIMITED:
                    rates[(direction, node.node_id)] = rate
        self._rates = rates
        now = self._clock()
        for key in list(self._buckets):
            if self._buckets[key].rate != rates.get(key):
                del self._buckets[key]
        for key, rate in rates.items():
            if key not in self._buckets:
                self._buckets[key] = Bucket(rate=float(max(rate, 1)), tokens=float(rate), at=now)

    def _limits(self, key: TopicPartition, leader: NodeId, follower: NodeId
                ) -> list[Bucket]:
        sides = self._replicas.get(key[0])
        if sides is None or not self._buckets:
            return []
        found = []
        for direction, node, pairs in (("leader", leader, sides[0]),
                                       ("follower", follower, sides[1])):
            bucket = self._buckets.get((direction, node))
            if bucket is not None and (pairs is None or (key[1], node) in pairs):
                found.append(bucket)
        return found

    def delay(self, key: TopicPartition, leader: NodeId, follower: NodeId) -> float:
        """Seconds until the copy of ``key`` from ``leader`` to ``follower`` may go on (0:
        now)."""
        limits = self._limits(key, leader, follower)
        if not limits:
            return 0.0
        now = self._clock()
        return max(b.delay(now) for b in limits)

    def record(self, key: TopicPartition, leader: NodeId, follower: NodeId, size: int) -> None:
        """``size`` bytes of ``key`` were copied from ``leader`` to ``follower``."""
        limits = self._limits(key, leader, follower)
        if not limits or not size:
            return
        now = self._clock()
        for bucket in limits:
            bucket.refill(now)
            bucket.tokens -= size
        metrics.THROTTLED_REPLICATED_BYTES.inc(size)

    @property
    def rates(self) -> Mapping[tuple[str, NodeId], int]:
        return dict(self._rates)
