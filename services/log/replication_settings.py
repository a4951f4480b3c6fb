"""What a log node needs to replicate, as the replicator sends it (``UpdateReplicationSettings``):
Kafka's ``replica.*`` broker settings, this node's replication throttle rates and the address
of every log node. Until the replicator first sends them a node has Kafka's defaults and no
addresses (its followers cannot fetch yet; they have no state either until it speaks).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from kbroker.log.v1 import log_pb2

from .replication_quota import UNLIMITED

# Kafka's names of the settings, by field.
NAMES = {
    "lag_time_max_ms": "replica.lag.time.max.ms",
    "fetch_wait_max_ms": "replica.fetch.wait.max.ms",
    "fetch_max_bytes": "replica.fetch.max.bytes",
    "fetch_response_max_bytes": "replica.fetch.response.max.bytes",
    "fetch_backoff_ms": "replica.fetch.backoff.ms",
    "leader_throttled_rate": "leader.replication.throttled.rate",
    "follower_throttled_rate": "follower.replication.throttled.rate",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicationSettings:
    """Kafka's defaults unless the replicator said otherwise."""

    # A follower not caught up for this long leaves the ISR (the leader asks).
    lag_time_max_ms: int = 30_000
    # How long a follower's fetch waits on the leader for data.
    fetch_wait_max_ms: int = 500
    # Bytes per partition, and in all, a follower's fetch asks for.
    fetch_max_bytes: int = 1 << 20
    fetch_response_max_bytes: int = 10 << 20
    # Pause before a failed fetch (or a partition that failed) is tried again.
    fetch_backoff_ms: int = 1000
    # Bytes/s of throttled replicas this node serves as leader and fetches as follower.
    leader_throttled_rate: int = UNLIMITED
    follower_throttled_rate: int = UNLIMITED
    log_nodes: Mapping[int, str] = field(default_factory=dict)

    @classmethod
    def of(cls, message: log_pb2.ReplicationSettings) -> ReplicationSettings:
        """The settings a message names (unparsable values keep the default)."""
        values: dict[str, object] = {}
        for name, config in NAMES.items():
            raw = message.configs.get(config)
            if raw is None:
                continue
            try:
                values[name] = int(raw)
            except ValueError:
                continue
        return cls(**values, log_nodes=dict(message.log_nodes))  # type: ignore[arg-type]
