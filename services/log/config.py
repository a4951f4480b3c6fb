"""Configuration of a log node: where it listens, where its data lives, whom it notifies, and
the broker-level defaults of the topic configs it enforces (Kafka's ``log.*`` settings)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TypeVar

from services.common.config import option
from services.common.tls import CA_HELP, CERT_HELP, KEY_HELP

from .cleaner import DEFAULT_MAX_MAP_KEYS
from .controlled_shutdown import ShutdownSettings
from .log_dir_failure import FreeSpaceFloor
from .log_manager import Schedule
from .topic_config import NEVER, TopicConfig


@dataclass(frozen=True, slots=True, kw_only=True)
class LogConfig:
    """A log node: partition replicas on local disk."""

    node_id: int = option(0, "this log node's id")
    data_dir: str = option("data/log-0", "directory holding the partition replicas")
    grpc_address: str = option("127.0.0.1:19200", "host:port of the LogService gRPC server")
    internal_tls_ca: str = option("", CA_HELP)
    internal_tls_cert: str = option("", CERT_HELP)
    internal_tls_key: str = option("", KEY_HELP)
    metrics_port: int = option(0, "Prometheus HTTP port (0: disabled)")
    instance: str = option(
        "", "this instance's name (metrics snapshots, logs; empty: log-<node_id>)")
    purgatory_address: str = option(
        "", "host:port of the purgatory to tell about high watermark moves (empty: nobody)"
    )
    replicator_address: str = option(
        "", "host:port of the replicator, asked for a controlled shutdown when this node is "
        "stopped (empty: none; the node stops without handing its leaderships over)")
    controlled_shutdown_enable: bool = option(
        True, "controlled.shutdown.enable: when stopped (SIGTERM), first move every leadership "
        "this node holds to in-sync followers, then stop")
    controlled_shutdown_timeout_ms: int = option(
        30000, "the longest a controlled shutdown may take before the node stops anyway "
        "(keep it below the time the node is given to stop, e.g. Kubernetes' "
        "terminationGracePeriodSeconds)")
    controlled_shutdown_max_retries: int = option(
        3, "controlled.shutdown.max.retries: failed requests to the replicator in a row "
        "after which the node stops without handing over")
    controlled_shutdown_retry_backoff_ms: int = option(
        500, "controlled.shutdown.retry.backoff.ms: the wait before asking the replicator "
        "again (Kafka's default is 5000)")
    segment_bytes: int = option(1073741824, "default segment.bytes: roll segments at this size")
    index_interval_bytes: int = option(
        4096, "default index.interval.bytes: bytes of log between offset index entries"
    )
    max_message_bytes: int = option(
        1048588, "default max.message.bytes: the largest record batch accepted"
    )
    message_timestamp_type: str = option(
        "CreateTime", "default message.timestamp.type: CreateTime or LogAppendTime"
    )
    segment_ms: int = option(604800000, "default segment.ms: roll segments this old")
    retention_ms: int = option(
        604800000, "default retention.ms: delete segments older than this (-1: never)")
    retention_bytes: int = option(
        -1, "default retention.bytes: delete old segments beyond this size (-1: never)")
    cleanup_policy: str = option("delete", "default cleanup.policy: delete, compact or both")
    delete_retention_ms: int = option(
        86400000, "default delete.retention.ms: how long compaction keeps tombstones")
    min_compaction_lag_ms: int = option(
        0, "default min.compaction.lag.ms: records younger than this are not compacted")
    max_compaction_lag_ms: int = option(
        NEVER, "default max.compaction.lag.ms: a dirty record this old forces a cleaning")
    min_cleanable_dirty_ratio: float = option(
        0.5, "default min.cleanable.dirty.ratio: clean a compacted log whose dirty share "
        "exceeds this (log.cleaner.min.cleanable.ratio)")
    flush_messages: int = option(
        NEVER, "default flush.messages: fsync every this many messages (default: never)")
    flush_ms: int = option(NEVER, "default flush.ms: fsync this often (default: never)")
    retention_check_interval_ms: int = option(
        300000, "how often retention runs over every replica (log.retention.check.interval.ms)")
    flush_check_interval_ms: int = option(
        1000, "how often flush.ms is checked (log.flush.scheduler.interval.ms)")
    checkpoint_interval_ms: int = option(
        60000, "how often recovery points and log start offsets are checkpointed")
    high_watermark_checkpoint_interval_ms: int = option(
        5000, "how often the replicated replicas' high watermarks are checkpointed while one "
        "moves (replica.high.watermark.checkpoint.interval.ms)")
    cleaner_backoff_ms: int = option(
        15000, "how often the log cleaner looks for logs to compact (log.cleaner.backoff.ms)")
    log_dir_min_free_bytes: int = option(
        0, "free-space floor of the log dir (log.dir.min.free.bytes; 0: none): a write that "
        "would leave less free space fails the log dir as a full disk would, before the disk "
        "is full: its replicas go offline (KAFKA_STORAGE_ERROR), followers with space take "
        "over, and the node serves again once restarted with space")
    log_dir_min_free_percent: float = option(
        0.0, "free-space floor as a percentage of the log dir's file system "
        "(log.dir.min.free.percent; 0: none); the larger of the two floors applies")
    replica_fetch_transport: str = option(
        "stream", "how this node's followers fetch from their leaders: stream (one long-lived "
        "ReplicaFetch stream per leader node) or unary (a ReplicaFetchOnce call per fetch)")
    local_files: bool = option(
        True, "followers read the batches a leader on this host (same kernel and mount "
              "namespace) names from its segment files instead of receiving them, and "
              "appends read the batches a frontend on this host left in its spool files")
    cleaner_max_map_keys: int = option(
        DEFAULT_MAX_MAP_KEYS, "keys of the log cleaner's offset map per pass (a longer dirty "
        "section is cleaned over several passes)")

    def topic_defaults(self) -> TopicConfig:
        """The topic config every partition starts from before its own overrides."""
        return _pick(self, TopicConfig)

    def schedule(self) -> Schedule:
        return _pick(self, Schedule)

    def controlled_shutdown(self) -> ShutdownSettings:
        return ShutdownSettings(
            enabled=self.controlled_shutdown_enable,
            timeout_s=max(self.controlled_shutdown_timeout_ms, 0) / 1000,
            max_retries=max(self.controlled_shutdown_max_retries, 0),
            retry_backoff_s=max(self.controlled_shutdown_retry_backoff_ms, 0) / 1000)

    def free_space_floor(self) -> FreeSpaceFloor:
        return FreeSpaceFloor(min_bytes=self.log_dir_min_free_bytes,
                              min_percent=self.log_dir_min_free_percent)


T = TypeVar("T")


def _pick(config: LogConfig, kind: type[T]) -> T:
    """A ``kind`` (a dataclass) of the settings of ``config`` that bear its fields' names."""
    return kind(**{f.name: getattr(config, f.name) for f in dataclasses.fields(kind)})  # type: ignore[arg-type]
