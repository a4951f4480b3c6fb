"""Topics and the placement of their partitions (the topic side of Kafka's
ReplicationControlManager): creating and deleting topics, adding partitions, and the replicas
on the log nodes that go with them. Every operation runs in the core's exclusive section.

- Creation: of two concurrent requests for the same name exactly one creates it. A new topic
  is committed only after every live replica's log node confirmed creating its partitions,
  each with its state (leader or follower at epoch 0), so a leader never commits appends alone
  when it has followers. If any of them fails, the topic's result carries the error, the topic
  is not committed, and the replicas already created are deleted again (best effort; leftovers
  become pending deletions). The other topics of the request are unaffected. Added partitions
  follow the same rules. Placement, the replication factor limit and the ISR of new
  partitions count only the active log nodes (alive, not in controlled shutdown), as Kafka's
  placer skips brokers that are shutting down.
- Deletion commits first (clients stop seeing the topic), then asks the log nodes to delete the
  replicas. Replicas that could not be deleted (node down) stay in ``pending_deletions``, which
  is persisted and retried after each node check and before a topic of the same name is placed
  on that node again; so a deletion's replica removal never interleaves with a re-creation.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence

from kbroker.log.v1 import log_pb2
from kbroker.replicator.v1 import replicator_pb2 as pb
from services.common.errors import ErrorCode, KafkaError

from ..assignment import assign_replicas, ring_position
from ..log_nodes import LogNodeError, LogNodes, failure_message, kafka_error, partition_specs
from ..metadata import (
    MetadataImage,
    NodeId,
    PartitionRegistration,
    TopicName,
    TopicRegistration,
    new_topic_id,
)
from ..metadata_log import METADATA_TOPIC
from ..topic_rules import (
    collision_key,
    resolve_num_partitions,
    resolve_replication_factor,
    validate_assignment,
    validate_configs,
    validate_topic_name,
)
from .core import ControllerCore

log = logging.getLogger(__name__)

# A guard against requests that would exhaust memory; far above any real topic.
MAX_PARTITIONS_PER_TOPIC = 100_000

# Partition replicas by log node.
Replicas = dict[NodeId, set[tuple[str, int]]]


def created(topic: TopicRegistration, *, with_id: bool = True) -> pb.TopicResult:
    """A topic's result: its id, counts and configs."""
    return pb.TopicResult(name=topic.name, topic_id=topic.topic_id if with_id else "",
                          num_partitions=len(topic.partitions),
                          replication_factor=topic.replication_factor, configs=topic.configs)


def failed(name: str, error: KafkaError, topic_id: str = "") -> pb.TopicResult:
    return pb.TopicResult(name=name, topic_id=topic_id, error_code=error.errno,
                          error_message=error.message or "", num_partitions=-1,
                          replication_factor=-1)


def not_saved(error: OSError) -> KafkaError:
    return KafkaError(ErrorCode.unknown_server_error,
                      f"Could not save the cluster metadata: {error}")


