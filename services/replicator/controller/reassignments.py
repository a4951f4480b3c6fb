"""Partition reassignments (Kafka's AlterPartitionReassignments and
ListPartitionReassignments, as the ReplicationControlManager carries them out). The rules are
pure functions of the image; :class:`ReassignmentControlManager` commits them.

A reassignment moves a partition from its replicas (the original set, ORS) to a target set
(TRS) without ever having fewer copies in sync than before:

1. Start: the partition's replicas become TRS followed by the original replicas leaving
   (``removing``, ORS - TRS); ``adding`` is TRS - ORS. The ISR and leader stay. The
   replication role sees new replicas in the metadata, creates them on their log nodes and
   has them copy from the leader like any follower; they join the ISR once caught up.
2. Completion, as soon as every target replica is in the ISR (checked on every ISR change and
   node check): the replicas become TRS, the ISR keeps only target replicas, and a leader
   that is not a target replica hands over to the first target replica live and in sync, at
   the next leader epoch. The leaving replicas are deleted from their log nodes (pending
   deletions, retried until their node confirms).
3. Cancel (a null target): back to the original replicas, the added ones deleted; a leader
   that was an added replica hands over to the first original replica in sync.

A new target for a partition being reassigned replaces the old one, counted from the same
original replicas (added replicas no longer wanted are deleted). A target equal to the current
replicas of a partition not being reassigned changes nothing. Errors, as Kafka's:
UNKNOWN_TOPIC_OR_PARTITION, INVALID_REPLICA_ASSIGNMENT (empty, duplicate, an unknown log node,
or another replica count when the request does not allow that), NO_REASSIGNMENT_IN_PROGRESS
for cancelling a partition that is not being reassigned.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from services.common.errors import ErrorCode

from .. import metrics
from ..metadata import MetadataImage, NodeId, PartitionRegistration, TopicName, TopicRegistration
from .core import ControllerCore

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
# What an operator asks per partition: the target replicas, or None to cancel.
Targets = Mapping[TopicPartition, tuple[NodeId, ...] | None]
# Per partition: (error code, message); 0: accepted.
Results = dict[TopicPartition, tuple[int, str]]
# Replicas to delete, by log node.
Removed = dict[NodeId, set[TopicPartition]]


@dataclass(frozen=True, slots=True)
class Step:
    """A partition's next registration and the replicas it no longer has."""

    partition: PartitionRegistration
    removed: tuple[NodeId, ...] = ()


def _leader_among(p: PartitionRegistration, candidates: tuple[NodeId, ...],
                  live: Collection[NodeId]) -> PartitionRegistration | None:
    """``p`` led by a replica of ``candidates`` (in order) that is in sync, preferring live
    ones: unchanged if its leader is one, at the next epoch otherwise; None if none is in
    sync."""
    if p.leader in candidates:
        return p
    in_sync = [r for r in candidates if r in p.isr]
    if not in_sync:
        return None
    leader = next((r for r in in_sync if r in live), in_sync[0])
    return dataclasses.replace(p, leader=leader, leader_epoch=p.leader_epoch + 1)


def start(p: PartitionRegistration, target: tuple[NodeId, ...],
          live: Collection[NodeId]) -> Step:
    """``p`` being moved to ``target`` (counted from its original replicas), completed at
    once when the target replicas are all in sync already (a pure removal or reordering)."""
    original = p.original
    adding = tuple(r for r in target if r not in original)
    removing = tuple(r for r in original if r not in target)
    # Replicas added by a reassignment this one replaces, no longer wanted.
    dropped = tuple(r for r in p.adding if r not in target)
    moving = dataclasses.replace(
        p, replicas=target + removing, adding=adding, removing=removing,
        isr=tuple(r for r in p.isr if r not in dropped))
    if moving.leader in dropped:
        moving = _leader_among(moving, original, live) or dataclasses.replace(
            moving, leader=NodeId(-1), leader_epoch=p.leader_epoch + 1)
    done = complete(moving, live)
    if done is not None:
        return Step(done.partition, dropped + done.removed)
    return Step(moving, dropped)


