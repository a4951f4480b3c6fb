"""Configuration of a log node: where it listens, where its data lives, whom it notifies, and
the broker-level defaults of the topic configs it enforces (Kafka's ``log.*`` settings)."""

from __future__ import annotations

from dataclasses import dataclass

from services.common.config import option

from .topic_config import TopicConfig


@dataclass(frozen=True, slots=True, kw_only=True)
class LogConfig:
    """A log node: partition replicas on local disk."""

    node_id: int = option(0, "this log node's id")
    data_dir: str = option("data/log-0", "directory holding the partition replicas")
    grpc_address: str = option("127.0.0.1:19200", "host:port of the LogService gRPC server")
    metrics_port: int = option(0, "Prometheus HTTP port (0: disabled)")
    purgatory_address: str = option(
        "", "host:port of the purgatory to tell about high watermark moves (empty: nobody)"
    )
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

    def topic_defaults(self) -> TopicConfig:
        """The topic config every partition starts from before its own overrides."""
        return TopicConfig(
            segment_bytes=self.segment_bytes,
            index_interval_bytes=self.index_interval_bytes,
            max_message_bytes=self.max_message_bytes,
            message_timestamp_type=self.message_timestamp_type,  # type: ignore[arg-type]
        )
