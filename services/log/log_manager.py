"""The partition replicas of one log node (Kafka's ``LogManager``): the data directory, replica
creation, deletion and lookup, reloading every replica on start-up, the node's checkpoint files
and the background work over all replicas (retention, time-based flushes, checkpoints, and the
log cleaner's rounds, see :mod:`services.log.cleaner`).

Layout of ``data_dir``: one directory per replica, ``<topic>-<partition>/`` (see
:mod:`services.log.partition_log`). Topic names are restricted to Kafka's legal characters
(``[a-zA-Z0-9._-]``, at most 249), so they are safe as file names. A replica being deleted is
first renamed to ``<topic>-<partition>.<random>-delete`` so that a crash mid-deletion never
leaves a half-deleted replica that would be reloaded; leftovers are removed at start-up.
The node's checkpoints (``recovery-point-offset-checkpoint``, ``log-start-offset-checkpoint``,
see :mod:`services.log.checkpoint`, and the cleaner's ``cleaner-offset-checkpoint``) are
written together periodically, when a replica is deleted or DeleteRecords moves a log start
offset (before it is answered), and on a clean shutdown, after the flush; the cleaner's also
after each round. The replicated replicas' high watermarks (``replication-offset-checkpoint``)
are written every ``high_watermark_checkpoint_interval_ms`` while one moves (in a thread), when
a follower is cut back, and on a clean shutdown. Not thread-safe: used from the event loop.

The data directory is Kafka's log directory: a write error anywhere in it, or a write that
would go below the free-space floor, fails it for good (see
:mod:`services.log.log_dir_failure`); then every replica call answers KAFKA_STORAGE_ERROR,
the background work stops touching it, and a shutdown neither flushes nor checkpoints it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import shutil
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from services.common.errors import ErrorCode, KafkaError

from . import metrics
from .checkpoint import (
    HIGH_WATERMARK_FILE,
    LOG_START_OFFSET_FILE,
    RECOVERY_POINT_FILE,
    HighWatermarkCheckpoint,
    OffsetCheckpoint,
    TopicPartition,
    fsync_directory,
)
from .cleaner import CLEANER_OFFSET_FILE, DEFAULT_MAX_MAP_KEYS, CleanResult, LogCleaner
from .log_dir_failure import FreeSpaceFloor, LogDirFailureChannel
from .partition_log import HighWatermarkListener, PartitionLog, directory_name
from .partition_metadata import PartitionMetadata
from .replica_state import commits_alone
from .topic_config import TopicConfig

log = logging.getLogger(__name__)

DELETE_SUFFIX = "-delete"
# Kafka's legal characters, at most 249 of them.
_LEGAL_TOPIC = re.compile(r"[a-zA-Z0-9._-]{1,249}")


def check_topic_name(topic: str) -> None:
    """Kafka's topic name rules (``Topic.validate``); raises INVALID_TOPIC_EXCEPTION."""
    if topic in (".", "..") or not _LEGAL_TOPIC.fullmatch(topic):
        raise KafkaError(ErrorCode.invalid_topic_exception, f"illegal topic name {topic!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Schedule:
    """How often the background work runs, in milliseconds (Kafka's ``log.*.interval.ms``)."""

    retention_check_interval_ms: int = 300_000
    flush_check_interval_ms: int = 1_000
    checkpoint_interval_ms: int = 60_000
    # Kafka's replica.high.watermark.checkpoint.interval.ms.
    high_watermark_checkpoint_interval_ms: int = 5_000
    cleaner_backoff_ms: int = 15_000
    cleaner_max_map_keys: int = DEFAULT_MAX_MAP_KEYS


class LogManager:
    """Creates, finds, deletes and reloads the partition logs under one data directory."""

    def __init__(
        self,
        data_dir: Path,
        defaults: TopicConfig,
        on_high_watermark: HighWatermarkListener | None = None,
        schedule: Schedule | None = None,
        free_space_floor: FreeSpaceFloor | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.log_dir = LogDirFailureChannel(data_dir, free_space_floor)
        self.defaults = defaults
        self.schedule = schedule or Schedule()
        self._on_high_watermark = on_high_watermark
        self._logs: dict[TopicPartition, PartitionLog] = {}
        self._recovery_points = OffsetCheckpoint(data_dir / RECOVERY_POINT_FILE)
        self._log_starts = OffsetCheckpoint(data_dir / LOG_START_OFFSET_FILE)
        self._high_watermarks = HighWatermarkCheckpoint(data_dir / HIGH_WATERMARK_FILE,
                                                        self._replicated_high_watermarks)
        self._replica_high_watermark_files: list[Path] = []
        self._tasks: list[asyncio.Task[None]] = []
        self.cleaner = LogCleaner(data_dir / CLEANER_OFFSET_FILE,
                                  self.schedule.cleaner_max_map_keys)

    def load(self) -> None:
        """Reload every replica in the data directory (recovering their last segments) and
        finish deletions a crash interrupted."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        recovery_points, log_starts = self._recovery_points.read(), self._log_starts.read()
        self._high_watermarks.read()
        # High watermark files replicas kept in their own directories, taken over below.
        self._replica_high_watermark_files: list[Path] = []
        self.cleaner.load()
        for directory in sorted(self.data_dir.iterdir()):
            if not directory.is_dir():
                continue
            if directory.name.endswith(DELETE_SUFFIX):
                log.info("%s: finishing an interrupted deletion", directory)
                shutil.rmtree(directory, ignore_errors=True)
                continue
            try:
                self._load_one(directory, recovery_points, log_starts)
            except (OSError, ValueError, KafkaError) as exc:
                # One damaged replica must not keep the node's other replicas offline.
                log.error("%s: cannot load replica: %s", directory, exc)
        self._take_over_replica_high_watermarks()

    def _take_over_replica_high_watermarks(self) -> None:
        """Move the high watermarks replicas kept in their own directories (as a replica
        opened without a node does) into the node's checkpoint, then remove their files."""
        files, self._replica_high_watermark_files = self._replica_high_watermark_files, []
        if not files:
            return
        try:
            self._high_watermarks.write_now()
            for path in files:
                path.unlink()
        except OSError as exc:
            self.storage_failed(exc, "taking over the replicas' high watermark checkpoints")

    def _load_one(self, directory: Path, recovery_points: Mapping[TopicPartition, int],
                  log_starts: Mapping[TopicPartition, int]) -> None:
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
        key = (metadata.topic, metadata.partition)
        own = directory / HIGH_WATERMARK_FILE
        if own.exists():
            self._replica_high_watermark_files.append(own)
            stored = OffsetCheckpoint(own).read().get(key)
            if stored is not None:
                self._high_watermarks.stored.setdefault(key, stored)
        partition_log = PartitionLog(
            directory, metadata.topic, metadata.partition, metadata.topic_id, config,
            self._on_high_watermark,
            recovery_point=recovery_points.get(key, 0),
            log_start_offset=log_starts.get(key, 0),
            log_dir=self.log_dir,
            high_watermarks=self._high_watermarks,
        )
        partition_log.topic_configs = dict(metadata.configs)
        self._logs[key] = partition_log
        log.info(
            "loaded %s-%d: offsets [%d, %d), %d segment(s), recovery point %d, %d byte(s) "
            "truncated", metadata.topic, metadata.partition, partition_log.log_start_offset,
            partition_log.log_end_offset, partition_log.segment_count,
            recovery_points.get(key, 0), partition_log.truncated_at_open,
        )

    def create(
        self, topic: str, partition: int, topic_id: str, configs: Mapping[str, str]
    ) -> PartitionLog:
        """Create a replica, or confirm an existing one (storing ``configs`` if they changed).
        Raises INVALID_TOPIC_EXCEPTION, INVALID_PARTITIONS, INVALID_CONFIG, or
        INCONSISTENT_TOPIC_ID when the replica exists for another topic id."""
        check_topic_name(topic)
        self.log_dir.check_online()
        if partition < 0:
            raise KafkaError(ErrorCode.invalid_partitions, f"invalid partition {partition}")
        config = self.defaults.with_overrides(configs)
        existing = self._logs.get((topic, partition))
        if existing is not None and "" != existing.topic_id != topic_id != "":
            raise KafkaError(ErrorCode.inconsistent_topic_id,
                             f"{topic}-{partition} exists with topic id {existing.topic_id}")
        metadata = PartitionMetadata(
            topic=topic, partition=partition, configs=dict(configs),
            topic_id=existing.topic_id or topic_id if existing else topic_id)
        if existing is not None:
            if PartitionMetadata.read(existing.directory) != metadata:
                metadata.write(existing.directory)
            existing.topic_id = metadata.topic_id
            existing.update_config(config)
            existing.topic_configs = dict(configs)
            return existing
        directory = self.data_dir / directory_name(topic, partition)
        directory.mkdir(parents=True, exist_ok=True)
        metadata.write(directory)
        fsync_directory(self.data_dir)
        self._high_watermarks.stored.pop((topic, partition), None)  # a new replica's own
        partition_log = PartitionLog(
            directory, topic, partition, topic_id, config, self._on_high_watermark,
            log_dir=self.log_dir, high_watermarks=self._high_watermarks,
        )
        partition_log.topic_configs = dict(configs)
        self._logs[(topic, partition)] = partition_log
        return partition_log

    def find(self, topic: str, partition: int) -> PartitionLog | None:
        return self._logs.get((topic, partition))

    def get(self, topic: str, partition: int) -> PartitionLog:
        """The replica, or UNKNOWN_TOPIC_OR_PARTITION; KAFKA_STORAGE_ERROR once the log
        directory has failed (every replica is offline)."""
        partition_log = self._logs.get((topic, partition))
        if partition_log is None:
            raise KafkaError(
                ErrorCode.unknown_topic_or_partition,
                f"this node has no replica of {topic}-{partition}",
            )
        self.log_dir.check_online()
        return partition_log

    def offline_replicas(self) -> int:
        """The replicas the failed log directory took offline (Kafka's OfflineReplicaCount):
        all of them once it failed, else none."""
        return len(self._logs) if self.log_dir.offline else 0

    def storage_failed(self, exc: OSError, during: str) -> None:
        """An I/O error in the log directory: fail it (logged once, see
        :meth:`LogDirFailureChannel.fail`)."""
        self.log_dir.fail(exc, during)

    def delete(self, topic: str, partition: int) -> bool:
        """Remove a replica and its files; False if there was none."""
        if (topic, partition) in self._logs:
            self.log_dir.check_online()
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
        self.cleaner.forget(topic, partition)
        self.write_checkpoints()
        return True

    async def delete_records(self, topic: str, partition: int, offset: int) -> int:
        """Move a replica's log start offset (see :meth:`PartitionLog.delete_records`) and
        persist it before answering, so deleted records never come back after a restart."""
        partition_log = self.get(topic, partition)
        before = partition_log.log_start_offset
        low_watermark = await partition_log.delete_records(offset)
        if low_watermark != before:
            self.write_checkpoints()
        return low_watermark

    def update_configs(self, topic: str, partition: int, configs: Mapping[str, str]) -> None:
        """Replace a replica's topic config overrides (stored, and in effect at once)."""
        partition_log = self.get(topic, partition)
        self.create(topic, partition, partition_log.topic_id, configs)

    # ----------------------------------------------------------------- checkpoints, tasks

    def write_checkpoints(self) -> None:
        """Persist the replicas' recovery points and moved log start offsets, and the log
        cleaner's first dirty offsets (nothing once the log directory failed; a failure to
        write fails it)."""
        if self.log_dir.offline:
            return
        try:
            self._recovery_points.write(
                {key: log_.recovery_point for key, log_ in self._logs.items()})
            self._log_starts.write({
                key: log_.log_start_offset for key, log_ in self._logs.items()
                if log_.log_start_offset > log_.segments[0].base_offset
            })
            self.cleaner.write_checkpoint()
        except OSError as exc:
            self.storage_failed(exc, "writing checkpoints")
            raise

    async def enforce_retention(self) -> int:
        """One retention pass over every replica; returns the segments deleted."""
        deleted = 0
        for partition_log in list(self._logs.values()) if not self.log_dir.offline else ():
            try:
                deleted += await partition_log.enforce_retention()
            except OSError as exc:
                self.storage_failed(exc, f"retention in {partition_log.directory}")
        return deleted

    async def clean_logs(self, now: int | None = None) -> list[CleanResult]:
        """One log cleaner round over every compacted replica worth cleaning (see
        :meth:`LogCleaner.clean_logs`); the first dirty offsets are checkpointed after it."""
        if self.log_dir.offline:
            return []
        started = time.perf_counter()
        try:
            results = await self.cleaner.clean_logs(self.partitions(), now)
        except OSError as exc:
            self.storage_failed(exc, "cleaning logs")
            return []
        if results:
            for result in results:
                metrics.CLEANER_RUNS.inc()
                metrics.CLEANER_READ_BYTES.inc(result.bytes_read)
                metrics.CLEANER_REMOVED_BYTES.inc(max(result.bytes_removed, 0))
                metrics.CLEANER_REMOVED_RECORDS.inc(result.records_removed)
            metrics.CLEANER_LAST_SECONDS.set(time.perf_counter() - started)
        try:
            self.cleaner.write_checkpoint()
        except OSError as exc:
            self.storage_failed(exc, "writing the cleaner checkpoint")
        return results

    def _replicated_high_watermarks(self) -> dict[TopicPartition, int]:
        return {key: partition_log.high_watermark for key, partition_log in self._logs.items()
                if not commits_alone(partition_log.state)}

    async def checkpoint_high_watermarks(self) -> bool:
        """Write the replicated replicas' high watermarks if one moved since the last write
        (in a thread; a failure fails the log directory). Returns whether it wrote."""
        if self.log_dir.offline:
            return False
        snapshot = self._high_watermarks.take()
        try:
            return await asyncio.to_thread(self._high_watermarks.write, snapshot)
        except OSError as exc:
            self.storage_failed(exc, "checkpointing high watermarks")
            return False

    async def flush_by_time(self) -> None:
        for partition_log in list(self._logs.values()) if not self.log_dir.offline else ():
            try:
                await partition_log.maybe_flush_by_time()
            except OSError as exc:
                self.storage_failed(exc, f"flushing {partition_log.directory}")
            except KafkaError as exc:
                log.error("%s: flush failed: %s", partition_log.directory, exc)

    def start_background(self) -> None:
        """Start the periodic retention, flush, checkpoint and log cleaner work on the running
        loop."""
        schedule = self.schedule

        async def checkpoints() -> None:
            with contextlib.suppress(OSError):  # the log dir failed: logged once there
                self.write_checkpoints()

        self._tasks = [asyncio.create_task(_every(*every)) for every in (
            (schedule.retention_check_interval_ms, self.enforce_retention, "retention"),
            (schedule.flush_check_interval_ms, self.flush_by_time, "flush"),
            (schedule.checkpoint_interval_ms, checkpoints, "checkpoint"),
            (schedule.high_watermark_checkpoint_interval_ms, self.checkpoint_high_watermarks,
             "high watermark checkpoint"),
            (schedule.cleaner_backoff_ms, self.clean_logs, "log cleaner"))]

    async def stop_background(self) -> None:
        """Stop the periodic work and wait for the replicas' background flushes."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        for partition_log in list(self._logs.values()):
            await partition_log.drain()

    def partitions(self) -> list[PartitionLog]:
        """Every replica, ordered by topic and partition."""
        return [self._logs[key] for key in sorted(self._logs)]

    def __len__(self) -> int:
        return len(self._logs)

    def close(self) -> None:
        """Flush and close every replica, then checkpoint their recovery points and log start
        offsets (a clean shutdown: the next start validates nothing it need not); a failed
        log directory is only closed (the next start recovers it as after a crash)."""
        for partition_log in self._logs.values():
            try:
                partition_log.close(flush=True)
            except OSError as exc:
                log.error("%s: close failed: %s", partition_log.directory, exc)
        if self._logs and not self.log_dir.offline:
            try:
                self.write_checkpoints()
                self._high_watermarks.write_now()
            except OSError as exc:
                log.error("%s: cannot write checkpoints: %s", self.data_dir, exc)
        self._logs.clear()


async def _every(interval_ms: int, work: Callable[[], Awaitable[object]], name: str) -> None:
    """Run ``work()`` every ``interval_ms``; a failure is logged and the next round runs."""
    while True:
        await asyncio.sleep(interval_ms / 1000)
        try:
            await work()
        except Exception:  # background work must keep going
            log.exception("background %s failed", name)