def complete(p: PartitionRegistration, live: Collection[NodeId]) -> Step | None:
    """``p`` with its reassignment done, if every target replica is in sync and one of them
    can lead; None otherwise (or when it is not being reassigned)."""
    if not p.reassigning:
        return None
    target = p.target
    if any(r not in p.isr for r in target):
        return None
    led = _leader_among(p, target, live)
    if led is None or led.leader not in live:
        return None
    done = dataclasses.replace(led, replicas=target, adding=(), removing=(),
                               isr=tuple(r for r in led.isr if r in target))
    return Step(done, p.removing)


def cancel(p: PartitionRegistration, live: Collection[NodeId]) -> Step:
    """``p`` back on its original replicas; the added ones go."""
    original = p.original
    back = dataclasses.replace(p, replicas=original, adding=(), removing=(),
                               isr=tuple(r for r in p.isr if r in original))
    led = _leader_among(back, original, live)
    if led is None:  # no original replica in sync: offline until one comes back
        led = dataclasses.replace(back, leader=NodeId(-1), leader_epoch=p.leader_epoch + 1)
    return Step(led, p.adding)


def _invalid(target: tuple[NodeId, ...], current: PartitionRegistration,
             nodes: Collection[NodeId], allow_rf_change: bool) -> str | None:
    if not target:
        return "the replica list is empty"
    if len(set(target)) != len(target):
        return f"the replica list {list(target)} has duplicates"
    unknown = sorted(set(target) - set(nodes))
    if unknown:
        return f"no log node {', '.join(map(str, unknown))} is registered"
    if not allow_rf_change and len(target) != len(current.original):
        return (f"the replication factor would change from {len(current.original)} to "
                f"{len(target)}")
    return None


def alter(image: MetadataImage, targets: Targets, *, allow_rf_change: bool = True
          ) -> tuple[MetadataImage, Results, Removed]:
    """The image with the reassignments ``targets`` asks for started (or cancelled), each
    partition's answer, and the replicas to delete."""
    live = image.live_node_ids
    nodes = [n.node_id for n in image.log_nodes]
    results: Results = {}
    removed: Removed = {}
    topics: dict[TopicName, TopicRegistration] = {}
    for (name, index), target in targets.items():
        topic = topics.get(TopicName(name)) or image.topics.get(TopicName(name))
        if topic is None or not 0 <= index < len(topic.partitions):
            results[(name, index)] = (ErrorCode.unknown_topic_or_partition.value,
                                      f"no partition {name}-{index}")
            continue
        p = topic.partitions[index]
        if target is None:
            if not p.reassigning:
                results[(name, index)] = (ErrorCode.no_reassignment_in_progress.value,
                                          f"{name}-{index} is not being reassigned")
                continue
            step = cancel(p, live)
        else:
            problem = _invalid(target, p, nodes, allow_rf_change)
            if problem is not None:
                results[(name, index)] = (ErrorCode.invalid_replica_assignment.value, problem)
                continue
            if target == p.replicas and not p.reassigning:
                results[(name, index)] = (0, "")
                continue
            step = start(p, target, live)
        results[(name, index)] = (0, "")
        partitions = list(topic.partitions)
        partitions[index] = step.partition
        topics[topic.name] = dataclasses.replace(topic, partitions=tuple(partitions))
        for node in step.removed:
            removed.setdefault(node, set()).add((name, index))
    if not topics:
        return image, results, removed
    return _with_deletions(image.with_topics(added=topics.values()), removed, topics.values()), \
        results, removed


