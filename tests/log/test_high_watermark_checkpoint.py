"""A replicated replica's high watermark survives a restart (Kafka's
replication-offset-checkpoint): written periodically, when a follower is cut back and on a
clean close; restored at start-up, never above the recovered log end. A log node keeps one such
file for all its replicas, written only when one moved, never with an older snapshot over a
newer one, and takes over the files replicas kept in their own directories. Real files."""

from __future__ import annotations

import asyncio
from pathlib import Path

from services.log import replica_state
from services.log.checkpoint import HIGH_WATERMARK_FILE, HighWatermarkCheckpoint, OffsetCheckpoint
from services.log.log_manager import LogManager
from services.log.partition_log import (
    HIGH_WATERMARK,
    HIGH_WATERMARK_CHECKPOINT_MS,
    PartitionLog,
)
from services.log.partition_metadata import PartitionMetadata
from services.log.replica_state import FOLLOWER, UNKNOWN
from services.log.topic_config import TopicConfig

from ..record_batches import build_batch, values

FOLLOWING = replica_state.state(FOLLOWER, 0, in_sync_alone=False)


def open_log(directory: Path, topic: str = "t") -> PartitionLog:
    return PartitionLog(directory, topic, 0, "", TopicConfig())


def follower_with(directory: Path, batches: int, high_watermark: int,
                  topic: str = "t") -> PartitionLog:
    """A follower holding ``batches`` batches of 3 records, with ``high_watermark``."""
    partition_log = open_log(directory, topic)
    asyncio.run(partition_log.become(FOLLOWING))
    for n in range(batches):
        asyncio.run(partition_log.append_as_follower(
            build_batch(values(3), base_offset=3 * n), leader_epoch=0))
    asyncio.run(partition_log.append_as_follower(b"", 0, high_watermark))
    assert partition_log.high_watermark == high_watermark
    return partition_log


def stored(directory: Path) -> dict[tuple[str, int], int]:
    return OffsetCheckpoint(directory / HIGH_WATERMARK_FILE).read()


def test_a_clean_close_keeps_the_high_watermark(tmp_path: Path) -> None:
    follower_with(tmp_path, 4, 9).close()
    assert stored(tmp_path) == {("t", 0): 9}
    reopened = open_log(tmp_path)
    assert (reopened.state.role, reopened.high_watermark, reopened.log_end_offset) == (
        UNKNOWN, 9, 12)
    data = reopened.read(0, 1 << 20, HIGH_WATERMARK)
    assert data, "committed records are readable again"
    reopened.close()


def test_a_crash_keeps_the_last_periodic_checkpoint(tmp_path: Path) -> None:
    partition_log = follower_with(tmp_path, 4, 6)
    later = partition_log._last_high_watermark_checkpoint_ms + HIGH_WATERMARK_CHECKPOINT_MS
    asyncio.run(partition_log.maybe_flush_by_time(later - 1))
    assert stored(tmp_path) == {}, "checkpointed before its interval"
    asyncio.run(partition_log.maybe_flush_by_time(later))
    assert stored(tmp_path) == {("t", 0): 6}
    asyncio.run(partition_log.append_as_follower(b"", 0, 9))
    partition_log.close(flush=False)  # a kill: no checkpoint at close
    reopened = open_log(tmp_path)
    assert reopened.high_watermark == 6
    reopened.close()


def test_the_restored_high_watermark_never_passes_the_recovered_log_end(tmp_path: Path) -> None:
    follower_with(tmp_path, 4, 12).close()
    segment = tmp_path / f"{0:020d}.log"
    data = segment.read_bytes()
    segment.write_bytes(data[:-5])  # the last batch torn: recovery cuts the log at 9
    (tmp_path / "recovery-point-offset-checkpoint").unlink(missing_ok=True)
    reopened = PartitionLog(tmp_path, "t", 0, "", TopicConfig(), recovery_point=0)
    assert (reopened.log_end_offset, reopened.high_watermark) == (9, 9)
    reopened.close()


def test_a_cut_follower_checkpoints_its_lower_high_watermark_at_once(tmp_path: Path) -> None:
    partition_log = follower_with(tmp_path, 4, 12)
    partition_log.checkpoint_high_watermark()
    assert stored(tmp_path) == {("t", 0): 12}
    asyncio.run(partition_log.truncate_to(6))
    assert stored(tmp_path) == {("t", 0): 6}
    partition_log.close(flush=False)
    reopened = open_log(tmp_path)
    assert reopened.high_watermark == 6
    reopened.close()


