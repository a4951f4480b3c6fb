"""Prometheus metrics of the replicator service, refreshed from each new metadata image;
each help text names the Kafka JMX metric it stands for (ReplicaManager's
UnderReplicatedPartitions and IsrShrinks/ExpandsPerSec, KafkaController's
OfflinePartitionsCount, ...).

ISR changes are counted by comparing each image with the one before (a partition whose ISR
both lost and gained members counts once each way). Follower lag and replication bytes are
measured where replication happens, by the log nodes (``kbroker_log_follower_lag_*``,
``kbroker_log_replication_*_bytes_total``).
"""

from __future__ import annotations

from services.common.metrics import Counter, Gauge

from .metadata import MetadataImage

TOPICS = Gauge("kbroker_replicator_topics", "Topics in the cluster metadata (GlobalTopicCount).")
PARTITIONS = Gauge("kbroker_replicator_partitions",
                   "Partitions of all topics (GlobalPartitionCount).")
LIVE_LOG_NODES = Gauge("kbroker_replicator_live_log_nodes",
                       "Log nodes passing health checks (ActiveBrokerCount).")
LOG_NODES = Gauge("kbroker_replicator_log_nodes", "Configured log nodes.")
METADATA_VERSION = Gauge("kbroker_replicator_metadata_version", "Current metadata version.")
UNDER_REPLICATED = Gauge(
    "kbroker_replicator_under_replicated_partitions",
    "Partitions with a replica that is offline or out of the ISR (UnderReplicatedPartitions).",
)
OFFLINE = Gauge(
    "kbroker_replicator_offline_partitions",
    "Partitions whose leader is not on a live log node (OfflinePartitionsCount).",
)
ACTIVE = Gauge(
    "kbroker_replicator_active",
    "1 while this replicator acts as the controller (holds the lease, or is the only one), 0"
    " on a standby (ActiveControllerCount).",
)
WATCHERS = Gauge("kbroker_replicator_metadata_watchers", "Open WatchMetadata streams.")
PENDING_DELETIONS = Gauge(
    "kbroker_replicator_pending_replica_deletions",
    "Replicas of deleted topics a log node has not confirmed deleting yet.",
)
REASSIGNING = Gauge(
    "kbroker_replicator_reassigning_partitions",
    "Partitions being reassigned (ReassigningPartitions).",
)
REASSIGNMENTS = Counter(
    "kbroker_replicator_reassignments_total",
    "Partition reassignments by event: started, completed, cancelled.",
    ["event"],
)
ISR_SHRINKS = Counter(
    "kbroker_replicator_isr_shrinks_total",
    "Partitions whose ISR lost a member from one metadata version to the next "
    "(IsrShrinksPerSec).",
)
ISR_EXPANDS = Counter(
    "kbroker_replicator_isr_expands_total",
    "Partitions whose ISR gained a member from one metadata version to the next "
    "(IsrExpandsPerSec).",
)
# The ISR of every partition in the last image observed, to count changes.
_last_isr: dict[tuple[str, int], frozenset[int]] = {}


def observe(image: MetadataImage) -> None:
    live = set(image.live_node_ids)
    partitions = under_replicated = offline = shrinks = expands = reassigning = 0
    isrs: dict[tuple[str, int], frozenset[int]] = {}
    for topic in image.topics.values():
        for p in topic.partitions:
            partitions += 1
            # Being reassigned, the replication factor is the target's (Kafka's).
            if len(p.isr) < len(p.target) or not live.issuperset(p.replicas):
                under_replicated += 1
            reassigning += p.reassigning
            if p.leader not in live:
                offline += 1
            key = (topic.name, p.partition)
            isr = isrs[key] = frozenset(p.isr)
            before = _last_isr.get(key)
            if before is not None and before != isr:
                shrinks += bool(before - isr)
                expands += bool(isr - before)
    _last_isr.clear()
    _last_isr.update(isrs)
    TOPICS.set(len(image.topics))
    PARTITIONS.set(partitions)
    LIVE_LOG_NODES.set(len(live))
    LOG_NODES.set(len(image.log_nodes))
    METADATA_VERSION.set(image.version)
    UNDER_REPLICATED.set(under_replicated)
    OFFLINE.set(offline)
    PENDING_DELETIONS.set(sum(len(p) for p in image.pending_deletions.values()))
    REASSIGNING.set(reassigning)
    if shrinks:
        ISR_SHRINKS.inc(shrinks)
    if expands:
        ISR_EXPANDS.inc(expands)


LEADER_ELECTIONS = Counter(
    "kbroker_replicator_leader_elections_total",
    "Leaders elected, by kind: clean (the leader failed; one from the ISR), unclean (from "
    "outside it), preferred (back to the first replica), controlled (the leader is in "
    "controlled shutdown; one from the ISR) (LeaderElectionRateAndTimeMs, "
    "UncleanLeaderElectionsPerSec).",
    ["kind"],
)
CONTROLLED_SHUTDOWNS = Counter(
    "kbroker_replicator_controlled_shutdowns_total",
    "Controlled shutdowns log nodes began: asked to stop, they hand their leaderships over "
    "first (ControlledShutdownRateAndTimeMs).",
)
REPLICA_STATE_UPDATES = Counter(
    "kbroker_replicator_replica_state_updates_total",
    "Replica states (leader or follower at an epoch) log nodes took or refused, by outcome.",
    ["outcome"],
)