def complete_all(image: MetadataImage, only: Collection[TopicPartition] | None = None
                 ) -> tuple[MetadataImage, list[tuple[TopicPartition, PartitionRegistration]]]:
    """The image with every reassignment that can complete completed (of ``only``, if
    given), and those completions."""
    live = image.live_node_ids
    done: list[tuple[TopicPartition, PartitionRegistration]] = []
    removed: Removed = {}
    topics: dict[TopicName, TopicRegistration] = {}
    for topic in image.topics.values():
        partitions = list(topic.partitions)
        for index, p in enumerate(topic.partitions):
            if not p.reassigning or (only is not None and (topic.name, index) not in only):
                continue
            step = complete(p, live)
            if step is None:
                continue
            partitions[index] = step.partition
            done.append(((topic.name, index), step.partition))
            for node in step.removed:
                removed.setdefault(node, set()).add((topic.name, index))
        if partitions != list(topic.partitions):
            topics[topic.name] = dataclasses.replace(topic, partitions=tuple(partitions))
    if not topics:
        return image, done
    return _with_deletions(image.with_topics(added=topics.values()), removed,
                           topics.values()), done


def _with_deletions(image: MetadataImage, removed: Removed,
                    changed: Collection[TopicRegistration]) -> MetadataImage:
    """``image`` with the ``removed`` replicas pending deletion, and no deletion pending any
    more for a replica a changed partition has again (its node keeps the data it has and
    catches up from there, truncating what diverged, as any follower)."""
    pending = {node: set(parts) for node, parts in image.pending_deletions.items()}
    for node, parts in removed.items():
        pending.setdefault(node, set()).update(parts)
    for topic in changed:
        for p in topic.partitions:
            for node in p.replicas:
                pending.get(node, set()).discard((topic.name, p.partition))
    return image.replace(pending_deletions={n: frozenset(p) for n, p in pending.items() if p})


def ongoing(image: MetadataImage, wanted: Collection[TopicPartition] | None
            ) -> list[tuple[TopicPartition, PartitionRegistration]]:
    """The partitions being reassigned (of ``wanted``, if given), by topic and partition."""
    found = []
    for topic in sorted(image.topics.values(), key=lambda t: t.name):
        for p in topic.partitions:
            key = (topic.name, p.partition)
            if p.reassigning and (wanted is None or key in wanted):
                found.append((key, p))
    return found


class ReassignmentControlManager:
    def __init__(self, core: ControllerCore) -> None:
        self._core = core

    async def alter(self, targets: Targets, *, allow_rf_change: bool = True) -> Results:
        """Commit the reassignments asked for; each partition's answer (REQUEST_TIMED_OUT for
        the accepted ones when the change cannot be saved)."""
        try:
            results = await self._core.commit(lambda image: _alter(image, targets,
                                                                   allow_rf_change))
        except OSError:
            log.exception("could not save partition reassignments")
            _, results, _ = alter(self._core.image, targets, allow_rf_change=allow_rf_change)
            return {key: (ErrorCode.request_timed_out.value, "the reassignment could not be "
                          "saved") if code == 0 else (code, message)
                    for key, (code, message) in results.items()}
        for (name, index), (code, _) in results.items():
            if code == 0:
                target = targets[(name, index)]
                metrics.REASSIGNMENTS.labels("cancelled" if target is None else "started").inc()
                log.info("%s-%d: reassignment %s", name, index,
                         "cancelled" if target is None else f"to {list(target)}")
        return results

    async def complete(self) -> int:
        """Commit the reassignments that can complete; returns how many did."""
        try:
            done = await self._core.commit(complete_all)
        except OSError:
            log.exception("could not save completed reassignments; retrying later")
            return 0
        log_completed(done)
        return len(done)


def log_completed(done: Collection[tuple[TopicPartition, PartitionRegistration]]) -> None:
    for (name, index), p in done:
        metrics.REASSIGNMENTS.labels("completed").inc()
        log.info("%s-%d: reassignment done: replicas %s, leader %d at epoch %d", name, index,
                 list(p.replicas), p.leader, p.leader_epoch)


def _alter(image: MetadataImage, targets: Targets, allow_rf_change: bool
           ) -> tuple[MetadataImage, Results]:
    new, results, _ = alter(image, targets, allow_rf_change=allow_rf_change)
    return new, results
