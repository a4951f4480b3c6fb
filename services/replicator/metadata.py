"""The cluster metadata image: an immutable snapshot of everything the controller knows (Kafka's
``MetadataImage``): the cluster id, the metadata version, the log nodes and their liveness, and
every topic with its partitions' replicas, leader, leader epoch and ISR; and the security
metadata: ACL bindings, SCRAM credentials and client quotas.

Every change clients can see produces a new image with ``version`` one higher; readers hold
an image without locks. Replicas on log nodes that are not alive are the partition's offline
replicas; they are derived from liveness, not stored.
"""

from __future__ import annotations

import base64
import dataclasses
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import NewType

from services.common.acls import AclBinding

NodeId = NewType("NodeId", int)
TopicName = NewType("TopicName", str)

NO_NODE = NodeId(-1)

# Topics the broker itself uses; flagged internal in metadata (Kafka's Topic.INTERNAL_TOPICS).
INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state"})


@dataclass(frozen=True, slots=True, kw_only=True)
class LogNode:
    """A log node from configuration, whether its last health check succeeded, whether it is
    fenced (its checks failed for the session timeout, or its process exited), and whether it
    is in controlled shutdown (it asked to stop and hands its leaderships over: it is in no
    ISR and is elected nowhere, Kafka's ``inControlledShutdown`` broker registration)."""

    node_id: NodeId
    address: str
    rack: str = ""
    alive: bool = False
    fenced: bool = False
    in_controlled_shutdown: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionRegistration:
    """One partition's replica set. ``replicas[0]`` is the preferred leader; ``isr`` is a
    subset of ``replicas``; ``leader`` is in ``isr`` (or -1 when no replica can lead).

    During a reassignment (:mod:`~services.replicator.controller.reassignments`) ``replicas``
    is the target replicas followed by those leaving, ``adding`` the target replicas that were
    not replicas before and ``removing`` those leaving; both are empty otherwise."""

    partition: int
    leader: NodeId
    leader_epoch: int
    replicas: tuple[NodeId, ...]
    isr: tuple[NodeId, ...]
    adding: tuple[NodeId, ...] = ()
    removing: tuple[NodeId, ...] = ()

    @property
    def reassigning(self) -> bool:
        return bool(self.adding or self.removing)

    @property
    def target(self) -> tuple[NodeId, ...]:
        """The replicas the partition has once its reassignment is done."""
        return tuple(r for r in self.replicas if r not in self.removing)

    @property
    def original(self) -> tuple[NodeId, ...]:
        """The replicas it had before its reassignment began."""
        return tuple(r for r in self.replicas if r not in self.adding)


@dataclass(frozen=True, slots=True, kw_only=True)
class TopicRegistration:
    """A topic: its name, its id (a UUID in canonical text form), its explicitly set configs
    (Kafka names, values as given) and its partitions, indexed 0..n-1."""

    name: TopicName
    topic_id: str
    configs: Mapping[str, str]
    partitions: tuple[PartitionRegistration, ...]

    @property
    def internal(self) -> bool:
        return self.name in INTERNAL_TOPICS

    @property
    def replication_factor(self) -> int:
        return len(self.partitions[0].replicas) if self.partitions else 0


@dataclass(frozen=True, slots=True, kw_only=True)
class ScramCredential:
    """What RFC 5802 lets a server keep of a user's password for one mechanism (Kafka's
    ``ScramCredentialData``): never the password, nor the salted password."""

    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int

    def __repr__(self) -> str:  # keys stay out of logs
        return f"ScramCredential(iterations={self.iterations}, salt=..., keys=...)"


# A user and Kafka's ScramMechanism code (1 SCRAM-SHA-256, 2 SCRAM-SHA-512).
ScramKey = tuple[str, int]

# A client quota entity (Kafka's ClientQuotaEntity): (entity type, name) pairs sorted by
# type, the name None for the default entity of that type.
QuotaEntity = tuple[tuple[str, str | None], ...]


# A config resource other than a topic: (Kafka's ConfigResource type, name).
ConfigResourceKey = tuple[int, str]


