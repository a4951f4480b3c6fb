"""The controller: owner of the cluster metadata (Kafka's QuorumController with its
ReplicationControlManager and ClusterControlManager, reduced to what a single active replicator
needs). Creates and deletes topics, changes topic configs, adds partitions, tracks log node
liveness, and publishes each new image.

Consistency rules:

- Topic creation, deletion, config changes and partition additions run one at a time (an
  asyncio lock), so of two concurrent requests for the same name exactly one creates it, and
  a deletion's replica removal cannot interleave with a re-creation of the same name.
- A new topic is committed to the metadata only after every live replica's log node confirmed
  creating its partitions. If any of them fails, the topic's result carries the error, the topic
  is not committed, and the replicas already created are deleted again (best effort; leftovers
  become pending deletions). The other topics of the same request are unaffected.
- Deletion commits first (clients stop seeing the topic), then asks the log nodes to delete the
  replicas. Replicas that could not be deleted (node down) stay in ``pending_deletions``, which
  is persisted and retried after each node check and before a topic of the same name is placed
  on that node again.
- Each committed change is saved durably (:class:`MetadataStore`, by default the replicated
  metadata log on the log nodes) before it becomes visible; a failed save leaves the previous
  image in place. Commits run one at a time (the commit lock), each computing its change from
  the image current when it holds the lock, so a change computed before an await never
  overwrites one committed meanwhile. Creation and deletion go on even if the caller goes away,
  so a request is never half applied.
- Deposed: when the store finds that another replicator has taken over the metadata
  (:class:`DeposedError`), every later commit fails and :attr:`Controller.deposed` is set; the
  caller must stop serving as the controller.
- Config changes commit first, then go to every live log node holding a replica of the topic
  (one call per node) before the caller is answered. A node that could not take them is
  brought up to date (all its replicas' configs) after a later node check, as is every node
  that comes back to life; until then it applies the configs it had.
- Added partitions follow the rules of creation: committed only after every live replica's
  log node created them, undone otherwise.
- Liveness: a node is alive while its latest health check answered SERVING. Only live nodes
  receive new replicas and count toward the replication factor limit. Liveness changes bump the
  version.
- New replicas are created with their state (leader or follower at epoch 0), so a leader never
  commits appends alone when it has followers.
- Fencing: a node that has not answered its health checks for ``node_session_timeout_ms`` is
  fenced (:mod:`~services.replicator.replication.election`): it leaves every ISR, and each
  partition it led gets a new leader from the rest of its ISR, at the next epoch (from outside
  the ISR only with unclean.leader.election.enable). Checked after every node check, so a
  partition left offline gets its leader as soon as a replica of its ISR is back.
- Preferred leaders: every ``leader.imbalance.check.interval``, partitions go back to their
  first replica where it is live and in sync (auto.leader.rebalance.enable).
- ISR changes (:meth:`Controller.change_isr`, from the replication role) commit at once,
  without waiting for topic operations: they name the leader and epoch they were computed for
  and are dropped if the partition moved on. Topic operations therefore rebuild partitions from
  the image current at their commit, never from the one they started with.

Not thread-safe: one event loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from services.common.errors import ErrorCode, KafkaError

from . import metrics
from .assignment import assign_replicas, ring_position
from .log_nodes import LogNodeClient, LogNodeError, PartitionFailure, PartitionSpec
from .metadata import (
    LogNode,
    MetadataImage,
    NodeId,
    PartitionRegistration,
    TopicName,
    TopicRegistration,
    new_cluster_id,
    new_topic_id,
)
from .metadata_log import METADATA_TOPIC
from .metadata_store import DeposedError, MetadataStore
from .producer_ids import ProducerIdBlock, next_block
from .publisher import ImagePublisher
from .replication.election import Election, fence, preferred
from .replication.nodes import ReplicaState, Role
from .topic_rules import (
    ConfigOperation,
    apply_config_changes,
    collision_key,
    resolve_num_partitions,
    resolve_replication_factor,
    validate_assignment,
    validate_configs,
    validate_topic_name,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

# A guard against requests that would exhaust memory; far above any real topic.
MAX_PARTITIONS_PER_TOPIC = 100_000


@dataclass(frozen=True, slots=True, kw_only=True)
class NewTopic:
    """A topic to create. -1 counts mean the configured defaults; with ``assignments`` (replica
    node ids per partition index) both counts must be -1."""

    name: str
    num_partitions: int = -1
    replication_factor: int = -1
    configs: Mapping[str, str] = field(default_factory=dict)
    assignments: Mapping[int, Sequence[int]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class TopicResult:
    """The outcome for one topic of a create or delete request."""

    name: str
    topic_id: str = ""
    error: ErrorCode = ErrorCode.none
    message: str = ""
    num_partitions: int = -1
    replication_factor: int = -1
    configs: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class ConfigChanges:
    """Config changes for one topic: (name, operation, value) in request order; with
    ``replace`` the SETs become the whole config set (AlterConfigs)."""

    topic: str
    changes: Sequence[tuple[str, ConfigOperation, str]] = ()
    replace: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionIncrease:
    """Grow ``topic`` to ``count`` partitions; ``assignments``: replicas of each new partition
    in order (empty: placed automatically)."""

    topic: str
    count: int
    assignments: Sequence[Sequence[int]] = ()


class Controller:
    """Cluster metadata operations over a :class:`MetadataStore` and the log nodes."""

    def __init__(
        self,
        *,
        image: MetadataImage,
        store: MetadataStore,
        client: LogNodeClient,
        num_partitions: int,
        default_replication_factor: int,
        node_session_timeout_ms: int = 3000,
        unclean_leader_election: bool = False,
    ) -> None:
        if num_partitions < 1:
            raise ValueError("num_partitions must be at least 1")
        if default_replication_factor < 1:
            raise ValueError("default_replication_factor must be at least 1")
        self._image = image
        self._store = store
        self._client = client
        self._num_partitions = num_partitions
        self._default_replication_factor = default_replication_factor
        self._lock = asyncio.Lock()
        # Serialises commits: one save in flight, the image replaced only after it succeeded.
        self._commit_lock = asyncio.Lock()
        # Set once the store reported that another replicator took over.
        self.deposed = asyncio.Event()
        # Live nodes whose replicas may carry outdated configs (a push failed, or the node
        # was down); filled only after the first node check, which is the starting state.
        self._stale_configs: set[NodeId] = set()
        self._checked_once = False
        self._session_timeout_s = node_session_timeout_ms / 1000
        self._unclean_leader_election = unclean_leader_election
        # Nodes failing their health checks, since when (monotonic seconds).
        self._down_since: dict[NodeId, float] = {}
        self.publisher = ImagePublisher(image)
        metrics.observe(image)

    @classmethod
    async def open(
        cls,
        *,
        store: MetadataStore,
        client: LogNodeClient,
        log_nodes: Sequence[LogNode],
        cluster_id: str = "",
        num_partitions: int = 1,
        default_replication_factor: int = 1,
        node_session_timeout_ms: int = 3000,
        unclean_leader_election: bool = False,
    ) -> Controller:
        """Load the stored metadata (or start a new cluster), save it, and check every log node
        once, so the controller starts with real liveness. The controller owns ``store`` from
        here on (it is closed with the controller, or at once if opening fails).

        Raises ValueError if the stored cluster id differs from a configured one, OSError if
        the store cannot be read or written."""
        try:
            stored = await store.load()
            if stored is None:
                image = MetadataImage(cluster_id=cluster_id or new_cluster_id(), version=1)
            elif cluster_id and stored.cluster_id != cluster_id:
                raise ValueError(
                    f"the stored metadata belongs to cluster {stored.cluster_id!r}, "
                    f"not the configured {cluster_id!r}"
                )
            else:
                image = stored
            image = image.replace(log_nodes=tuple(log_nodes))
            await store.save(image)
        except BaseException:
            await store.close()
            raise
        controller = cls(
            image=image,
            store=store,
            client=client,
            num_partitions=num_partitions,
            default_replication_factor=default_replication_factor,
            node_session_timeout_ms=node_session_timeout_ms,
            unclean_leader_election=unclean_leader_election,
        )
        await controller.check_nodes()
        return controller

    @property
    def image(self) -> MetadataImage:
        return self._image

    # -- log node liveness ------------------------------------------------------------------

    async def check_nodes(self) -> None:
        """Health-check every log node once and record who is alive; then retry pending
        replica deletions on live nodes (unless a topic operation is running)."""
        nodes = self._image.log_nodes
        serving = await asyncio.gather(*(self._client.is_serving(n.node_id) for n in nodes))
        alive = {n.node_id: ok for n, ok in zip(nodes, serving, strict=True)}
        revived = await self._apply_liveness(alive)
        await self._fence(alive)
        if self._checked_once:
            self._stale_configs |= revived
        self._checked_once = True
        if self._image.pending_deletions and not self._lock.locked():
            async with self._lock:
                await self._flush_deletions(self._image.live_node_ids)
        if self._stale_configs and not self._lock.locked():
            async with self._lock:
                await self._resync_configs()

    async def run_node_checks(self, interval: float) -> None:
        """Check the log nodes every ``interval`` seconds until cancelled."""
        while True:
            await asyncio.sleep(interval)
            try:
                await self.check_nodes()
            except Exception:  # the monitor must survive any one bad round
                log.exception("log node check failed")

    async def _fence(self, alive: Mapping[NodeId, bool]) -> None:
        """Fence the nodes down for the session timeout: new leaders, smaller ISRs."""
        now = time.monotonic()
        for node, ok in alive.items():
            if ok:
                self._down_since.pop(node, None)
            else:
                self._down_since.setdefault(node, now)
        fenced = {n for n, since in self._down_since.items()
                  if now - since >= self._session_timeout_s}
        if not fenced:
            return
        changed: list[TopicRegistration] = []
        elections: list[Election] = []

        def elect(current: MetadataImage) -> MetadataImage:
            nonlocal changed, elections
            changed, elections = fence(current, fenced, current.live_node_ids,
                                       unclean_default=self._unclean_leader_election)
            return current.with_topics(added=changed) if changed else current

        try:
            await self._commit(elect)
        except OSError:
            log.exception("could not save the partitions of fenced log nodes; retrying")
            return
        for e in elections:
            kind = "clean" if e.clean else "unclean"
            metrics.LEADER_ELECTIONS.labels(kind).inc()
            log.warning("%s-%d: log node %d is fenced; node %d leads at epoch %d (%s election)",
                        e.topic, e.partition, e.old_leader, e.new_leader, e.leader_epoch, kind)
        for topic in changed:
            for p in topic.partitions:
                if p.leader in fenced:
                    log.warning("%s-%d is offline: its leader %d is fenced and no in-sync "
                                "replica can lead", topic.name, p.partition, p.leader)

    async def elect_preferred_leaders(self) -> int:
        """Give partitions back to their preferred (first) replica where it is live and in
        sync (see :mod:`~services.replicator.replication.election`); returns how many moved."""
        elections: list[Election] = []

        def elect(current: MetadataImage) -> MetadataImage:
            nonlocal elections
            changed, elections = preferred(current, current.live_node_ids)
            return current.with_topics(added=changed) if changed else current

        try:
            await self._commit(elect)
        except OSError:
            log.exception("could not save preferred leaders; retrying later")
            return 0
        for e in elections:
            metrics.LEADER_ELECTIONS.labels("preferred").inc()
            log.info("%s-%d: leadership back to the preferred replica %d (from %d) at epoch %d",
                     e.topic, e.partition, e.new_leader, e.old_leader, e.leader_epoch)
        return len(elections)

    async def run_leader_rebalance(self, interval: float) -> None:
        """Elect preferred leaders every ``interval`` seconds until cancelled."""
        while True:
            await asyncio.sleep(interval)
            try:
                await self.elect_preferred_leaders()
            except Exception:  # the loop must survive any one bad round
                log.exception("preferred leader election failed")

    async def _apply_liveness(self, alive: Mapping[NodeId, bool]) -> set[NodeId]:
        """Record liveness; returns the nodes that came alive."""
        changes: list[tuple[LogNode, LogNode]] = []

        def record(current: MetadataImage) -> MetadataImage:
            nodes = tuple(dataclasses.replace(n, alive=alive.get(n.node_id, n.alive))
                          for n in current.log_nodes)
            changes[:] = [(before, after)
                          for before, after in zip(current.log_nodes, nodes, strict=True)
                          if before.alive != after.alive]
            return current.replace(log_nodes=nodes) if changes else current

        try:
            await self._commit(record)
        except OSError:
            log.exception("could not save log node liveness; will retry at the next check")
            return set()
        for _, after in changes:
            log.info("log node %d (%s) is %s", after.node_id, after.address,
                     "alive" if after.alive else "not responding")
        return {after.node_id for _, after in changes if after.alive}

    # -- topic creation ---------------------------------------------------------------------

    async def create_topics(
        self, topics: Sequence[NewTopic], *, validate_only: bool = False
    ) -> list[TopicResult]:
        """Validate and create ``topics``; one result per request entry, in order."""
        return await self._exclusive(lambda: self._create_topics(topics, validate_only))

    async def _create_topics(
        self, requests: Sequence[NewTopic], validate_only: bool
    ) -> list[TopicResult]:
        image = self._image
        results: list[TopicResult] = [TopicResult(name=r.name) for r in requests]
        occurrences = Counter(r.name for r in requests)
        taken_names = {collision_key(name): name for name in image.topics}
        taken_ids = {t.topic_id for t in image.topics.values()}
        start_index = image.next_leader_index
        planned: dict[int, TopicRegistration] = {}
        for i, request in enumerate(requests):
            try:
                if occurrences[request.name] > 1:
                    raise KafkaError(ErrorCode.invalid_request,
                                     "Duplicate topic name in the request.")
                topic = self._plan(request, image, taken_names, taken_ids, start_index)
            except KafkaError as e:
                results[i] = _failed(request.name, e)
                continue
            if not request.assignments:
                start_index += 1
            taken_names[collision_key(topic.name)] = topic.name
            taken_ids.add(topic.topic_id)
            planned[i] = topic
            results[i] = _created(topic, with_id=not validate_only)
        if validate_only or not planned:
            return results

        failures, cleared = await self._create_on_log_nodes(list(planned.values()), image)
        created = [t for t in planned.values() if t.name not in failures]
        try:
            await self._commit(lambda current: _without_cleared(
                current.with_topics(added=created).replace(next_leader_index=start_index),
                cleared,
            ), bump=bool(created))
        except OSError as e:
            log.exception("could not save the metadata of new topics")
            for topic in created:
                failures[topic.name] = KafkaError(
                    ErrorCode.unknown_server_error, f"Could not save the cluster metadata: {e}")
            created = []
        for i, topic in planned.items():
            if topic.name in failures:
                results[i] = _failed(topic.name, failures[topic.name])
        undo = [t for t in planned.values() if t.name in failures]
        if undo:
            await self._remove_replicas(undo)
        for topic in created:
            log.info("created topic %s (%s) with %d partition(s), replication factor %d",
                     topic.name, topic.topic_id, len(topic.partitions), topic.replication_factor)
        return results

    def _plan(
        self,
        request: NewTopic,
        image: MetadataImage,
        taken_names: Mapping[str, str],
        taken_ids: Iterable[str],
        start_index: int,
    ) -> TopicRegistration:
        name = request.name
        validate_topic_name(name)
        if name == METADATA_TOPIC:
            raise KafkaError(ErrorCode.invalid_request,
                             f"Creation of internal topic {name} is prohibited.")
        if name in image.topics:
            raise KafkaError(ErrorCode.topic_already_exists, f"Topic '{name}' already exists.")
        other = taken_names.get(collision_key(name))
        if other is not None:
            raise KafkaError(ErrorCode.invalid_topic_exception,
                             f"Topic '{name}' collides with existing topic: {other}")
        live = image.live_node_ids
        if request.assignments:
            replica_lists = validate_assignment(
                request.assignments,
                num_partitions=request.num_partitions,
                replication_factor=request.replication_factor,
                known_nodes={n.node_id for n in image.log_nodes},
                live_nodes=live,
            )
            if len(replica_lists) > MAX_PARTITIONS_PER_TOPIC:
                raise KafkaError(ErrorCode.invalid_partitions,
                                 f"A topic may have at most {MAX_PARTITIONS_PER_TOPIC} partitions.")
        else:
            partitions = resolve_num_partitions(request.num_partitions, self._num_partitions)
            if partitions > MAX_PARTITIONS_PER_TOPIC:
                raise KafkaError(ErrorCode.invalid_partitions,
                                 f"A topic may have at most {MAX_PARTITIONS_PER_TOPIC} partitions.")
            factor = resolve_replication_factor(
                request.replication_factor, self._default_replication_factor, len(live))
            replica_lists = assign_replicas(num_partitions=partitions, replication_factor=factor,
                                            nodes=live, start_index=start_index,
                                            racks=_racks(image))
        configs = validate_configs(request.configs)
        live_set = set(live)
        partition_registrations = []
        for index, replicas in enumerate(replica_lists):
            isr = tuple(r for r in replicas if r in live_set)
            partition_registrations.append(PartitionRegistration(
                partition=index, leader=isr[0], leader_epoch=0, replicas=replicas, isr=isr))
        return TopicRegistration(
            name=TopicName(name),
            topic_id=new_topic_id(taken_ids),
            configs=configs,
            partitions=tuple(partition_registrations),
        )

    async def _create_on_log_nodes(
        self, topics: Sequence[TopicRegistration], image: MetadataImage
    ) -> tuple[dict[str, KafkaError], dict[NodeId, set[tuple[str, int]]]]:
        """Create the replicas on their live nodes, one call per node. Returns the failed
        topics with their error, and the pending deletions that were carried out on the way."""
        live = set(image.live_node_ids)
        specs: dict[NodeId, list[PartitionSpec]] = {}
        for topic in topics:
            for p in topic.partitions:
                for node in p.replicas:
                    if node in live:
                        specs.setdefault(node, []).append(PartitionSpec(
                            topic=topic.name, partition=p.partition, topic_id=topic.topic_id,
                            configs=topic.configs, state=replica_state(topic.name, p, node)))
        nodes = list(specs)
        cleared: dict[NodeId, set[tuple[str, int]]] = {}

        async def create_on(node: NodeId) -> list[PartitionFailure]:
            wanted = {(s.topic, s.partition) for s in specs[node]}
            # Remnants of an earlier topic with the same name go first, or the new topic would
            # inherit their records.
            stale = sorted(wanted & image.pending_deletions.get(node, frozenset()))
            if stale:
                failed = await self._client.delete_partitions(node, stale)
                if failed:
                    return failed
                cleared[node] = set(stale)
            return await self._client.create_partitions(node, specs[node])

        outcomes = await asyncio.gather(*(create_on(n) for n in nodes), return_exceptions=True)
        failures: dict[str, KafkaError] = {}
        for node, outcome in zip(nodes, outcomes, strict=True):
            if isinstance(outcome, LogNodeError):
                for spec in specs[node]:
                    failures.setdefault(spec.topic, KafkaError(outcome.error, outcome.message))
            elif isinstance(outcome, BaseException):
                log.error("creating partitions on log node %d failed", node, exc_info=outcome)
                for spec in specs[node]:
                    failures.setdefault(spec.topic, KafkaError(
                        ErrorCode.unknown_server_error, f"log node {node}: {outcome!r}"))
            else:
                for failure in outcome:
                    failures.setdefault(failure.topic, KafkaError(
                        failure.error,
                        f"log node {node}, partition {failure.partition}: {failure.message}"))
        return failures, cleared

    # -- topic deletion ---------------------------------------------------------------------

    async def delete_topics(
        self, names: Sequence[str] = (), topic_ids: Sequence[str] = ()
    ) -> list[TopicResult]:
        """Delete topics named by name or id; one result per entry, names first."""
        return await self._exclusive(lambda: self._delete_topics(names, topic_ids))

    async def _delete_topics(
        self, names: Sequence[str], topic_ids: Sequence[str]
    ) -> list[TopicResult]:
        image = self._image
        results: list[TopicResult] = []
        doomed: dict[str, TopicRegistration] = {}
        name_count, id_count = Counter(names), Counter(topic_ids)
        for name in names:
            topic = image.topics.get(TopicName(name))
            if name_count[name] > 1:
                results.append(TopicResult(name=name, error=ErrorCode.invalid_request,
                                           message="Duplicate topic name in the request."))
            elif topic is None:
                results.append(TopicResult(name=name, error=ErrorCode.unknown_topic_or_partition,
                                           message="This server does not host this topic."))
            else:
                doomed[name] = topic
                results.append(TopicResult(name=name, topic_id=topic.topic_id))
        for text in topic_ids:
            canonical = _canonical_uuid(text)
            topic = image.topic_by_id(canonical) if canonical else None
            if id_count[text] > 1:
                results.append(TopicResult(name="", topic_id=text, error=ErrorCode.invalid_request,
                                           message="Duplicate topic id in the request."))
            elif topic is None:
                results.append(TopicResult(name="", topic_id=text,
                                           error=ErrorCode.unknown_topic_id,
                                           message="This server does not host this topic ID."))
            else:
                doomed[topic.name] = topic
                results.append(TopicResult(name=topic.name, topic_id=topic.topic_id))
        if not doomed:
            return results
        replicas = _replicas_by_node(doomed.values())
        try:
            await self._commit(lambda current: _with_pending(current.with_topics(removed=doomed),
                                                       replicas))
        except OSError as e:
            log.exception("could not save the metadata without the deleted topics")
            return [
                TopicResult(name=r.name, topic_id=r.topic_id, error=ErrorCode.unknown_server_error,
                            message=f"Could not save the cluster metadata: {e}")
                if r.name in doomed else r
                for r in results
            ]
        for topic in doomed.values():
            log.info("deleted topic %s (%s)", topic.name, topic.topic_id)
        await self._flush_deletions(self._image.live_node_ids)
        return results

    async def _remove_replicas(self, topics: Sequence[TopicRegistration]) -> None:
        """Delete the replicas of topics that were not committed; what cannot be deleted now
        becomes a pending deletion."""
        replicas = _replicas_by_node(topics)
        try:
            await self._commit(lambda current: _with_pending(current, replicas), bump=False)
        except OSError:
            log.exception("could not save pending replica deletions")
        await self._flush_deletions(self._image.live_node_ids)

    async def _flush_deletions(self, nodes: Iterable[NodeId]) -> None:
        """Ask ``nodes`` to delete their pending replicas; forget those that are gone."""
        pending = self._image.pending_deletions
        work = {n: sorted(pending[n]) for n in nodes if pending.get(n)}
        if not work:
            return
        outcomes = await asyncio.gather(
            *(self._client.delete_partitions(n, parts) for n, parts in work.items()),
            return_exceptions=True,
        )
        done: dict[NodeId, set[tuple[str, int]]] = {}
        for (node, parts), outcome in zip(work.items(), outcomes, strict=True):
            if isinstance(outcome, BaseException):
                log.warning("log node %d: replica deletion deferred: %s", node, outcome)
                continue
            failed = {(f.topic, f.partition) for f in outcome}
            for f in outcome:
                log.warning("log node %d: could not delete %s-%d: %s", node, f.topic,
                            f.partition, f.message)
            done[node] = set(parts) - failed
        if any(done.values()):
            try:
                await self._commit(lambda current: _without_cleared(current, done), bump=False)
            except OSError:
                log.exception("could not save completed replica deletions")

    # -- topic configs ----------------------------------------------------------------------

    async def alter_configs(
        self, requests: Sequence[ConfigChanges], *, validate_only: bool = False
    ) -> list[TopicResult]:
        """Apply config changes to topics; one result per entry, in order, carrying the
        topic's configs after the change."""
        return await self._exclusive(lambda: self._alter_configs(requests, validate_only))

    async def _alter_configs(
        self, requests: Sequence[ConfigChanges], validate_only: bool
    ) -> list[TopicResult]:
        image = self._image
        occurrences = Counter(r.topic for r in requests)
        results: list[TopicResult] = []
        changed: dict[TopicName, TopicRegistration] = {}
        for request in requests:
            topic = image.topics.get(TopicName(request.topic))
            try:
                if occurrences[request.topic] > 1:
                    raise KafkaError(ErrorCode.invalid_request,
                                     "Duplicate topic in the request.")
                if topic is None:
                    raise KafkaError(ErrorCode.unknown_topic_or_partition,
                                     f"The topic '{request.topic}' does not exist.")
                configs = apply_config_changes(topic.configs, request.changes,
                                               replace=request.replace)
            except KafkaError as e:
                results.append(_failed(request.topic, e))
                continue
            updated = dataclasses.replace(topic, configs=configs)
            results.append(_created(updated, with_id=True))
            if configs != dict(topic.configs):
                changed[updated.name] = updated
        if validate_only or not changed:
            return results
        try:
            await self._commit(lambda current: current.with_topics(added=[
                dataclasses.replace(current.topics[name], configs=t.configs)
                for name, t in changed.items() if name in current.topics]))
        except OSError as e:
            log.exception("could not save changed topic configs")
            return [_failed(r.name, KafkaError(ErrorCode.unknown_server_error,
                                               f"Could not save the cluster metadata: {e}"))
                    if r.name in changed else r for r in results]
        for topic in changed.values():
            log.info("topic %s configs are now %s", topic.name, dict(topic.configs))
        await self._push_configs(list(changed.values()), self._image.live_node_ids)
        return results

    async def _push_configs(
        self, topics: Sequence[TopicRegistration], nodes: Iterable[NodeId]
    ) -> None:
        """Send the configs of ``topics`` to those of ``nodes`` holding their replicas; nodes
        that fail are marked stale. Per-replica failures (a replica the node does not have)
        are logged only: the configs reach it when it is created."""
        wanted = set(nodes)
        specs: dict[NodeId, list[PartitionSpec]] = {}
        for topic in topics:
            for p in topic.partitions:
                for node in p.replicas:
                    if node in wanted:
                        specs.setdefault(node, []).append(PartitionSpec(
                            topic=topic.name, partition=p.partition, topic_id=topic.topic_id,
                            configs=topic.configs))
        work = list(specs)
        outcomes = await asyncio.gather(
            *(self._client.update_configs(n, specs[n]) for n in work), return_exceptions=True)
        for node, outcome in zip(work, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                log.warning("log node %d: config update deferred: %s", node, outcome)
                self._stale_configs.add(node)
                continue
            self._stale_configs.discard(node)
            for f in outcome:
                log.warning("log node %d: could not update the configs of %s-%d: %s", node,
                            f.topic, f.partition, f.message)

    async def _resync_configs(self) -> None:
        """Push every topic's configs to the live nodes marked stale."""
        live = set(self._image.live_node_ids)
        nodes = self._stale_configs & live
        if not nodes:
            return
        self._stale_configs -= nodes
        await self._push_configs(list(self._image.topics.values()), nodes)

    # -- adding partitions ------------------------------------------------------------------

    async def create_partitions(
        self, requests: Sequence[PartitionIncrease], *, validate_only: bool = False
    ) -> list[TopicResult]:
        """Grow topics' partition counts; one result per entry, in order."""
        return await self._exclusive(lambda: self._create_partitions(requests, validate_only))

    async def _create_partitions(
        self, requests: Sequence[PartitionIncrease], validate_only: bool
    ) -> list[TopicResult]:
        image = self._image
        occurrences = Counter(r.topic for r in requests)
        results: list[TopicResult] = []
        # Topic name -> (the topic with only its new partitions, the whole grown topic).
        planned: dict[str, tuple[TopicRegistration, TopicRegistration]] = {}
        for request in requests:
            try:
                if occurrences[request.topic] > 1:
                    raise KafkaError(ErrorCode.invalid_request,
                                     "Duplicate topic in the request.")
                added = self._plan_partitions(request, image)
            except KafkaError as e:
                results.append(_failed(request.topic, e))
                continue
            topic = image.topics[TopicName(request.topic)]
            grown = dataclasses.replace(topic, partitions=topic.partitions + added.partitions)
            planned[topic.name] = (added, grown)
            results.append(_created(grown, with_id=True))
        if validate_only or not planned:
            return results

        failures, cleared = await self._create_on_log_nodes(
            [added for added, _ in planned.values()], image)
        grown = [g for name, (_, g) in planned.items() if name not in failures]
        new_partitions = {name: added.partitions for name, (added, _) in planned.items()}
        try:
            # The existing partitions as they are now (their ISR may have changed meanwhile).
            await self._commit(lambda current: _without_cleared(
                current.with_topics(added=[
                    dataclasses.replace(current.topics[g.name], partitions=(
                        current.topics[g.name].partitions + new_partitions[g.name]))
                    for g in grown if g.name in current.topics]),
                cleared), bump=bool(grown))
        except OSError as e:
            log.exception("could not save the metadata of new partitions")
            for topic in grown:
                failures[topic.name] = KafkaError(
                    ErrorCode.unknown_server_error, f"Could not save the cluster metadata: {e}")
            grown = []
        results = [_failed(r.name, failures[r.name]) if r.name in failures and r.name in planned
                   else r for r in results]
        undo = [added for name, (added, _) in planned.items() if name in failures]
        if undo:
            await self._remove_replicas(undo)
        for topic in grown:
            log.info("topic %s now has %d partition(s)", topic.name, len(topic.partitions))
        return results

    def _plan_partitions(
        self, request: PartitionIncrease, image: MetadataImage
    ) -> TopicRegistration:
        """The topic with only the partitions ``request`` adds, or KafkaError."""
        topic = image.topics.get(TopicName(request.topic))
        if topic is None:
            raise KafkaError(ErrorCode.unknown_topic_or_partition,
                             f"The topic '{request.topic}' does not exist.")
        current = len(topic.partitions)
        if request.count < current:
            raise KafkaError(ErrorCode.invalid_partitions,
                             f"Topic currently has {current} partitions, which is higher than "
                             f"the requested {request.count}.")
        if request.count == current:
            raise KafkaError(ErrorCode.invalid_partitions,
                             f"Topic already has {current} partitions.")
        if request.count > MAX_PARTITIONS_PER_TOPIC:
            raise KafkaError(ErrorCode.invalid_partitions,
                             f"A topic may have at most {MAX_PARTITIONS_PER_TOPIC} partitions.")
        adding = request.count - current
        factor = topic.replication_factor
        live = image.live_node_ids
        if request.assignments:
            if len(request.assignments) != adding:
                raise KafkaError(
                    ErrorCode.invalid_replica_assignment,
                    f"Attempted to add {adding} additional partition(s), but only "
                    f"{len(request.assignments)} assignment(s) were specified.")
            replica_lists = validate_assignment(
                dict(enumerate(request.assignments)), num_partitions=-1, replication_factor=-1,
                known_nodes={n.node_id for n in image.log_nodes}, live_nodes=live)
            if len(replica_lists[0]) != factor:
                raise KafkaError(
                    ErrorCode.invalid_replica_assignment,
                    f"The manual partition assignment includes a partition with "
                    f"{len(replica_lists[0])} replica(s), but this is not consistent with "
                    f"previous partitions, which have {factor} replica(s).")
        else:
            resolve_replication_factor(factor, factor, len(live))
            first_leader = topic.partitions[0].replicas[0] if topic.partitions else None
            # Continue the topic's ring where it is: partition p led by ring[(s + p) % n].
            start = (ring_position(live, _racks(image), first_leader)
                     if first_leader is not None else 0)
            replica_lists = assign_replicas(num_partitions=request.count,
                                            replication_factor=factor, nodes=live,
                                            start_index=start, racks=_racks(image))[current:]
        live_set = set(live)
        partitions = []
        for offset, replicas in enumerate(replica_lists):
            isr = tuple(r for r in replicas if r in live_set)
            partitions.append(PartitionRegistration(
                partition=current + offset, leader=isr[0], leader_epoch=0,
                replicas=tuple(replicas), isr=isr))
        return dataclasses.replace(topic, partitions=tuple(partitions))

    # -- replication ------------------------------------------------------------------------

    async def change_isr(
        self, changes: Mapping[tuple[str, int], tuple[NodeId, int, tuple[NodeId, ...]]]
    ) -> dict[tuple[str, int], tuple[NodeId, ...]]:
        """Commit new ISRs (Kafka's AlterPartition). ``changes`` maps (topic, partition) to
        (leader, leader epoch, new ISR) as the replication role computed them; a change whose
        partition has another leader or epoch by now, is gone, would drop the leader or add a
        node that is not a replica, or changes nothing is left out. Returns the ISRs
        committed, in one new version. Raises OSError if the save failed (nothing changed)."""
        applied: dict[tuple[str, int], tuple[NodeId, ...]] = {}

        def alter(image: MetadataImage) -> MetadataImage:
            applied.clear()
            topics: dict[TopicName, TopicRegistration] = {}
            for (name, index), (leader, epoch, isr) in changes.items():
                topic = topics.get(TopicName(name)) or image.topics.get(TopicName(name))
                if topic is None or not 0 <= index < len(topic.partitions):
                    continue
                p = topic.partitions[index]
                if (p.leader != leader or p.leader_epoch != epoch or leader not in isr
                        or not set(isr) <= set(p.replicas) or set(isr) == set(p.isr)):
                    continue
                partitions = list(topic.partitions)
                partitions[index] = dataclasses.replace(p, isr=tuple(isr))
                topics[topic.name] = dataclasses.replace(topic, partitions=tuple(partitions))
                applied[(name, index)] = tuple(isr)
            return image.with_topics(added=topics.values()) if applied else image

        await self._commit(alter)
        for (name, index), isr in applied.items():
            log.info("%s-%d: ISR is now %s", name, index, list(isr))
        return applied

    # -- producer ids -----------------------------------------------------------------------

    async def allocate_producer_ids(self) -> ProducerIdBlock:
        """The next block of producer ids, saved before it is returned (no version bump:
        clients never see it). Raises KafkaError when ids are exhausted, OSError when the
        save fails (then nothing was handed out)."""
        blocks: list[ProducerIdBlock] = []

        def take(image: MetadataImage) -> MetadataImage:
            blocks[:] = [next_block(image)]
            return image.replace(next_producer_id=blocks[0].next_block_first_id)

        await self._commit(take, bump=False)
        return blocks[0]

    # -- committing -------------------------------------------------------------------------

    async def _exclusive(self, operation: Callable[[], Awaitable[T]]) -> T:
        async def locked() -> T:
            async with self._lock:
                return await operation()

        # Shielded: a caller that goes away must not leave an operation half applied.
        return await asyncio.shield(locked())

    async def _commit(
        self, change: Callable[[MetadataImage], MetadataImage], *, bump: bool = True
    ) -> MetadataImage:
        """Under the commit lock, apply ``change`` to the current image, save it, then make it
        current. With ``bump`` the version increases and watchers are told; bookkeeping that
        clients cannot see (pending deletions) is saved without a new version. A change that
        returns the image it was given commits nothing. Raises OSError (DeposedError once
        another replicator took over) when the save failed; the image stays as it was."""
        async with self._commit_lock:
            current = self._image
            image = change(current)
            if image is current:
                return current
            if bump:
                image = image.replace(version=current.version + 1)
            elif image == current:
                return current
            try:
                await self._store.save(image)
            except DeposedError:
                if not self.deposed.is_set():
                    log.error("another replicator has taken over the cluster metadata; this "
                              "one commits nothing from now on")
                    self.deposed.set()
                raise
            self._image = image
        if bump:
            self.publisher.publish(image)
        metrics.observe(image)
        return image

    async def close(self) -> None:
        self.publisher.close()
        await self._store.close()


def _racks(image: MetadataImage) -> dict[NodeId, str]:
    return {n.node_id: n.rack for n in image.log_nodes}


def replica_state(topic: str, partition: PartitionRegistration, node: NodeId) -> ReplicaState:
    """The state ``node``'s replica of ``partition`` should have."""
    if node == partition.leader:
        return ReplicaState(topic=topic, partition=partition.partition, role=Role.LEADER,
                            leader_epoch=partition.leader_epoch,
                            in_sync_alone=tuple(partition.isr) == (node,))
    return ReplicaState(topic=topic, partition=partition.partition, role=Role.FOLLOWER,
                        leader_epoch=partition.leader_epoch)


def _created(topic: TopicRegistration, *, with_id: bool) -> TopicResult:
    return TopicResult(
        name=topic.name,
        topic_id=topic.topic_id if with_id else "",
        num_partitions=len(topic.partitions),
        replication_factor=topic.replication_factor,
        configs=dict(topic.configs),
    )


def _failed(name: str, error: KafkaError) -> TopicResult:
    return TopicResult(name=name, error=error.code, message=error.message or "")


def _replicas_by_node(
    topics: Iterable[TopicRegistration],
) -> dict[NodeId, set[tuple[str, int]]]:
    replicas: dict[NodeId, set[tuple[str, int]]] = {}
    for topic in topics:
        for p in topic.partitions:
            for node in p.replicas:
                replicas.setdefault(node, set()).add((topic.name, p.partition))
    return replicas


def _with_pending(
    image: MetadataImage, replicas: Mapping[NodeId, set[tuple[str, int]]]
) -> MetadataImage:
    def add(pending: dict[NodeId, set[tuple[str, int]]]) -> None:
        for node, parts in replicas.items():
            pending.setdefault(node, set()).update(parts)

    return image.with_pending_deletions(add)


def _without_cleared(
    image: MetadataImage, cleared: Mapping[NodeId, set[tuple[str, int]]]
) -> MetadataImage:
    if not any(cleared.values()):
        return image

    def remove(pending: dict[NodeId, set[tuple[str, int]]]) -> None:
        for node, parts in cleared.items():
            if node in pending:
                pending[node] -= parts

    return image.with_pending_deletions(remove)


def _canonical_uuid(text: str) -> str | None:
    try:
        return str(uuid.UUID(text))
    except ValueError:
        return None
