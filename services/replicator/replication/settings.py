"""What each log node needs to replicate, as the replicator sends it
(``LogService.UpdateReplicationSettings``): Kafka's ``replica.*`` settings (the replicator's
flags, the same for every node), the node's replication throttle rates (its dynamic broker
configs, else the cluster-wide ones; unset: unlimited) and every log node's address (a
follower reaches its leader there)."""

from __future__ import annotations

from dataclasses import dataclass

from kbroker.log.v1 import log_pb2

from ..controller.config_resources import FOLLOWER_RATE, LEADER_RATE, broker_config
from ..metadata import MetadataImage, NodeId


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaSettings:
    """Kafka's replica.* settings, as the replicator's flags give them."""

    lag_time_max_ms: int = 30_000
    fetch_wait_max_ms: int = 500
    fetch_max_bytes: int = 1 << 20
    fetch_response_max_bytes: int = 10 << 20
    fetch_backoff_ms: int = 200

    def configs(self) -> dict[str, str]:
        return {"replica.lag.time.max.ms": str(self.lag_time_max_ms),
                "replica.fetch.wait.max.ms": str(self.fetch_wait_max_ms),
                "replica.fetch.max.bytes": str(self.fetch_max_bytes),
                "replica.fetch.response.max.bytes": str(self.fetch_response_max_bytes),
                "replica.fetch.backoff.ms": str(self.fetch_backoff_ms)}


def node_settings(image: MetadataImage, node: NodeId,
                  replica: ReplicaSettings) -> log_pb2.ReplicationSettings:
    """The settings of log node ``node`` in ``image``."""
    configs = replica.configs()
    for name in (LEADER_RATE, FOLLOWER_RATE):
        value = broker_config(image, node, name)
        if value is not None:
            configs[name] = value
    return log_pb2.ReplicationSettings(
        configs=configs, log_nodes={n.node_id: n.address for n in image.log_nodes})
