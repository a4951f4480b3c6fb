"""The handler's view of cluster metadata (Kafka's ``MetadataCache``).

The replicator owns cluster metadata; a handler keeps the latest snapshot it was told about:
log nodes (the brokers clients see), topics with their partitions, leaders, replicas, ISR and
leader epochs, the cluster id and the controller; and the security metadata: ACL bindings,
which users have SCRAM credentials (mechanism and iterations only: the keys stay with the
replicator and the frontends) and client quotas. A snapshot is immutable; the cache swaps
whole snapshots, so readers never see a half-applied change.

The cache is fed by a stream of snapshots (the replicator's ``WatchMetadata``: the current
state, then every change), followed for the handler's whole life and reconnected with a
backoff when it breaks. When the cache is still empty, or right after this handler created or
deleted topics, it loads a snapshot directly so its own answers are fresh.

Snapshots carry a version that increases with every change; an older snapshot never replaces a
newer one, except the first snapshot of a new stream, which is the replicator's current state
by definition (it may have restarted).

Not thread-safe; used from one event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from services.common.acls import AclBinding
from services.common.errors import ErrorCode, KafkaError

from .topic_identity import canonical_topic_id

log = logging.getLogger(__name__)

NO_NODE = -1
# A topic's min.insync.replicas when it sets none (Kafka's default).
DEFAULT_MIN_INSYNC_REPLICAS = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class LogNode:
    """A log node: a broker as Kafka clients see it. ``fenced``: down for the session timeout
    or exited, its partitions moved to other leaders (a node not alive but not fenced still
    leads its partitions); it stays a broker (see :meth:`ClusterMetadata.brokers`)."""

    node_id: int
    address: str
    rack: str | None = None
    alive: bool = True
    fenced: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionInfo:
    partition: int
    leader: int
    leader_epoch: int
    replicas: tuple[int, ...] = ()
    isr: tuple[int, ...] = ()
    offline_replicas: tuple[int, ...] = ()
    # While being reassigned: the replicas joining and those leaving.
    adding_replicas: tuple[int, ...] = ()
    removing_replicas: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class TopicInfo:
    name: str
    # Canonical UUID text, or None when the replicator gave none.
    topic_id: str | None
    internal: bool = False
    configs: Mapping[str, str] = field(default_factory=dict)
    partitions: Mapping[int, PartitionInfo] = field(default_factory=dict)

    @property
    def min_insync_replicas(self) -> int:
        """The topic's min.insync.replicas: the ISR an acks=all write needs (1 when unset or
        unreadable)."""
        try:
            return int(self.configs.get("min.insync.replicas", DEFAULT_MIN_INSYNC_REPLICAS))
        except ValueError:
            return DEFAULT_MIN_INSYNC_REPLICAS


@dataclass(frozen=True, slots=True, kw_only=True)
class ScramCredentialInfo:
    """That a user has a SCRAM credential: its mechanism (Kafka's ScramMechanism code, 1
    SCRAM-SHA-256, 2 SCRAM-SHA-512) and iteration count, all DescribeUserScramCredentials
    tells."""

    mechanism: int
    iterations: int


# A client quota entity: (entity type, name) pairs sorted by type; None names the default
# entity of the type.
QuotaEntity = tuple[tuple[str, str | None], ...]


class ClusterMetadata:
    """One immutable snapshot of cluster metadata, indexed for the lookups requests need."""

    __slots__ = ("_by_id", "acls", "client_quotas", "cluster_id", "config_resources",
                 "controller_id", "log_nodes", "scram_credentials", "topics", "version")

    def __init__(
        self,
        *,
        version: int,
        cluster_id: str,
        controller_id: int,
        log_nodes: Iterable[LogNode],
        topics: Iterable[TopicInfo],
        acls: Iterable[AclBinding] = (),
        scram_credentials: Mapping[str, Iterable[ScramCredentialInfo]] | None = None,
        client_quotas: Mapping[QuotaEntity, Mapping[str, float]] | None = None,
        config_resources: Mapping[tuple[int, str], Mapping[str, str]] | None = None,
    ) -> None:
        self.version = version
        self.cluster_id = cluster_id
        self.controller_id = controller_id
        self.log_nodes: Mapping[int, LogNode] = MappingProxyType(
            {n.node_id: n for n in log_nodes}
        )
        self.topics: Mapping[str, TopicInfo] = MappingProxyType({t.name: t for t in topics})
        self._by_id = {t.topic_id: t for t in self.topics.values() if t.topic_id}
        self.acls: tuple[AclBinding, ...] = tuple(acls)
        # By user, each user's credentials ordered by mechanism.
        self.scram_credentials: Mapping[str, tuple[ScramCredentialInfo, ...]] = MappingProxyType({
            user: tuple(sorted(infos, key=lambda i: i.mechanism))
            for user, infos in (scram_credentials or {}).items()})
        self.client_quotas: Mapping[QuotaEntity, Mapping[str, float]] = MappingProxyType({
            entity: MappingProxyType(dict(values))
            for entity, values in (client_quotas or {}).items()})
        # Dynamic configs of other config resources, by (ConfigResource type, name): BROKER
        # ones, name "" cluster-wide.
        self.config_resources: Mapping[tuple[int, str], Mapping[str, str]] = MappingProxyType({
            key: MappingProxyType(dict(values))
            for key, values in (config_resources or {}).items()})

    def topic(self, name: str) -> TopicInfo | None:
        return self.topics.get(name)

    def topic_by_id(self, topic_id: str | None) -> TopicInfo | None:
        """The topic with this id (any accepted spelling); None for unknown or zero ids."""
        key = canonical_topic_id(topic_id)
        return self._by_id.get(key) if key else None

    def live_nodes(self) -> list[LogNode]:
        """Live log nodes in id order."""
        return sorted((n for n in self.log_nodes.values() if n.alive), key=lambda n: n.node_id)

    def brokers(self) -> list[LogNode]:
        """The brokers Kafka clients are told about, in id order: every log node, fenced or
        not. A Kafka broker is an address clients send requests to, and the frontend serves
        each log node's broker port whatever became of the node; a fenced node is a broker
        whose replicas are offline and which leads nothing (as a Kafka broker whose log
        directory failed): no partition leader or coordinator names it.

        Dropping it would strand clients: librdkafka forgets a broker missing from a Metadata
        answer while its coordinator cache may still name it as a group's coordinator, and a
        request for that group (TxnOffsetCommit, admin group requests) then waits for that
        broker to come up, which it never does, without error and past its timeout
        (``rd_kafka_coord_req_fsm``). Listed, the broker stays connected and answers there:
        NOT_COORDINATOR sends the client to the new coordinator."""
        return sorted(self.log_nodes.values(), key=lambda n: n.node_id)

    def live_node(self, node_id: int) -> LogNode | None:
        node = self.log_nodes.get(node_id)
        return node if node is not None and node.alive else None

    def unfenced_node(self, node_id: int) -> LogNode | None:
        """The node if it is not fenced, alive or not (Kafka's alive broker: registered and
        not fenced)."""
        node = self.log_nodes.get(node_id)
        return node if node is not None and not node.fenced else None

    def client_controller_id(self) -> int:
        """The controller id to give Kafka clients: a live broker they can send admin requests
        to. Every handler can serve those, so any live log node will do; prefer the one the
        replicator names, else the lowest live id (as KRaft brokers pick an alive broker)."""
        if self.live_node(self.controller_id) is not None:
            return self.controller_id
        live = self.live_nodes()
        return live[0].node_id if live else NO_NODE

    def offline_replicas(self, partition: PartitionInfo) -> list[int]:
        """Replicas the replicator reports offline plus those on nodes that are not live."""
        offline = set(partition.offline_replicas)
        return [r for r in partition.replicas if r in offline or self.live_node(r) is None] + [
            r for r in partition.offline_replicas if r not in partition.replicas
        ]


class MetadataUnavailableError(KafkaError):
    """No metadata snapshot could be obtained (the replicator is unreachable and nothing is
    cached yet)."""

    def __init__(self, message: str = "cluster metadata is not available yet") -> None:
        super().__init__(ErrorCode.leader_not_available, message)


Loader = Callable[[], Awaitable[ClusterMetadata]]
StreamFactory = Callable[[], AsyncIterator[ClusterMetadata]]


class Backoff:
    """Exponential delays between reconnection attempts: initial, doubling, capped."""

    def __init__(self, initial: float = 0.1, maximum: float = 2.0) -> None:
        self._initial = initial
        self._maximum = maximum
        self._next = initial

    def next_delay(self) -> float:
        delay = self._next
        self._next = min(self._next * 2, self._maximum)
        return delay

    def reset(self) -> None:
        self._next = self._initial


class MetadataCache:
    """The latest known snapshot, with a loader for when it must be fresh."""

    def __init__(self, loader: Loader) -> None:
        self._loader = loader
        self._snapshot: ClusterMetadata | None = None
        self._first_load: asyncio.Future[ClusterMetadata] | None = None
        self._listeners: list[Callable[[ClusterMetadata], None]] = []

    @property
    def snapshot(self) -> ClusterMetadata | None:
        return self._snapshot

    def install(self, snapshot: ClusterMetadata, *, authoritative: bool = False) -> bool:
        """Make ``snapshot`` current unless a newer version is already installed.

        ``authoritative`` (the first snapshot of a new stream) replaces whatever is installed.
        Returns whether the snapshot was installed.
        """
        current = self._snapshot
        if current is not None and not authoritative and snapshot.version < current.version:
            return False
        self._snapshot = snapshot
        for listener in self._listeners:
            try:
                listener(snapshot)
            except Exception:
                log.exception("metadata listener failed")
        return True

    def add_listener(self, listener: Callable[[ClusterMetadata], None]) -> None:
        """Call ``listener(snapshot)`` whenever a snapshot is installed."""
        self._listeners.append(listener)

    async def current(self) -> ClusterMetadata:
        """The installed snapshot; when none is installed yet, loads one (concurrent callers
        share that load).

        Raises MetadataUnavailableError when nothing is installed and loading fails.
        """
        if self._snapshot is not None:
            return self._snapshot
        if self._first_load is None:
            self._first_load = asyncio.ensure_future(self._load())
            self._first_load.add_done_callback(self._first_load_done)
        return await asyncio.shield(self._first_load)

    def _first_load_done(self, future: asyncio.Future[ClusterMetadata]) -> None:
        self._first_load = None
        if not future.cancelled():
            future.exception()  # retrieved here so an unawaited failure is not reported

    async def refresh(self) -> ClusterMetadata:
        """Load a snapshot now (a load of its own, so it reflects everything done before the
        call) and install it unless it is older than the installed one.

        Returns the installed snapshot. A failed load returns the installed snapshot, or raises
        MetadataUnavailableError when there is none.
        """
        try:
            return await self._load()
        except MetadataUnavailableError:
            if self._snapshot is not None:
                return self._snapshot
            raise

    async def reload(self) -> None:
        """:meth:`refresh` after this handler changed the metadata, so its own next answers
        show the change; best effort (a failure is logged)."""
        try:
            await self.refresh()
        except MetadataUnavailableError as exc:
            log.warning("reloading metadata after a change failed: %s", exc)

    async def _load(self) -> ClusterMetadata:
        try:
            snapshot = await self._loader()
        except Exception as exc:
            log.warning("loading cluster metadata failed: %s", exc)
            raise MetadataUnavailableError(f"cluster metadata is not available: {exc}") from exc
        self.install(snapshot)
        assert self._snapshot is not None
        return self._snapshot

    async def follow(self, stream: StreamFactory, backoff: Backoff | None = None) -> None:
        """Install every snapshot of ``stream()`` until cancelled, reopening it with a backoff
        whenever it ends or fails."""
        backoff = backoff or Backoff()
        # Report the first failure after a working stream; repeats only at debug level.
        quiet = False
        while True:
            first = True
            problem = "ended"
            try:
                async for snapshot in stream():
                    self.install(snapshot, authoritative=first)
                    first = False
                    quiet = False
                    backoff.reset()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the stream is reopened whatever broke it
                problem = f"broke ({exc})"
            log.log(logging.DEBUG if quiet else logging.WARNING,
                    "metadata stream %s; reconnecting", problem)
            quiet = True
            await asyncio.sleep(backoff.next_delay())
