"""Durable copy of the cluster metadata: the :class:`MetadataStore` interface, the JSON
encoding of an image that every store uses, and the simplest store, a JSON file rewritten
atomically on every change (``--metadata-store file``; the default store is the replicated
metadata log on the log nodes, :mod:`~services.replicator.metadata_log`).

The interface is asynchronous (``load``/``save``/``close``): a store may have to reach other
processes. A failed save raises :class:`OSError` (the controller then keeps its previous
image); :class:`DeposedError`, an ``OSError`` too, says that another replicator has taken over
the metadata and this one must stop writing.

JSON encoding of an image (also ``<data_dir>/metadata.json``, UTF-8)::

    {"format": 1, "cluster_id": "...", "version": 12, "next_leader_index": 3,
     "topics": [{"name": "t", "topic_id": "<uuid>", "configs": {"k": "v"},
                 "partitions": [{"partition": 0, "leader": 1, "leader_epoch": 0,
                                 "replicas": [1, 2], "isr": [1, 2]}]}],
     "pending_deletions": {"2": [["old-topic", 0]]}, "next_producer_id": 2000}

``next_producer_id`` was added later; a document without it starts producer ids at 0.

Log node liveness is not stored (it is re-learned by health checks after a restart), but the
version is, so versions keep increasing across restarts.

File invariant: ``metadata.json`` is always a complete document. A save writes
``metadata.json.tmp``, fsyncs it, renames it over ``metadata.json`` and fsyncs the directory;
a crash at any point leaves either the old or the new document. A leftover ``.tmp`` is ignored.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any, Protocol

from .metadata import MetadataImage, NodeId, PartitionRegistration, TopicName, TopicRegistration

FORMAT = 1
FILE_NAME = "metadata.json"


class MetadataStore(Protocol):
    async def load(self) -> MetadataImage | None:
        """The last saved image (without log nodes), or None if nothing was ever saved."""
        ...

    async def save(self, image: MetadataImage) -> None:
        """Make ``image`` durable before returning; raises OSError on failure (DeposedError
        when another writer has taken over)."""
        ...

    async def close(self) -> None:
        """Release connections; the store is not used afterwards."""
        ...


class DeposedError(OSError):
    """Another replicator has taken over the metadata (a newer controller epoch is stored):
    this one's writes can no longer become the state, and it must stop acting as the
    controller."""


class CorruptMetadataError(Exception):
    """The metadata file exists but cannot be read; refusing to start beats forgetting every
    topic."""


class JsonFileMetadataStore:
    """:class:`MetadataStore` as one JSON file in ``data_dir``; file I/O runs in a worker
    thread. Callers serialise their saves (the controller's commit lock)."""

    def __init__(self, data_dir: str | os.PathLike[str]) -> None:
        self.directory = Path(data_dir)
        self.path = self.directory / FILE_NAME

    async def load(self) -> MetadataImage | None:
        return await asyncio.to_thread(self.load_now)

    async def save(self, image: MetadataImage) -> None:
        await asyncio.to_thread(self.save_now, image)

    async def close(self) -> None:
        pass

    def load_now(self) -> MetadataImage | None:
        """:meth:`load`, blocking."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            return decode_image(json.loads(raw))
        except (ValueError, KeyError, TypeError) as e:
            raise CorruptMetadataError(f"{self.path}: {e}") from e

    def save_now(self, image: MetadataImage) -> None:
        """:meth:`save`, blocking."""
        self.directory.mkdir(parents=True, exist_ok=True)
        data = json.dumps(encode_image(image), indent=1, sort_keys=True).encode()
        tmp = self.path.with_name(FILE_NAME + ".tmp")
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        dir_fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def encode_image(image: MetadataImage) -> dict[str, Any]:
    """The JSON document of ``image`` (without log nodes)."""
    return {
        "format": FORMAT,
        "cluster_id": image.cluster_id,
        "version": image.version,
        "next_leader_index": image.next_leader_index,
        "topics": [
            {
                "name": t.name,
                "topic_id": t.topic_id,
                "configs": dict(t.configs),
                "partitions": [
                    {
                        "partition": p.partition,
                        "leader": p.leader,
                        "leader_epoch": p.leader_epoch,
                        "replicas": list(p.replicas),
                        "isr": list(p.isr),
                    }
                    for p in t.partitions
                ],
            }
            for t in sorted(image.topics.values(), key=lambda t: t.name)
        ],
        "pending_deletions": {
            str(node): sorted([topic, partition] for topic, partition in parts)
            for node, parts in sorted(image.pending_deletions.items())
        },
        "next_producer_id": image.next_producer_id,
    }


def decode_image(doc: Any) -> MetadataImage:
    """The image of a JSON document; ValueError, KeyError or TypeError if it is not one."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError("not a metadata document of format 1")
    topics = {}
    for t in doc["topics"]:
        topic = TopicRegistration(
            name=TopicName(str(t["name"])),
            topic_id=str(t["topic_id"]),
            configs={str(k): str(v) for k, v in t["configs"].items()},
            partitions=tuple(
                PartitionRegistration(
                    partition=int(p["partition"]),
                    leader=NodeId(int(p["leader"])),
                    leader_epoch=int(p["leader_epoch"]),
                    replicas=tuple(NodeId(int(r)) for r in p["replicas"]),
                    isr=tuple(NodeId(int(r)) for r in p["isr"]),
                )
                for p in t["partitions"]
            ),
        )
        topics[topic.name] = topic
    return MetadataImage(
        cluster_id=str(doc["cluster_id"]),
        version=int(doc["version"]),
        topics=topics,
        next_leader_index=int(doc["next_leader_index"]),
        pending_deletions={
            NodeId(int(node)): frozenset((str(topic), int(partition)) for topic, partition in parts)
            for node, parts in doc["pending_deletions"].items()
        },
        next_producer_id=int(doc.get("next_producer_id", 0)),
    )
