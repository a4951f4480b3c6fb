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
     "pending_deletions": {"2": [["old-topic", 0]]}, "next_producer_id": 2000,
     "acls": [{"resource_type": "TOPIC", "resource_name": "orders", "pattern_type": "LITERAL",
               "principal": "User:alice", "host": "*", "operation": "WRITE",
               "permission": "ALLOW"}],
     "scram_credentials": [{"user": "alice", "mechanism": 2, "salt": "<base64>",
                            "stored_key": "<base64>", "server_key": "<base64>",
                            "iterations": 8192}],
     "client_quotas": [{"entity": {"user": "alice", "client-id": null},
                        "values": {"producer_byte_rate": 1048576.0}}]}

``next_producer_id`` was added later, and the security metadata (``acls``,
``scram_credentials``, ``client_quotas``; ACL codes by their Kafka names, SCRAM mechanisms by
Kafka's ScramMechanism code, a null entity name for a default entity) after it; a document
without them starts producer ids at 0 and has none. A partition being reassigned also has
``"adding"`` and ``"removing"`` replica lists (absent: none); ``"config_resources"`` (dynamic
broker configs: ``[{"resource_type": 4, "name": "", "configs": {...}}]``) came last.

Log node liveness is not stored (it is re-learned by health checks after a restart), but the
version is, so versions keep increasing across restarts.

File invariant: ``metadata.json`` is always a complete document. A save writes
``metadata.json.tmp``, fsyncs it, renames it over ``metadata.json`` and fsyncs the directory;
a crash at any point leaves either the old or the new document. A leftover ``.tmp`` is ignored.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
from pathlib import Path
from typing import Any, Protocol

from services.common.acls import AclBinding, Operation, PatternType, Permission, ResourceType

from .metadata import (
    MetadataImage,
    NodeId,
    PartitionRegistration,
    ScramCredential,
    TopicName,
    TopicRegistration,
    quota_entity,
)

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
                        **({"adding": list(p.adding), "removing": list(p.removing)}
                           if p.reassigning else {}),
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
        "acls": [encode_acl(b) for b in image.acls],
        "scram_credentials": [
            {
                "user": user,
                "mechanism": mechanism,
                "salt": _b64(c.salt),
                "stored_key": _b64(c.stored_key),
                "server_key": _b64(c.server_key),
                "iterations": c.iterations,
            }
            for (user, mechanism), c in sorted(image.scram_credentials.items())
        ],
        "client_quotas": [
            {"entity": dict(entity), "values": dict(sorted(values.items()))}
            for entity, values in sorted(image.client_quotas.items(), key=_entity_order)
        ],
        "config_resources": [
            {"resource_type": kind, "name": name, "configs": dict(sorted(configs.items()))}
            for (kind, name), configs in sorted(image.config_resources.items())
        ],
    }


def encode_acl(binding: AclBinding) -> dict[str, str]:
    """An ACL binding as JSON, codes by their Kafka names (the ``initial_acls_file`` form)."""
    return {
        "resource_type": binding.resource_type.name,
        "resource_name": binding.resource_name,
        "pattern_type": binding.pattern_type.name,
        "principal": binding.principal,
        "host": binding.host,
        "operation": binding.operation.name,
        "permission": binding.permission.name,
    }


def decode_acl(doc: Any) -> AclBinding:
    """The binding of :func:`encode_acl`'s form; names in any case, ``host`` ``*`` when left
    out. Raises ValueError, KeyError or TypeError when it is not one."""
    if not isinstance(doc, dict):
        raise TypeError(f"an ACL binding is a JSON object, not {doc!r}")

    def code(enum: Any, key: str) -> Any:
        value = doc[key]
        if not isinstance(value, str) or value.upper() not in enum.__members__:
            raise ValueError(f"{key} {value!r} is none of {', '.join(enum.__members__)}")
        return enum[value.upper()]

    return AclBinding(
        resource_type=code(ResourceType, "resource_type"),
        resource_name=str(doc["resource_name"]),
        pattern_type=code(PatternType, "pattern_type"),
        principal=str(doc["principal"]),
        host=str(doc.get("host", "*")),
        operation=code(Operation, "operation"),
        permission=code(Permission, "permission"),
    )


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _entity_order(item: tuple[Any, Any]) -> list[tuple[str, str]]:
    # None (a default entity) sorts apart from every name.
    return [(kind, "\0" if name is None else "\1" + name) for kind, name in item[0]]


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
                    adding=tuple(NodeId(int(r)) for r in p.get("adding", ())),
                    removing=tuple(NodeId(int(r)) for r in p.get("removing", ())),
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
        acls=tuple(decode_acl(b) for b in doc.get("acls", ())),
        scram_credentials={
            (str(c["user"]), int(c["mechanism"])): ScramCredential(
                salt=base64.b64decode(c["salt"]),
                stored_key=base64.b64decode(c["stored_key"]),
                server_key=base64.b64decode(c["server_key"]),
                iterations=int(c["iterations"]),
            )
            for c in doc.get("scram_credentials", ())
        },
        client_quotas={
            quota_entity({str(kind): None if name is None else str(name)
                          for kind, name in q["entity"].items()}):
                {str(key): float(value) for key, value in q["values"].items()}
            for q in doc.get("client_quotas", ())
        },
        config_resources={
            (int(r["resource_type"]), str(r["name"])): {
                str(k): str(v) for k, v in r["configs"].items()}
            for r in doc.get("config_resources", ())
        },
    )
