"""Prometheus metrics of the replicator service, refreshed from each new metadata image;
each help text names the Kafka JMX metric it stands for (ReplicaManager's
UnderReplicatedPartitions and IsrShrinks/ExpandsPerSec, KafkaController's
OfflinePartitionsCount, FetcherLagMetrics' ConsumerLag, ...).

ISR changes are counted by comparing each image with the one before (a partition whose ISR
both lost and gained members counts once each way). Follower lag (offsets, and seconds since
last caught up) is what follower fetching measures, for every follower it copies to; other
followers have no samples rather than made-up zeros.
"""

from __future__ import annotations

import contextlib

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
FOLLOWER_LAG = Gauge(
    "kbroker_replicator_follower_lag_messages",
    "Messages a follower replica is behind its leader's log end (FetcherLagMetrics "
    "ConsumerLag); reported only for followers the replicator fetches for.",
    ["topic", "partition", "replica"],
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


FOLLOWER_LAG_SECONDS = Gauge(
    "kbroker_replicator_follower_lag_seconds",
    "Seconds since a follower replica was last caught up with its leader's log end "
    "(what replica.lag.time.max.ms is compared with).",
    ["topic", "partition", "replica"],
)
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
REPLICATED_BYTES = Counter(
    "kbroker_replicator_replicated_bytes_total",
    "Bytes of record batches copied from leaders to followers (ReplicationBytesInPerSec).",
)
THROTTLED_REPLICATED_BYTES = Counter(
    "kbroker_replicator_throttled_replicated_bytes_total",
    "Bytes copied for throttled replicas (leader/follower.replication.throttled.replicas), "
    "counted against the replication throttle rates (LeaderReplication and "
    "FollowerReplication byte rates).",
)
HIGH_WATERMARK_PUSHES = Counter(
    "kbroker_replicator_high_watermark_pushes_total",
    "UpdateHighWatermarks calls to leader log nodes, by outcome.",
    ["outcome"],
)
HIGH_WATERMARK_MOVES = Counter(
    "kbroker_replicator_high_watermark_moves_total",
    "Times a replicated partition's high watermark moved forward.",
)
REPLICA_STATE_UPDATES = Counter(
    "kbroker_replicator_replica_state_updates_total",
    "Replica states (leader or follower at an epoch) log nodes took or refused, by outcome.",
    ["outcome"],
)


def observe_follower(topic: str, partition: int, replica: int, messages: int,
                     seconds: float) -> None:
    """A follower's lag as follower fetching measures it: messages behind the leader's log end
    and seconds since it was last caught up (each -1: unknown, no sample)."""
    labels = (topic, str(partition), str(replica))
    if messages >= 0:
        FOLLOWER_LAG.labels(*labels).set(messages)
    if seconds >= 0:
        FOLLOWER_LAG_SECONDS.labels(*labels).set(seconds)


def forget_follower(topic: str, partition: int, replica: int) -> None:
    """Drop a follower's lag samples (its partition moved or went away)."""
    labels = (topic, str(partition), str(replica))
    for gauge in (FOLLOWER_LAG, FOLLOWER_LAG_SECONDS):
        with contextlib.suppress(KeyError):
            gauge.remove(*labels)
