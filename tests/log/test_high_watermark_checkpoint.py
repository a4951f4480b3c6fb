"""A replicated replica's high watermark survives a restart (Kafka's
replication-offset-checkpoint): written periodically, when a follower is cut back and on a
clean close; restored at start-up, never above the recovered log end. Real files."""

from __future__ import annotations

import asyncio
from pathlib import Path

from services.log import replica_state
from services.log.checkpoint import HIGH_WATERMARK_FILE, OffsetCheckpoint
from services.log.partition_log import (
    HIGH_WATERMARK,
    HIGH_WATERMARK_CHECKPOINT_MS,
    PartitionLog,
)
from services.log.replica_state import FOLLOWER, UNKNOWN
from services.log.topic_config import TopicConfig

from ..record_batches import build_batch, values

FOLLOWING = replica_state.state(FOLLOWER, 0, in_sync_alone=False)


def open_log(directory: Path) -> PartitionLog:
    return PartitionLog(directory, "t", 0, "", TopicConfig())


def follower_with(directory: Path, batches: int, high_watermark: int) -> PartitionLog:
    """A follower holding ``batches`` batches of 3 records, with ``high_watermark``."""
    partition_log = open_log(directory)
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
