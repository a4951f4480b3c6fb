"""The JSON metadata store: exact round trip, atomic replacement, corrupt files refused, and
the same through its asynchronous interface."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.replicator.metadata import (
    LogNode,
    MetadataImage,
    NodeId,
    PartitionRegistration,
    TopicName,
    TopicRegistration,
    new_cluster_id,
    new_topic_id,
)
from services.replicator.metadata_store import CorruptMetadataError, JsonFileMetadataStore

node_ids = st.integers(0, 50).map(NodeId)


@st.composite
def topics(draw: st.DrawFn) -> TopicRegistration:
    name = draw(st.text("abcXYZ09._-", min_size=1, max_size=20))
    partitions = []
    for index in range(draw(st.integers(1, 4))):
        replicas = tuple(draw(st.lists(node_ids, min_size=1, max_size=4, unique=True)))
        isr = replicas[: draw(st.integers(1, len(replicas)))]
        partitions.append(PartitionRegistration(
            partition=index, leader=isr[0], leader_epoch=draw(st.integers(0, 10)),
            replicas=replicas, isr=isr))
    return TopicRegistration(
        name=TopicName(name), topic_id=new_topic_id(),
        configs=draw(st.dictionaries(st.sampled_from(["retention.ms", "cleanup.policy"]),
                                     st.text(max_size=5))),
        partitions=tuple(partitions),
    )


@st.composite
def images(draw: st.DrawFn) -> MetadataImage:
    chosen = draw(st.lists(topics(), max_size=4, unique_by=lambda t: t.name))
    pending = draw(st.dictionaries(
        node_ids, st.frozensets(st.tuples(st.text("ab", min_size=1, max_size=3),
                                          st.integers(0, 3)), min_size=1), max_size=3))
    return MetadataImage(
        cluster_id=new_cluster_id(), version=draw(st.integers(1, 2**40)),
        topics={t.name: t for t in chosen}, next_leader_index=draw(st.integers(0, 100)),
        pending_deletions=pending,
    )


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=50)
@given(images())
def test_round_trip(tmp_path: Path, image: MetadataImage):
    store = JsonFileMetadataStore(tmp_path / "meta")
    store.save_now(image)
    assert store.load_now() == image


def test_liveness_is_not_stored(tmp_path: Path):
    store = JsonFileMetadataStore(tmp_path)
    image = MetadataImage(cluster_id="c", version=3,
                          log_nodes=(LogNode(node_id=NodeId(0), address="h:1", alive=True),))
    store.save_now(image)
    loaded = store.load_now()
    assert loaded is not None and loaded.log_nodes == () and loaded.version == 3


def test_missing_file_means_a_new_cluster(tmp_path: Path):
    assert JsonFileMetadataStore(tmp_path / "nothing").load_now() is None


def test_a_leftover_temporary_file_is_ignored_and_replaced(tmp_path: Path):
    store = JsonFileMetadataStore(tmp_path)
    store.save_now(MetadataImage(cluster_id="c", version=1))
    # A crash in the middle of a later save leaves a torn temporary file behind.
    (tmp_path / "metadata.json.tmp").write_text('{"format": 1, "clus')
    loaded = store.load_now()
    assert loaded is not None and loaded.version == 1
    store.save_now(MetadataImage(cluster_id="c", version=2))
    loaded = store.load_now()
    assert loaded is not None and loaded.version == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metadata.json"]


@pytest.mark.parametrize("content", ["", "{", "[]", '{"format": 99}', '{"format": 1}'])
def test_corrupt_metadata_is_refused(tmp_path: Path, content: str):
    (tmp_path / "metadata.json").write_text(content)
    with pytest.raises(CorruptMetadataError):
        JsonFileMetadataStore(tmp_path).load_now()


def test_file_is_plain_json(tmp_path: Path):
    store = JsonFileMetadataStore(tmp_path)
    store.save_now(MetadataImage(cluster_id="c", version=7, next_leader_index=2))
    doc = json.loads((tmp_path / "metadata.json").read_text())
    assert doc["cluster_id"] == "c" and doc["version"] == 7 and doc["topics"] == []


def test_the_async_interface_saves_and_loads_the_same_file(tmp_path: Path):
    async def scenario() -> None:
        store = JsonFileMetadataStore(tmp_path)
        assert await store.load() is None
        image = MetadataImage(cluster_id="c", version=9, next_producer_id=3000)
        await store.save(image)
        assert await store.load() == image
        assert JsonFileMetadataStore(tmp_path).load_now() == image
        await store.close()

    asyncio.run(scenario())
