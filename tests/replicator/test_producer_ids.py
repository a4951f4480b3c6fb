"""Producer id blocks from the replicator: consecutive, never handed out twice (even across a
restart, or when requests race), persisted before the answer, invisible to metadata watchers."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from kbroker.replicator.v1 import replicator_pb2 as pb
from services.common.errors import ErrorCode, KafkaError
from services.replicator.controller.producer_ids import (
    MAX_PRODUCER_ID,
    PRODUCER_ID_BLOCK_SIZE,
    take_block,
)
from services.replicator.metadata import MetadataImage
from services.replicator.metadata_store import FILE_NAME, JsonFileMetadataStore

from .harness import cluster


def test_blocks_follow_each_other_from_the_stored_next_id() -> None:
    image, first = take_block(MetadataImage(cluster_id="c", version=1, next_producer_id=3000))
    assert (first, first + PRODUCER_ID_BLOCK_SIZE - 1, image.next_producer_id) == (
        3000, 3999, 4000)
    assert PRODUCER_ID_BLOCK_SIZE == 1000


def test_the_id_space_can_run_out() -> None:
    image = MetadataImage(cluster_id="c", version=1,
                          next_producer_id=MAX_PRODUCER_ID - PRODUCER_ID_BLOCK_SIZE + 1)
    with pytest.raises(KafkaError) as caught:
        take_block(image)
    assert caught.value.code is ErrorCode.unknown_server_error


def test_a_metadata_file_without_producer_ids_starts_them_at_zero(tmp_path: Path) -> None:
    store = JsonFileMetadataStore(tmp_path)
    store.save_now(MetadataImage(cluster_id="c", version=4, next_producer_id=7000))
    document = json.loads((tmp_path / FILE_NAME).read_text())
    assert document["next_producer_id"] == 7000
    assert store.load_now().next_producer_id == 7000  # type: ignore[union-attr]
    del document["next_producer_id"]
    (tmp_path / FILE_NAME).write_text(json.dumps(document))
    assert store.load_now().next_producer_id == 0  # type: ignore[union-attr]


def test_blocks_are_unique_across_racing_requests_and_restarts(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with cluster(tmp_path, nodes=1) as c:
            version = (await c.metadata()).version

            async def allocate(name: str) -> pb.AllocateProducerIdsResponse:
                return await c.stub.AllocateProducerIds(
                    pb.AllocateProducerIdsRequest(requester=name))

            replies = await asyncio.gather(*(allocate(f"handler-{i}") for i in range(8)))
            assert all(r.error_code == 0 for r in replies)
            assert all(r.producer_id_len == PRODUCER_ID_BLOCK_SIZE for r in replies)
            starts = sorted(r.producer_id_start for r in replies)
            assert starts == [i * PRODUCER_ID_BLOCK_SIZE for i in range(8)]
            # Saved before the answer, and no new metadata version for clients.
            stored = json.loads((c.data_dir / FILE_NAME).read_text())
            assert stored["next_producer_id"] == 8 * PRODUCER_ID_BLOCK_SIZE
            assert (await c.metadata()).version == version

            await c.stop_replicator()
            await c.start_replicator()
            after = await allocate("handler-0")
            assert after.producer_id_start == 8 * PRODUCER_ID_BLOCK_SIZE

    asyncio.run(scenario())


def test_a_failed_save_hands_out_nothing(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with cluster(tmp_path, nodes=1) as c:
            first = await c.stub.AllocateProducerIds(pb.AllocateProducerIdsRequest())
            assert c.service is not None
            store = c.service.controller._store  # fault injection

            async def broken_save(image: object) -> None:
                raise OSError("disk full")

            saved = store.save
            store.save = broken_save  # type: ignore[method-assign]
            try:
                failed = await c.stub.AllocateProducerIds(pb.AllocateProducerIdsRequest())
            finally:
                store.save = saved  # type: ignore[method-assign]
            assert failed.error_code == ErrorCode.unknown_server_error.value
            assert "disk full" in failed.error_message
            again = await c.stub.AllocateProducerIds(pb.AllocateProducerIdsRequest())
            assert again.producer_id_start == first.producer_id_start + PRODUCER_ID_BLOCK_SIZE

    asyncio.run(scenario())