class TopicControlManager:
    def __init__(self, core: ControllerCore, client: LogNodes, *, num_partitions: int,
                 default_replication_factor: int) -> None:
        if num_partitions < 1:
            raise ValueError("num_partitions must be at least 1")
        if default_replication_factor < 1:
            raise ValueError("default_replication_factor must be at least 1")
        self._core = core
        self._client = client
        self._num_partitions = num_partitions
        self._default_replication_factor = default_replication_factor

    # -- creation ---------------------------------------------------------------------------

    async def create_topics(self, request: pb.CreateTopicsRequest) -> pb.CreateTopicsResponse:
        """Validate and create topics; one result per entry, in order."""
        results = await self._core.exclusive(
            lambda: self._create_topics(request.topics, request.validate_only))
        return pb.CreateTopicsResponse(topics=results)

    async def _create_topics(
        self, requests: Sequence[pb.NewTopic], validate_only: bool
    ) -> list[pb.TopicResult]:
        image = self._core.image
        occurrences = Counter(r.name for r in requests)
        taken_names = {collision_key(name): name for name in image.topics}
        taken_ids = {t.topic_id for t in image.topics.values()}
        start_index = image.next_leader_index
        results: list[pb.TopicResult] = []
        planned: list[TopicRegistration] = []
        for request in requests:
            try:
                if occurrences[request.name] > 1:
                    raise KafkaError(ErrorCode.invalid_request,
                                     "Duplicate topic name in the request.")
                topic = self._plan(request, image, taken_names, taken_ids, start_index)
            except KafkaError as e:
                results.append(failed(request.name, e))
                continue
            if not request.assignments:
                start_index += 1
            taken_names[collision_key(topic.name)] = topic.name
            taken_ids.add(topic.topic_id)
            planned.append(topic)
            results.append(created(topic, with_id=not validate_only))
        if validate_only or not planned:
            return results
        results, done = await self._place(
            image, planned, results, "topics",
            lambda current, topics: current.with_topics(added=topics).replace(
                next_leader_index=start_index))
        for topic in done:
            log.info("created topic %s (%s) with %d partition(s), replication factor %d",
                     topic.name, topic.topic_id, len(topic.partitions), topic.replication_factor)
        return results

    def _plan(
        self,
        request: pb.NewTopic,
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
        live = image.active_node_ids  # alive and not in controlled shutdown
        if request.assignments:
            replica_lists = validate_assignment(
                {index: r.node_ids for index, r in request.assignments.items()},
                num_partitions=request.num_partitions,
                replication_factor=request.replication_factor,
                known_nodes={n.node_id for n in image.log_nodes}, live_nodes=live)
            _check_count(len(replica_lists))
        else:
            partitions = _check_count(resolve_num_partitions(request.num_partitions,
                                                             self._num_partitions))
            factor = resolve_replication_factor(
                request.replication_factor, self._default_replication_factor, len(live))
            replica_lists = assign_replicas(num_partitions=partitions, replication_factor=factor,
                                            nodes=live, start_index=start_index,
                                            racks=_racks(image))
        return TopicRegistration(name=TopicName(name), topic_id=new_topic_id(taken_ids),
                                 configs=validate_configs(dict(request.configs)),
                                 partitions=_new_partitions(replica_lists, live, 0))

    async def _place(
        self, image: MetadataImage, planned: list[TopicRegistration],
        results: list[pb.TopicResult], what: str,
        add: Callable[[MetadataImage, list[TopicRegistration]], MetadataImage],
    ) -> tuple[list[pb.TopicResult], list[TopicRegistration]]:
        """Create the replicas of ``planned`` (new topics, or topics with only their new
        partitions) on their live nodes; commit those whose replicas all exist (``add`` puts
        them in the image current then) and remove the replicas of the others. Returns the
        results with the failures in, and the topics committed."""
        failures, cleared = await self._create_on_log_nodes(planned, image)
        done = [t for t in planned if t.name not in failures]
        try:
            await self._core.commit(
                lambda current: (_pending(add(current, done), done=cleared), None),
                bump=bool(done))
        except OSError as e:
            log.exception("could not save the metadata of new %s", what)
            failures.update((t.name, not_saved(e)) for t in done)
            done = []
        await self._remove_replicas([t for t in planned if t.name in failures])
        return [failed(r.name, failures[r.name]) if r.name in failures else r
                for r in results], done

    async def _create_on_log_nodes(
        self, topics: Sequence[TopicRegistration], image: MetadataImage
    ) -> tuple[dict[str, KafkaError], Replicas]:
        """Create the replicas on their live nodes, one call per node. Returns the failed
        topics with their error, and the pending deletions that were carried out on the way."""
        specs = partition_specs(topics, image.live_node_ids, with_state=True)
        cleared: Replicas = {}

        async def create_on(node: NodeId) -> list[log_pb2.PartitionError]:
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

        outcomes = await asyncio.gather(*(create_on(n) for n in specs), return_exceptions=True)
        failures: dict[str, KafkaError] = {}
        for node, outcome in zip(specs, outcomes, strict=True):
            if isinstance(outcome, LogNodeError):
                error = KafkaError(outcome.error, outcome.message)
            elif isinstance(outcome, BaseException):
                log.error("creating partitions on log node %d failed", node, exc_info=outcome)
                error = KafkaError(ErrorCode.unknown_server_error,
                                   f"log node {node}: {outcome!r}")
            else:
                for f in outcome:
                    failures.setdefault(f.topic, KafkaError(
                        kafka_error(f.error_code),
                        f"log node {node}, partition {f.partition}: {failure_message(f)}"))
                continue
            for spec in specs[node]:
                failures.setdefault(spec.topic, error)
        return failures, cleared

    # -- adding partitions ------------------------------------------------------------------

    async def create_partitions(
        self, request: pb.CreatePartitionsRequest
    ) -> pb.CreatePartitionsResponse:
        """Grow topics' partition counts; one result per entry, in order."""
        results = await self._core.exclusive(
            lambda: self._create_partitions(request.topics, request.validate_only))
        return pb.CreatePartitionsResponse(topics=results)

    async def _create_partitions(
        self, requests: Sequence[pb.PartitionIncrease], validate_only: bool
    ) -> list[pb.TopicResult]:
        image = self._core.image
        occurrences = Counter(r.topic for r in requests)
        results: list[pb.TopicResult] = []
        planned: list[TopicRegistration] = []  # each topic with only its new partitions
        for request in requests:
            try:
                if occurrences[request.topic] > 1:
                    raise KafkaError(ErrorCode.invalid_request,
                                     "Duplicate topic in the request.")
                added = self._plan_partitions(request, image)
            except KafkaError as e:
                results.append(failed(request.topic, e))
                continue
            planned.append(added)
            results.append(created(_grown(image.topics[added.name], added)))
        if validate_only or not planned:
            return results
        # The existing partitions as they are now (their ISR may have changed meanwhile).
        results, done = await self._place(
            image, planned, results, "partitions",
            lambda current, topics: current.with_topics(added=[
                _grown(current.topics[t.name], t) for t in topics if t.name in current.topics]))
        for topic in done:
            log.info("topic %s now has %d partition(s)", topic.name,
                     topic.partitions[-1].partition + 1)
        return results

    def _plan_partitions(
        self, request: pb.PartitionIncrease, image: MetadataImage
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
        _check_count(request.count)
        adding = request.count - current
        factor = topic.replication_factor
        live = image.active_node_ids  # alive and not in controlled shutdown
        if request.assignments:
            if len(request.assignments) != adding:
                raise KafkaError(
                    ErrorCode.invalid_replica_assignment,
                    f"Attempted to add {adding} additional partition(s), but only "
                    f"{len(request.assignments)} assignment(s) were specified.")
            replica_lists = validate_assignment(
                dict(enumerate(a.node_ids for a in request.assignments)), num_partitions=-1,
                replication_factor=-1, known_nodes={n.node_id for n in image.log_nodes},
                live_nodes=live)
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
        return dataclasses.replace(topic, partitions=_new_partitions(replica_lists, live,
                                                                     current))

    # -- deletion ---------------------------------------------------------------------------

    async def delete_topics(self, request: pb.DeleteTopicsRequest) -> pb.DeleteTopicsResponse:
        """Delete topics named by name or id; one result per entry, names first."""
        results = await self._core.exclusive(
            lambda: self._delete_topics(request.names, request.topic_ids))
        return pb.DeleteTopicsResponse(topics=results)

    async def _delete_topics(
        self, names: Sequence[str], topic_ids: Sequence[str]
    ) -> list[pb.TopicResult]:
        image = self._core.image
        results: list[pb.TopicResult] = []
        doomed: dict[str, TopicRegistration] = {}
        name_count, id_count = Counter(names), Counter(topic_ids)
        for name in names:
            topic = image.topics.get(TopicName(name))
            if name_count[name] > 1:
                results.append(failed(name, KafkaError(ErrorCode.invalid_request,
                                                       "Duplicate topic name in the request.")))
            elif topic is None:
                results.append(failed(name, KafkaError(ErrorCode.unknown_topic_or_partition,
                                                       "This server does not host this topic.")))
            else:
                doomed[name] = topic
                results.append(_deleted(topic))
        for text in topic_ids:
            canonical = _canonical_uuid(text)
            topic = image.topic_by_id(canonical) if canonical else None
            if id_count[text] > 1:
                results.append(failed("", KafkaError(ErrorCode.invalid_request,
                                                     "Duplicate topic id in the request."), text))
            elif topic is None:
                results.append(failed("", KafkaError(
                    ErrorCode.unknown_topic_id, "This server does not host this topic ID."), text))
            else:
                doomed[topic.name] = topic
                results.append(_deleted(topic))
        if not doomed:
            return results
        replicas = _replicas_by_node(doomed.values())
        try:
            await self._core.commit(lambda current: (
                _pending(current.with_topics(removed=doomed), add=replicas), None))
        except OSError as e:
            log.exception("could not save the metadata without the deleted topics")
            return [failed(r.name, not_saved(e), r.topic_id) if r.name in doomed else r
                    for r in results]
        for topic in doomed.values():
            log.info("deleted topic %s (%s)", topic.name, topic.topic_id)
        await self.flush_deletions()
        return results

    async def _remove_replicas(self, topics: Sequence[TopicRegistration]) -> None:
        """Delete the replicas of topics that were not committed; what cannot be deleted now
        becomes a pending deletion."""
        if not topics:
            return
        replicas = _replicas_by_node(topics)
        try:
            await self._core.commit(lambda current: (_pending(current, add=replicas), None),
                                    bump=False)
        except OSError:
            log.exception("could not save pending replica deletions")
        await self.flush_deletions()

    async def flush_deletions(self) -> None:
        """Ask the live nodes to delete their pending replicas; forget those that are gone.
        Call in the exclusive section."""
        image = self._core.image
        pending = image.pending_deletions
        work = {n: sorted(pending[n]) for n in image.live_node_ids if pending.get(n)}
        if not work:
            return
        outcomes = await asyncio.gather(
            *(self._client.delete_partitions(n, parts) for n, parts in work.items()),
            return_exceptions=True,
        )
        done: Replicas = {}
        for (node, parts), outcome in zip(work.items(), outcomes, strict=True):
            if isinstance(outcome, BaseException):
                log.warning("log node %d: replica deletion deferred: %s", node, outcome)
                continue
            for f in outcome:
                log.warning("log node %d: could not delete %s-%d: %s", node, f.topic,
                            f.partition, failure_message(f))
            done[node] = set(parts) - {(f.topic, f.partition) for f in outcome}
        if any(done.values()):
            try:
                await self._core.commit(lambda current: (_pending(current, done=done), None),
                                        bump=False)
            except OSError:
                log.exception("could not save completed replica deletions")


def _check_count(partitions: int) -> int:
    if partitions > MAX_PARTITIONS_PER_TOPIC:
        raise KafkaError(ErrorCode.invalid_partitions,
                         f"A topic may have at most {MAX_PARTITIONS_PER_TOPIC} partitions.")
    return partitions


def _new_partitions(replica_lists: Iterable[Sequence[NodeId]], live: Iterable[NodeId],
                    first: int) -> tuple[PartitionRegistration, ...]:
    """Partitions ``first``, ``first + 1``, ... at epoch 0, each led by its first live
    replica, with its live replicas in sync."""
    live_set = set(live)
    partitions = []
    for offset, replicas in enumerate(replica_lists):
        isr = tuple(r for r in replicas if r in live_set)
        partitions.append(PartitionRegistration(partition=first + offset, leader=isr[0],
                                                leader_epoch=0, replicas=tuple(replicas),
                                                isr=isr))
    return tuple(partitions)


def _grown(topic: TopicRegistration, added: TopicRegistration) -> TopicRegistration:
    return dataclasses.replace(topic, partitions=topic.partitions + added.partitions)


def _deleted(topic: TopicRegistration) -> pb.TopicResult:
    return pb.TopicResult(name=topic.name, topic_id=topic.topic_id, num_partitions=-1,
                          replication_factor=-1)


def _racks(image: MetadataImage) -> dict[NodeId, str]:
    return {n.node_id: n.rack for n in image.log_nodes}


def _replicas_by_node(topics: Iterable[TopicRegistration]) -> Replicas:
    replicas: Replicas = {}
    for topic in topics:
        for p in topic.partitions:
            for node in p.replicas:
                replicas.setdefault(node, set()).add((topic.name, p.partition))
    return replicas


def _pending(image: MetadataImage, add: Replicas | None = None,
             done: Replicas | None = None) -> MetadataImage:
    """The image with the replica deletions ``add`` pending and those ``done`` no more."""
    pending = {node: set(parts) for node, parts in image.pending_deletions.items()}
    for node, parts in (add or {}).items():
        pending.setdefault(node, set()).update(parts)
    for node, parts in (done or {}).items():
        pending.get(node, set()).difference_update(parts)
    return image.replace(pending_deletions={n: frozenset(p) for n, p in pending.items() if p})


def _canonical_uuid(text: str) -> str | None:
    try:
        return str(uuid.UUID(text))
    except ValueError:
        return None
