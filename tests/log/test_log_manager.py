"""Tests of services.log.log_manager: replica creation, configs, deletion and reload."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from services.common.errors import ErrorCode, KafkaError
from services.log.log_manager import LogManager
from services.log.partition_metadata import FILE_NAME
from services.log.topic_config import TimestampType, TopicConfig

from ..record_batches import build_batch, values


def manager_at(data_dir: Path, **defaults: object) -> LogManager:
    manager = LogManager(data_dir, TopicConfig(**defaults))  # type: ignore[arg-type]
    manager.load()
    return manager


def test_creation_is_idempotent_and_stores_configs(tmp_path: Path) -> None:
    manager = manager_at(tmp_path)
    first = manager.create("orders", 3, "id-1", {"max.message.bytes": "500"})
    asyncio.run(first.append(build_batch(values(2))))
    again = manager.create("orders", 3, "id-1", {"max.message.bytes": "700",
                                                 "retention.ms": "1000"})
    assert again is first and again.log_end_offset == 2
    assert again.config.max_message_bytes == 700
    stored = json.loads((tmp_path / "orders-3" / FILE_NAME).read_text())
    assert stored["topic_id"] == "id-1"
    assert stored["configs"] == {"max.message.bytes": "700", "retention.ms": "1000"}
    manager.close()


def test_replicas_reload_with_their_configs(tmp_path: Path) -> None:
    manager = manager_at(tmp_path, segment_bytes=10_000)
    log = manager.create("a.b-c", 0, "id", {"message.timestamp.type": "LogAppendTime"})
    asyncio.run(log.append(build_batch(values(5))))
    manager.create("a.b-c", 1, "id", {})
    manager.close()

    reloaded = manager_at(tmp_path, segment_bytes=20_000)
    assert [(p.topic, p.partition) for p in reloaded.partitions()] == [("a.b-c", 0), ("a.b-c", 1)]
    log = reloaded.get("a.b-c", 0)
    assert log.log_end_offset == 5 and log.topic_id == "id"
    assert log.config.message_timestamp_type is TimestampType.LOG_APPEND_TIME
    assert log.config.segment_bytes == 20_000  # the node's current default
    reloaded.close()


def test_deletion_removes_the_files(tmp_path: Path) -> None:
    manager = manager_at(tmp_path)
    log = manager.create("t", 0, "", {})
    asyncio.run(log.append(build_batch(values(1))))
    assert manager.delete("t", 0)
    assert not manager.delete("t", 0)
    assert [p for p in tmp_path.iterdir() if p.is_dir()] == []
    with pytest.raises(KafkaError) as caught:
        manager.get("t", 0)
    assert caught.value.code == ErrorCode.unknown_topic_or_partition
    # A deleted log refuses appends that were waiting for it.
    with pytest.raises(KafkaError):
        asyncio.run(log.append(build_batch(values(1))))
    manager.close()


def test_an_interrupted_deletion_is_finished_at_load(tmp_path: Path) -> None:
    leftover = tmp_path / "t-0.abc-delete"
    leftover.mkdir()
    (leftover / f"{0:020d}.log").write_bytes(b"x")
    manager_at(tmp_path).close()
    assert not leftover.exists()


@pytest.mark.parametrize(
    ("topic", "partition", "configs", "code"),
    [
        ("../etc", 0, {}, ErrorCode.invalid_topic_exception),
        ("a" * 250, 0, {}, ErrorCode.invalid_topic_exception),
        ("t", -1, {}, ErrorCode.invalid_partitions),
        ("t", 0, {"segment.bytes": "ten"}, ErrorCode.invalid_config),
        ("t", 0, {"segment.bytes": "1"}, ErrorCode.invalid_config),
        ("t", 0, {"message.timestamp.type": "Sometime"}, ErrorCode.invalid_config),
    ],
)
def test_invalid_creations_are_refused(
    tmp_path: Path, topic: str, partition: int, configs: dict[str, str], code: ErrorCode
) -> None:
    manager = manager_at(tmp_path)
    with pytest.raises(KafkaError) as caught:
        manager.create(topic, partition, "", configs)
    assert caught.value.code == code
    assert len(manager) == 0 and list(tmp_path.iterdir()) == []
    manager.close()


def test_another_topic_id_is_inconsistent(tmp_path: Path) -> None:
    manager = manager_at(tmp_path)
    manager.create("t", 0, "id-1", {})
    with pytest.raises(KafkaError) as caught:
        manager.create("t", 0, "id-2", {})
    assert caught.value.code == ErrorCode.inconsistent_topic_id
    manager.close()


def test_a_directory_without_metadata_is_loaded_with_defaults(tmp_path: Path) -> None:
    manager = manager_at(tmp_path)
    asyncio.run(manager.create("t", 2, "", {}).append(build_batch(values(3))))
    manager.close()
    (tmp_path / "t-2" / FILE_NAME).unlink()
    (tmp_path / "t-5").mkdir()  # a creation interrupted before anything was stored
    reloaded = manager_at(tmp_path)
    assert reloaded.get("t", 2).log_end_offset == 3
    assert not (tmp_path / "t-5").exists()
    reloaded.close()
