"""Prometheus metrics of the replicator service, refreshed from each new metadata image."""

from __future__ import annotations

from prometheus_client import Gauge

from .metadata import MetadataImage

TOPICS = Gauge("kbroker_replicator_topics", "Topics in the cluster metadata.")
PARTITIONS = Gauge("kbroker_replicator_partitions", "Partitions of all topics.")
LIVE_LOG_NODES = Gauge("kbroker_replicator_live_log_nodes", "Log nodes passing health checks.")
LOG_NODES = Gauge("kbroker_replicator_log_nodes", "Configured log nodes.")
METADATA_VERSION = Gauge("kbroker_replicator_metadata_version", "Current metadata version.")
UNDER_REPLICATED = Gauge(
    "kbroker_replicator_under_replicated_partitions",
    "Partitions with a replica that is offline or out of the ISR.",
)
OFFLINE = Gauge(
    "kbroker_replicator_offline_partitions", "Partitions whose leader is not on a live log node."
)
WATCHERS = Gauge("kbroker_replicator_metadata_watchers", "Open WatchMetadata streams.")
PENDING_DELETIONS = Gauge(
    "kbroker_replicator_pending_replica_deletions",
    "Replicas of deleted topics a log node has not confirmed deleting yet.",
)


def observe(image: MetadataImage) -> None:
    live = set(image.live_node_ids)
    partitions = under_replicated = offline = 0
    for topic in image.topics.values():
        for p in topic.partitions:
            partitions += 1
            if len(p.isr) < len(p.replicas) or not live.issuperset(p.replicas):
                under_replicated += 1
            if p.leader not in live:
                offline += 1
    TOPICS.set(len(image.topics))
    PARTITIONS.set(partitions)
    LIVE_LOG_NODES.set(len(live))
    LOG_NODES.set(len(image.log_nodes))
    METADATA_VERSION.set(image.version)
    UNDER_REPLICATED.set(under_replicated)
    OFFLINE.set(offline)
    PENDING_DELETIONS.set(sum(len(p) for p in image.pending_deletions.values()))