def test_without_a_checkpoint_nothing_is_shown_and_unreplicated_logs_write_none(
        tmp_path: Path) -> None:
    partition_log = follower_with(tmp_path / "f", 2, 6)
    partition_log.close(flush=False)
    (tmp_path / "f" / HIGH_WATERMARK_FILE).unlink(missing_ok=True)
    reopened = open_log(tmp_path / "f")
    assert reopened.high_watermark == 0
    reopened.close()
    standalone = open_log(tmp_path / "s")
    asyncio.run(standalone.append(build_batch(values(3))))
    standalone.close()
    assert not (tmp_path / "s" / HIGH_WATERMARK_FILE).exists()
    reopened = open_log(tmp_path / "s")
    assert reopened.high_watermark == 3
    reopened.close()


# -- the node's file ---------------------------------------------------------------------------


def test_an_older_snapshot_is_never_written_over_a_newer_one(tmp_path: Path) -> None:
    offsets = {("t", 0): 5}
    checkpoint = HighWatermarkCheckpoint(tmp_path / HIGH_WATERMARK_FILE, lambda: offsets)
    checkpoint.read()
    early = checkpoint.take()  # as a periodic write taken before a cut, written after it
    offsets = {("t", 0): 2}
    assert checkpoint.write_now()
    assert not checkpoint.write(early)
    assert stored(tmp_path) == {("t", 0): 2}
    assert not checkpoint.write_now(), "nothing moved: nothing written"
    offsets = {("t", 0): 2, ("u", 1): 7}
    assert checkpoint.write_now()
    assert stored(tmp_path) == {("t", 0): 2, ("u", 1): 7}


def replicated_node(data: Path) -> LogManager:
    manager = LogManager(data, TopicConfig())
    manager.load()
    return manager


def follow(manager: LogManager, topic: str, batches: int, high_watermark: int) -> None:
    partition_log = manager.create(topic, 0, "", {})
    asyncio.run(partition_log.become(FOLLOWING))
    for n in range(batches):
        asyncio.run(partition_log.append_as_follower(
            build_batch(values(3), base_offset=3 * n), leader_epoch=0))
    asyncio.run(partition_log.append_as_follower(b"", 0, high_watermark))


def test_a_node_checkpoints_every_replicated_replica_in_one_file(tmp_path: Path) -> None:
    manager = replicated_node(tmp_path)
    follow(manager, "a", 2, 3)
    follow(manager, "b", 4, 12)
    alone = manager.create("c", 0, "", {})  # not replicated: no entry
    asyncio.run(alone.append(build_batch(values(3))))
    assert asyncio.run(manager.checkpoint_high_watermarks())
    assert stored(tmp_path) == {("a", 0): 3, ("b", 0): 12}
    assert not asyncio.run(manager.checkpoint_high_watermarks()), "nothing moved"
    asyncio.run(manager.get("a", 0).append_as_follower(b"", 0, 6))
    assert asyncio.run(manager.checkpoint_high_watermarks())
    assert stored(tmp_path) == {("a", 0): 6, ("b", 0): 12}
    # A cut follower writes the node's file at once; no replica keeps a file of its own.
    asyncio.run(manager.get("b", 0).truncate_to(9))
    assert stored(tmp_path) == {("a", 0): 6, ("b", 0): 9}
    assert not any((tmp_path / d).joinpath(HIGH_WATERMARK_FILE).exists() for d in "abc")
    assert manager.delete("a", 0)
    asyncio.run(manager.get("b", 0).append_as_follower(b"", 0, 9))
    asyncio.run(manager.get("b", 0).append_as_follower(
        build_batch(values(3), base_offset=9), leader_epoch=0, high_watermark=10))
    manager.close()
    assert stored(tmp_path) == {("b", 0): 10}
    restarted = replicated_node(tmp_path)
    assert restarted.get("b", 0).high_watermark == 10
    assert restarted.get("c", 0).high_watermark == 3
    restarted.close()


def test_a_node_takes_over_the_files_its_replicas_kept(tmp_path: Path) -> None:
    directory = tmp_path / "d-0"
    directory.mkdir()
    PartitionMetadata(topic="d", partition=0).write(directory)
    follower_with(directory, 4, 9, topic="d").close()  # a replica opened on its own
    assert stored(directory) == {("d", 0): 9}
    manager = replicated_node(tmp_path)
    assert manager.get("d", 0).high_watermark == 9
    assert stored(tmp_path) == {("d", 0): 9}
    assert not (directory / HIGH_WATERMARK_FILE).exists()
    manager.close()
    restarted = replicated_node(tmp_path)
    assert restarted.get("d", 0).high_watermark == 9
    restarted.close()
