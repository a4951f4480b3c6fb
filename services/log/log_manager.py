"""The partition replicas of one log node (Kafka's ``LogManager``): the data directory, replica
creation, deletion and lookup, and reloading every replica on start-up.

Layout of ``data_dir``: one directory per replica, ``<topic>-<partition>/`` (see
:mod:`services.log.partition_log`). Topic names are restricted to Kafka's legal characters
(``[a-zA-Z0-9._-]``, at most 249), so they are safe as file names. A replica being deleted is
first renamed to ``<topic>-<partition>.<random>-delete`` so that a crash mid-deletion never
leaves a half-deleted replica that would be reloaded; leftovers are removed at start-up.
Not thread-safe: used from the event loop.
"""

from __future__ import annotations

import logging
import re
import shutil
import uuid
from collections.abc import Mapping
from pathlib import Path

from services.common.errors import ErrorCode, KafkaError

from .partition_log import HighWatermarkListener, PartitionLog, directory_name
from .partition_metadata import PartitionMetadata, fsync_directory
from .topic_config import TopicConfig

log = logging.getLogger(__name__)

DELETE_SUFFIX = "-delete"
MAX_TOPIC_LENGTH = 249
_LEGAL_TOPIC = re.compile(r"[a-zA-Z0-9._-]+")

TopicPartition = tuple[str, int]


def check_topic_name(topic: str) -> None:
    """Kafka's topic name rules (``Topic.validate``); raises INVALID_TOPIC_EXCEPTION."""
    if topic in ("", ".", "..") or len(topic) > MAX_TOPIC_LENGTH or not _LEGAL_TOPIC.fullmatch(
        topic
    ):
        raise KafkaError(ErrorCode.invalid_topic_exception, f"illegal topic name {topic!r}")


class LogManager:
    """Creates, finds, deletes and reloads the partition logs under one data directory."""

    def __init__(
        self,
        data_dir: Path,
        defaults: TopicConfig,
        on_high_watermark: HighWatermarkListener | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.defaults = defaults
        self._on_high_watermark = on_high_watermark
        self._logs: dict[TopicPartition, PartitionLog] = {}

    def load(self) -> None:
        """Reload every replica in the data directory (recovering their last segments) and
        finish deletions a crash interrupted."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        for directory in sorted(self.data_dir.iterdir()):
            if not directory.is_dir():
                continue
            if directory.name.endswith(DELETE_SUFFIX):
                log.info("%s: finishing an interrupted deletion", directory)
                shutil.rmtree(directory, ignore_errors=True)
                continue
            try:
                self._load_one(directory)
            except (OSError, ValueError, KafkaError) as exc:
                # One damaged replica must not keep the node's other replicas offline.
                log.error("%s: cannot load replica: %s", directory, exc)

    def _load_one(self, directory: Path) -> None:
        metadata = PartitionMetadata.read(directory)
        if metadata is None:
            topic, _, partition = directory.name.rpartition("-")
            if not partition.isdigit() or not topic:
                log.warning("%s: not a replica directory; ignored", directory)
                return
            if not any(directory.iterdir()):
                # Creation was interrupted before anything was stored.
                directory.rmdir()
                return
            log.warning("%s: no metadata file; loading with default configs", directory)
            metadata = PartitionMetadata(topic=topic, partition=int(partition))
            metadata.write(directory)
        if directory.name != directory_name(metadata.topic, metadata.partition):
            raise ValueError(f"metadata names {metadata.topic}-{metadata.partition}")
        config = self.defaults.with_overrides(metadata.configs)
        partition_log = PartitionLog.open(
            directory, metadata.topic, metadata.partition, metadata.topic_id, config,
            self._on_high_watermark,
        )
        self._logs[(metadata.topic, metadata.partition)] = partition_log
        log.info(
            "loaded %s-%d: offsets [%d, %d), %d segment(s)", metadata.topic, metadata.partition,
            partition_log.log_start_offset, partition_log.log_end_offset,
            partition_log.segment_count,
        )

    def create(
        self, topic: str, partition: int, topic_id: str, configs: Mapping[str, str]
    ) -> PartitionLog:
        """Create a replica, or confirm an existing one (storing ``configs`` if they changed).
        Raises INVALID_TOPIC_EXCEPTION, INVALID_PARTITIONS, INVALID_CONFIG, or
        INCONSISTENT_TOPIC_ID when the replica exists for another topic id."""
        check_topic_name(topic)
        if partition < 0:
            raise KafkaError(ErrorCode.invalid_partitions, f"invalid partition {partition}")
        config = self.defaults.with_overrides(configs)
        metadata = PartitionMetadata(
            topic=topic, partition=partition, topic_id=topic_id, configs=dict(configs)
        )
        existing = self._logs.get((topic, partition))
        if existing is not None:
            if existing.topic_id and topic_id and existing.topic_id != topic_id:
                raise KafkaError(
                    ErrorCode.inconsistent_topic_id,
                    f"{topic}-{partition} exists with topic id {existing.topic_id}",
                )
            metadata = PartitionMetadata(
                topic=topic, partition=partition, topic_id=existing.topic_id or topic_id,
                configs=dict(configs),
            )
            if PartitionMetadata.read(existing.directory) != metadata:
                metadata.write(existing.directory)
            existing.topic_id = metadata.topic_id
            existing.update_config(config)
            return existing
        directory = self.data_dir / directory_name(topic, partition)
        directory.mkdir(parents=True, exist_ok=True)
        metadata.write(directory)
        fsync_directory(self.data_dir)
        partition_log = PartitionLog.open(
            directory, topic, partition, topic_id, config, self._on_high_watermark
        )
        self._logs[(topic, partition)] = partition_log
        return partition_log

    def get(self, topic: str, partition: int) -> PartitionLog:
        """The replica, or UNKNOWN_TOPIC_OR_PARTITION."""
        partition_log = self._logs.get((topic, partition))
        if partition_log is None:
            raise KafkaError(
                ErrorCode.unknown_topic_or_partition,
                f"this node has no replica of {topic}-{partition}",
            )
        return partition_log

    def delete(self, topic: str, partition: int) -> bool:
        """Remove a replica and its files; False if there was none."""
        partition_log = self._logs.pop((topic, partition), None)
        if partition_log is None:
            return False
        partition_log.close(flush=False)
        doomed = partition_log.directory.with_name(
            f"{partition_log.directory.name}.{uuid.uuid4().hex}{DELETE_SUFFIX}"
        )
        partition_log.directory.rename(doomed)
        fsync_directory(self.data_dir)
        shutil.rmtree(doomed, ignore_errors=True)
        return True

    def partitions(self) -> list[PartitionLog]:
        """Every replica, ordered by topic and partition."""
        return [self._logs[key] for key in sorted(self._logs)]

    def __len__(self) -> int:
        return len(self._logs)

    def close(self) -> None:
        """Flush and close every replica (a clean shutdown)."""
        for partition_log in self._logs.values():
            try:
                partition_log.close(flush=True)
            except OSError as exc:
                log.error("%s: close failed: %s", partition_log.directory, exc)
        self._logs.clear()