def quota_entity(parts: Mapping[str, str | None]) -> QuotaEntity:
    """The entity of ``{entity type: name or None}``."""
    return tuple(sorted(parts.items()))


@dataclass(frozen=True, slots=True, kw_only=True)
class MetadataImage:
    """The whole cluster metadata at one version.

    ``next_leader_index`` is where the next automatic assignment starts its round-robin;
    ``pending_deletions`` are partition replicas of deleted topics that a log node has not yet
    confirmed deleting (it was unreachable), retried later; ``next_producer_id`` is the first id
    of the next block of producer ids (:mod:`~services.replicator.controller.producer_ids`).

    Security metadata: ``acls``, the ACL bindings, each once, in the order they were created;
    ``scram_credentials`` by user and mechanism; ``client_quotas``, each entity's quota values
    by Kafka quota key (an entity without values is absent). ``config_resources``: dynamic
    configs of config resources other than topics
    (:mod:`~services.replicator.controller.config_resources`).
    """

    cluster_id: str
    version: int
    log_nodes: tuple[LogNode, ...] = ()
    topics: Mapping[TopicName, TopicRegistration] = field(default_factory=dict)
    next_leader_index: int = 0
    pending_deletions: Mapping[NodeId, frozenset[tuple[str, int]]] = field(default_factory=dict)
    next_producer_id: int = 0
    acls: tuple[AclBinding, ...] = ()
    scram_credentials: Mapping[ScramKey, ScramCredential] = field(default_factory=dict)
    client_quotas: Mapping[QuotaEntity, Mapping[str, float]] = field(default_factory=dict)
    # Dynamic configs of other config resources (BROKER ones), each resource with values.
    config_resources: Mapping[ConfigResourceKey, Mapping[str, str]] = field(
        default_factory=dict)

    @property
    def live_node_ids(self) -> tuple[NodeId, ...]:
        """Ids of the log nodes that are alive, ascending."""
        return tuple(sorted(n.node_id for n in self.log_nodes if n.alive))

    @property
    def active_node_ids(self) -> tuple[NodeId, ...]:
        """Ids of the log nodes that may lead, join an ISR or receive new replicas: alive and
        not in controlled shutdown (Kafka's active broker), ascending."""
        return tuple(sorted(n.node_id for n in self.log_nodes
                            if n.alive and not n.in_controlled_shutdown))

    @property
    def controller_id(self) -> NodeId:
        """What clients are told the controller is: the lowest live log node id (they want a
        real broker id), -1 when none is alive."""
        live = self.live_node_ids
        return live[0] if live else NO_NODE

    def offline_replicas(self, partition: PartitionRegistration) -> tuple[NodeId, ...]:
        live = set(self.live_node_ids)
        return tuple(r for r in partition.replicas if r not in live)

    def topic_by_id(self, topic_id: str) -> TopicRegistration | None:
        for topic in self.topics.values():
            if topic.topic_id == topic_id:
                return topic
        return None

    def replace(self, **changes: object) -> MetadataImage:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    def with_topics(
        self,
        added: Iterable[TopicRegistration] = (),
        removed: Iterable[str] = (),
    ) -> MetadataImage:
        topics = dict(self.topics)
        for name in removed:
            topics.pop(TopicName(name), None)
        for topic in added:
            topics[topic.name] = topic
        return self.replace(topics=topics)


def kafka_uuid_text(value: uuid.UUID) -> str:
    """Kafka's text form of a UUID (``Uuid.toString``): URL-safe base64 without padding."""
    return base64.urlsafe_b64encode(value.bytes).decode("ascii").rstrip("=")


def new_cluster_id() -> str:
    """A fresh cluster id in Kafka's form (22 characters, never starting with '-')."""
    while True:
        text = kafka_uuid_text(uuid.uuid4())
        if not text.startswith("-"):
            return text


def new_topic_id(taken: Iterable[str] = ()) -> str:
    """A fresh topic id as canonical UUID text, unique among ``taken``. Like Kafka, avoids ids
    whose base64 form starts with '-' (command-line tools would read them as flags)."""
    used = set(taken)
    while True:
        value = uuid.uuid4()
        text = str(value)
        if text not in used and not kafka_uuid_text(value).startswith("-"):
            return text
