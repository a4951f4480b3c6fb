"""The log node's Prometheus metrics (seconds and bytes), registered in the process registry
that services.common serves over HTTP and gRPC.

Rates come from counters (appended and read bytes and batches per topic); per-partition
state is read from the live logs at scrape time by :class:`PartitionLogCollector`, so the hot
paths pay nothing for it. Kafka's JMX names beside ours:

    kbroker_log_appended_bytes_total{topic}        kafka.server:type=BrokerTopicMetrics,
                                                   name=BytesInPerSec (replica appends)
    kbroker_log_read_bytes_total{topic}            ... name=BytesOutPerSec (replica reads)
    kbroker_log_partition_segments{topic,partition}  kafka.log:type=Log,name=NumLogSegments
    kbroker_log_partition_size_bytes{topic,partition}  kafka.log:type=Log,name=Size
    kbroker_log_partition_log_end_offset{...}      kafka.log:type=Log,name=LogEndOffset
    kbroker_log_partition_log_start_offset{...}    kafka.log:type=Log,name=LogStartOffset
    kbroker_log_partition_last_stable_offset_lag{...}  kafka.cluster:type=Partition,
                                                   name=LastStableOffsetLag
    kbroker_log_ongoing_transactions               (the sum over the node's replicas of the
                                                   transactions ongoing on them)
    kbroker_log_txn_markers_total{type}            markers written as a leader
    kbroker_log_aborted_transactions_total         aborted transactions indexed
    kbroker_log_flush_seconds                      kafka.log:type=LogFlushStats,
                                                   name=LogFlushRateAndTimeMs (per segment)
    kbroker_log_offline_log_dirs                   kafka.log:type=LogManager,
                                                   name=OfflineLogDirectoryCount
    kbroker_log_offline_replicas                   kafka.server:type=ReplicaManager,
                                                   name=OfflineReplicaCount
    kbroker_log_dir_{total,free,used}_bytes{log_dir}  the log dir's file system (Kafka's
                                                   DescribeLogDirs TotalBytes, UsableBytes)
    kbroker_log_dir_partition_bytes{log_dir}       bytes held by the replicas (the sum of
                                                   kafka.log:type=Log,name=Size)
    kbroker_log_dir_min_free_bytes{log_dir}        the free-space floor (0: none)
    kbroker_log_replication_in_bytes_total         kafka.server:type=BrokerTopicMetrics,
                                                   name=ReplicationBytesInPerSec
    kbroker_log_replication_out_bytes_total        ... name=ReplicationBytesOutPerSec
    kbroker_log_throttled_replication_bytes_total{direction}  the bytes counted against the
                                                   replication throttles (LeaderReplication,
                                                   FollowerReplication byte rates)
    kbroker_log_follower_lag_messages{topic,partition,replica}  FetcherLagMetrics ConsumerLag,
                                                   as the leader sees each follower
    kbroker_log_follower_lag_seconds{...}          time since the follower was last caught up
                                                   (what replica.lag.time.max.ms is compared with)
    kbroker_log_follower_fetches_total             kafka.network:type=RequestMetrics,
                                                   name=RequestsPerSec,request=FetchFollower
    kbroker_log_isr_change_requests_total{kind}    AlterPartition requests of this node's
                                                   leaders (IsrShrinksPerSec, IsrExpandsPerSec)
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from services.common.metrics import (
    LATENCY_BUCKETS,
    Counter,
    Gauge,
    Histogram,
    LoopCounter,
    LoopHistogram,
    register_collector,
)

from .log_dir_failure import DiskUsage

APPENDED_BYTES = LoopCounter(
    "kbroker_log_appended_bytes_total",
    "Bytes of record batches appended, as leader and as follower (BytesInPerSec).", ["topic"]
)
APPENDED_BATCHES = LoopCounter(
    "kbroker_log_appended_batches_total", "Record batches appended.", ["topic"]
)
APPEND_REQUESTS = LoopCounter(
    "kbroker_log_append_requests_total", "Partition appends attempted (one per partition of an "
    "Append call).", ["topic"]
)
COMMIT_WAIT_SECONDS = LoopHistogram(
    "kbroker_log_commit_wait_seconds",
    "Time the answer to an acks=all partition append or a transaction marker waited for the "
    "high watermark to pass it (commit_wait_ms), by outcome: committed (answered committed, so "
    "the produce or marker did not wait in the purgatory) or handed_on (not committed within "
    "the wait, or the replica stopped leading at that epoch: it waits in the purgatory).",
    ["outcome"],
    buckets=LATENCY_BUCKETS)
READ_BYTES = LoopCounter(
    "kbroker_log_read_bytes_total",
    "Bytes of record batches read, for consumers and followers (BytesOutPerSec).", ["topic"])
APPEND_SECONDS = LoopHistogram(
    "kbroker_log_append_seconds", "Time to validate and append one partition's batches.",
    buckets=LATENCY_BUCKETS,
)
READ_SECONDS = LoopHistogram(
    "kbroker_log_read_seconds", "Time to serve one Read call.", buckets=LATENCY_BUCKETS
)
PARTITIONS = Gauge("kbroker_log_partitions",
                   "Partition replicas held by this node (PartitionCount).")
ERRORS = Counter(
    "kbroker_log_errors_total", "Partition-level Kafka errors returned, by API and error name.",
    ["api", "error"],
)
class TopicMetrics(NamedTuple):
    """The per-topic children of one topic, bound once: an append or read pays no label
    lookups (each takes a lock and hashes the labels)."""

    append_requests: Any
    appended_bytes: Any
    appended_batches: Any
    read_bytes: Any


@functools.cache
def topic(name: str) -> TopicMetrics:
    """The metrics of topic ``name`` (a node holds few topics: the cache stays small)."""
    return TopicMetrics(*(m.labels(name) for m in (APPEND_REQUESTS, APPENDED_BYTES,
                                                   APPENDED_BATCHES, READ_BYTES)))


FLUSH_SECONDS = Histogram(
    "kbroker_log_flush_seconds",
    "Time to force one segment's files (log and indexes) to disk (LogFlushRateAndTimeMs).",
    buckets=LATENCY_BUCKETS,
)
TRUNCATED_BYTES = Counter(
    "kbroker_log_recovery_truncated_bytes_total",
    "Bytes of torn or corrupt log tails removed during recovery at start-up.",
)
PURGATORY_NOTIFICATIONS = Counter(
    "kbroker_log_purgatory_notifications_total",
    "CheckAndComplete calls sent to the purgatory, by outcome.", ["outcome"],
)
TXN_MARKERS = Counter(
    "kbroker_log_txn_markers_total",
    "Transaction markers this node wrote as a partition leader, by type (COMMIT, ABORT).",
    ["type"],
)
ABORTED_TRANSACTIONS = Counter(
    "kbroker_log_aborted_transactions_total",
    "Transactions with data on a partition that an ABORT marker ended (entries added to the "
    "transaction indexes of this node's replicas, leaders and followers).",
)
CLEANER_RUNS = Counter(
    "kbroker_log_cleaner_runs_total", "Partition logs cleaned (compacted) by the log cleaner."
)
CLEANER_READ_BYTES = Counter(
    "kbroker_log_cleaner_read_bytes_total", "Bytes of segments the log cleaner rewrote."
)
CLEANER_REMOVED_BYTES = Counter(
    "kbroker_log_cleaner_removed_bytes_total",
    "Bytes the log cleaner removed (read minus written).",
)
CLEANER_REMOVED_RECORDS = Counter(
    "kbroker_log_cleaner_removed_records_total",
    "Records the log cleaner removed (superseded keys, expired tombstones, keyless records).",
)
REPLICATION_BYTES_IN = Counter(
    "kbroker_log_replication_in_bytes_total",
    "Bytes of record batches this node appended as a follower, fetched from its leaders "
    "(ReplicationBytesInPerSec).",
)
REPLICATION_BYTES_OUT = Counter(
    "kbroker_log_replication_out_bytes_total",
    "Bytes of record batches this node sent to its followers as a leader "
    "(ReplicationBytesOutPerSec).",
)
THROTTLED_REPLICATION_BYTES = Counter(
    "kbroker_log_throttled_replication_bytes_total",
    "Bytes of throttled replicas (leader/follower.replication.throttled.replicas) counted "
    "against this node's replication throttle rates, by direction: leader (sent) or "
    "follower (fetched) (LeaderReplication and FollowerReplication byte rates).",
    ["direction"],
)
FOLLOWER_FETCHES = Counter(
    "kbroker_log_follower_fetches_total",
    "Fetches this node served to its followers as a leader (RequestsPerSec of FetchFollower).",
)
ISR_CHANGE_REQUESTS = Counter(
    "kbroker_log_isr_change_requests_total",
    "ISR changes this node's leaders asked the controller for, by kind: expand (a follower "
    "caught up) or shrink (one fell behind for replica.lag.time.max.ms) (AlterPartition; "
    "IsrExpandsPerSec and IsrShrinksPerSec count the committed ones).",
    ["kind"],
)
CLEANER_LAST_SECONDS = Gauge(
    "kbroker_log_cleaner_last_duration_seconds",
    "Duration of the last log cleaner round that cleaned something.",
)


# Per-partition gauges: name, help, and the partition log's property they report.
_PARTITION_GAUGES = (
    ("kbroker_log_partition_segments", "Segments of a partition replica (NumLogSegments).",
     "segment_count"),
    ("kbroker_log_partition_size_bytes", "Bytes in a partition replica's segments (Log Size).",
     "size_bytes"),
    ("kbroker_log_partition_log_end_offset", "Offset the next append gets (LogEndOffset).",
     "log_end_offset"),
    ("kbroker_log_partition_log_start_offset", "First offset still readable (LogStartOffset).",
     "log_start_offset"),
    ("kbroker_log_partition_last_stable_offset_lag",
     "High watermark minus last stable offset: what read_committed consumers wait for "
     "(LastStableOffsetLag).", "last_stable_offset_lag"),
)


class PartitionLogCollector(Collector):
    """Per-partition gauges read from the live partition logs whenever metrics are collected:
    segments, bytes, log end and log start offsets, last stable offset lag; and the node's
    ongoing transactions, summed over them. Reads public properties only (no locks: a scrape
    during an append sees one side of it, as any gauge would).

    Sources are callables returning partition logs (``LogManager.partitions``), added while
    their node runs; a process has one log node, tests may run several."""

    def __init__(self) -> None:
        self.sources: set[Callable[[], Iterable[Any]]] = set()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        families = [(GaugeMetricFamily(name, text, labels=["topic", "partition"]), attribute)
                    for name, text, attribute in _PARTITION_GAUGES]
        ongoing = 0
        for source in list(self.sources):
            for log in list(source()):
                key = [log.topic, str(log.partition)]
                for family, attribute in families:
                    family.add_metric(key, getattr(log, attribute))
                ongoing += log.ongoing_transactions
        yield from (family for family, _ in families)
        yield GaugeMetricFamily(
            "kbroker_log_ongoing_transactions",
            "Transactions ongoing on the replicas of this node (begun, no marker yet).",
            value=ongoing)

    def describe(self) -> list[GaugeMetricFamily]:
        # Registering must not call collect(): the logs may not be loaded yet.
        return []


PARTITION_LOGS = PartitionLogCollector()
register_collector(PARTITION_LOGS)


class LogDirCollector(Collector):
    """The log directory of each running node (sources: ``LogManager`` objects): whether it
    is offline, the replicas that took offline, and the disk usage of its file system (read
    at scrape time; a file system that cannot be read leaves its usage out)."""

    def __init__(self) -> None:
        self.sources: set[Any] = set()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        offline = GaugeMetricFamily(
            "kbroker_log_offline_log_dirs",
            "Log directories that failed (an I/O error or the free-space floor); they stay "
            "offline until the node restarts (OfflineLogDirectoryCount).", labels=["log_dir"])
        replicas = GaugeMetricFamily(
            "kbroker_log_offline_replicas",
            "Partition replicas offline because their log directory failed "
            "(OfflineReplicaCount).", labels=["log_dir"])
        usage = {name: GaugeMetricFamily(f"kbroker_log_dir_{name}_bytes", text,
                                         labels=["log_dir"]) for name, text in (
            ("total", "Size of the file system holding the log directory."),
            ("free", "Bytes of that file system still free for the log node."),
            ("used", "Bytes of that file system in use (by anything)."),
            ("partition", "Bytes held by the partition replicas' segments."),
            ("min_free", "The free-space floor: a write that would leave less fails the "
                         "log directory (0: none)."))}
        for manager in list(self.sources):
            log_dir = manager.log_dir
            key = [str(log_dir.path)]
            offline.add_metric(key, int(log_dir.offline))
            replicas.add_metric(key, manager.offline_replicas())
            usage["partition"].add_metric(key, sum(p.size_bytes for p in manager.partitions()))
            try:
                disk = DiskUsage.of(log_dir.path)
            except OSError:
                continue
            usage["total"].add_metric(key, disk.total)
            usage["free"].add_metric(key, disk.free)
            usage["used"].add_metric(key, disk.used)
            usage["min_free"].add_metric(key, log_dir.floor.bytes_for(disk.total))
        yield offline
        yield replicas
        yield from usage.values()

    def describe(self) -> list[GaugeMetricFamily]:
        return []


LOG_DIRS = LogDirCollector()
register_collector(LOG_DIRS)


class FollowerLagCollector(Collector):
    """Each follower's lag as its leader on this node sees it, read at scrape time: messages
    behind the leader's log end and seconds since it was last caught up (sources: callables
    yielding (topic, partition, follower, messages, seconds); -1: unknown, no sample)."""

    def __init__(self) -> None:
        self.sources: set[Callable[[], Iterable[tuple[str, int, int, int, float]]]] = set()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        labels = ["topic", "partition", "replica"]
        messages = GaugeMetricFamily(
            "kbroker_log_follower_lag_messages",
            "Messages a follower replica is behind its leader's log end, as the leader on "
            "this node sees it (FetcherLagMetrics ConsumerLag).", labels=labels)
        seconds = GaugeMetricFamily(
            "kbroker_log_follower_lag_seconds",
            "Seconds since a follower replica was last caught up with its leader's log end "
            "(what replica.lag.time.max.ms is compared with).", labels=labels)
        for source in list(self.sources):
            for topic, partition, follower, behind, since in list(source()):
                key = [topic, str(partition), str(follower)]
                if behind >= 0:
                    messages.add_metric(key, behind)
                if since >= 0:
                    seconds.add_metric(key, since)
        yield messages
        yield seconds

    def describe(self) -> list[GaugeMetricFamily]:
        return []


FOLLOWER_LAGS = FollowerLagCollector()
register_collector(FOLLOWER_LAGS)
