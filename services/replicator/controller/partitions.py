"""Partition leaders and ISRs (the leader election and ISR handling of Kafka's
ReplicationControlManager, with its ``PartitionChangeBuilder`` rules). The rules are pure
functions of the image; :class:`PartitionControlManager` commits them.

Fencing: for every partition touching a fenced node,

- its leader fenced: the first replica (in replica order) that is in the ISR, live and not
  fenced leads; the fenced nodes leave the ISR; the leader epoch goes up by one. With no such
  replica, and ``unclean.leader.election.enable`` (the topic's, else the broker default), the
  first live replica outside the ISR leads with an ISR of itself (records the old ISR had may
  be lost: that is what "unclean" means). Otherwise the partition stays as it is, offline,
  until a replica of its ISR comes back (fencing runs after every node check);
- a follower fenced: it leaves the ISR (the leader stays, the epoch too).

A partition whose fenced leader was its only in-sync replica therefore keeps that leader and
ISR: when the node returns, it leads again without an election, having lost nothing.

Controlled shutdown (Kafka's ``handleBrokerInControlledShutdown``): a log node that asked to
stop leaves every ISR it is in, and each partition it leads goes to the first replica of the
remaining ISR that is active (alive, not stopping itself) at the next leader epoch, with
``unclean.leader.election.enable`` to the first active replica outside it when none is. While
it is in controlled shutdown the node joins no ISR and is elected nowhere (every election here
picks among active nodes), so acks=all produces stop waiting for it and nothing moves back
before it has restarted. A partition no other replica can take keeps the node as leader and
ISR until it stops, then waits offline for it like any partition whose only in-sync replica is
gone (Kafka takes such a partition offline at the request already; here it serves until the
node is gone).

Preferred leaders (auto.leader.rebalance.enable): a partition led by another replica than its
first one (the preferred leader, where placement spread the leaders evenly) goes back to it at
the next epoch once it is live and in the ISR, so that failovers do not leave the leadership
piled on the survivors.

ISR changes (Kafka's AlterPartition, which partition leaders ask for through the replication
role) name the leader, epoch and ISR they were computed for, and are dropped if the partition
has moved on or would add a node in controlled shutdown (Kafka's INELIGIBLE_REPLICA).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from services.common.errors import ErrorCode

from .. import metrics
from ..metadata import MetadataImage, NodeId, PartitionRegistration, TopicName, TopicRegistration
from . import reassignments
from .cluster import with_controlled_shutdown
from .core import ControllerCore

log = logging.getLogger(__name__)

UNCLEAN_CONFIG = "unclean.leader.election.enable"

# (topic, partition) -> (leader, leader epoch, new ISR), as the replication role computed it.
IsrChanges = Mapping[tuple[str, int], tuple[NodeId, int, tuple[NodeId, ...]]]


@dataclass(frozen=True, slots=True, kw_only=True)
class Election:
    topic: str
    partition: int
    old_leader: NodeId
    new_leader: NodeId
    leader_epoch: int
    clean: bool


# The topics whose partitions changed, and the leader elections among those changes.
Elections = tuple[list[TopicRegistration], list[Election]]


def _changed_partitions(
    image: MetadataImage,
    change: Callable[[TopicRegistration, PartitionRegistration], PartitionRegistration | None],
) -> Elections:
    """The topics where ``change`` (None: unchanged) altered a partition, and the elections
    among those changes."""
    changed: list[TopicRegistration] = []
    elections: list[Election] = []
    for topic in image.topics.values():
        partitions = list(topic.partitions)
        touched = False
        for index, p in enumerate(topic.partitions):
            updated = change(topic, p)
            if updated is None:
                continue
            partitions[index] = updated
            touched = True
            if updated.leader != p.leader:
                elections.append(Election(
                    topic=topic.name, partition=p.partition, old_leader=p.leader,
                    new_leader=updated.leader, leader_epoch=updated.leader_epoch,
                    clean=updated.leader in p.isr))
        if touched:
            changed.append(dataclasses.replace(topic, partitions=tuple(partitions)))
    return changed, elections


def fence(
    image: MetadataImage,
    fenced: Collection[NodeId],
    live: Collection[NodeId],
    *,
    unclean_default: bool = False,
) -> Elections:
    """The topics whose partitions change because ``fenced`` nodes are gone (``live``: the
    nodes that may lead, the active ones), and the leader elections among those changes."""
    fenced, live = set(fenced), set(live)

    def change(topic: TopicRegistration, p: PartitionRegistration
               ) -> PartitionRegistration | None:
        if not fenced & (set(p.isr) | {p.leader}):
            return None
        remaining = tuple(r for r in p.isr if r not in fenced)
        if p.leader not in fenced:
            return dataclasses.replace(p, isr=remaining) if remaining != p.isr else None
        return _elect_away(topic, p, remaining, live - fenced, unclean_default)

    return _changed_partitions(image, change)


def _unclean_allowed(topic: TopicRegistration, default: bool) -> bool:
    unclean = topic.configs.get(UNCLEAN_CONFIG)
    return default if unclean is None else unclean.strip().lower() == "true"


def _elect_away(topic: TopicRegistration, p: PartitionRegistration, isr: tuple[NodeId, ...],
                eligible: set[NodeId], unclean_default: bool) -> PartitionRegistration | None:
    """``p`` with a new leader at the next epoch, its ISR ``isr`` (without the old leader): the
    first replica in ``isr`` that is ``eligible``; else, with unclean elections allowed, the
    first eligible replica outside it, alone in the ISR. None when no replica can lead."""
    candidates = [r for r in p.replicas if r in isr and r in eligible]
    if candidates:
        return dataclasses.replace(p, leader=candidates[0], leader_epoch=p.leader_epoch + 1,
                                   isr=isr)
    if _unclean_allowed(topic, unclean_default):
        outside = [r for r in p.replicas if r in eligible]
        if outside:
            return dataclasses.replace(p, leader=outside[0], leader_epoch=p.leader_epoch + 1,
                                       isr=(outside[0],))
    return None


def controlled_shutdown(
    image: MetadataImage, node: NodeId, active: Collection[NodeId], *,
    unclean_default: bool = False,
) -> Elections:
    """The topics whose partitions change because ``node`` is in controlled shutdown
    (``active``: the nodes that may lead), and the leader elections among those changes:
    ``node`` leaves every ISR, and every partition it leads moves (see the module docstring);
    one that no other replica can take keeps it."""
    eligible = set(active) - {node}

    def change(topic: TopicRegistration, p: PartitionRegistration
               ) -> PartitionRegistration | None:
        if node not in p.isr and p.leader != node:
            return None
        remaining = tuple(r for r in p.isr if r != node)
        if p.leader != node:
            return dataclasses.replace(p, isr=remaining)
        return _elect_away(topic, p, remaining, eligible, unclean_default)

    return _changed_partitions(image, change)


def preferred(
    image: MetadataImage, live: Collection[NodeId]
) -> Elections:
    """The topics whose partitions go back to their preferred (first) replica, and those
    elections: every partition whose preferred replica is live, in the ISR and not leading."""
    live = set(live)

    def change(topic: TopicRegistration, p: PartitionRegistration
               ) -> PartitionRegistration | None:
        first = p.replicas[0] if p.replicas else None
        if first is None or first == p.leader or first not in live or first not in p.isr:
            return None
        return dataclasses.replace(p, leader=first, leader_epoch=p.leader_epoch + 1)

    return _changed_partitions(image, change)


PREFERRED_ELECTION, UNCLEAN_ELECTION = 0, 1
# (topic, partition) -> (error code, message); 0: elected.
ElectionResults = dict[tuple[str, int], tuple[int, str]]


def requested(
    image: MetadataImage, election_type: int, wanted: Collection[tuple[str, int]] | None,
    live: Collection[NodeId],
) -> tuple[Elections, ElectionResults]:
    """Elections asked for by an operator (Kafka's ElectLeaders, ReplicationControlManager's
    ``electLeaders``), for the ``wanted`` partitions or, None, every partition; and each
    partition's answer.

    Preferred: the first replica takes over if it is live and in the ISR
    (PREFERRED_LEADER_NOT_AVAILABLE otherwise); ELECTION_NOT_NEEDED if it leads already.
    Unclean: only a partition without a live leader is elected (else ELECTION_NOT_NEEDED),
    from its live in-sync replicas first, else from any live replica, which becomes the whole
    ISR (records it lacks are lost); ELIGIBLE_LEADERS_NOT_AVAILABLE when no replica is live.
    Unknown partitions are UNKNOWN_TOPIC_OR_PARTITION. For every partition, those that needed
    no election are left out of the answers, as Kafka does."""
    live = set(live)
    asked = None if wanted is None else set(wanted)
    results: ElectionResults = {}

    def change(topic: TopicRegistration, p: PartitionRegistration
               ) -> PartitionRegistration | None:
        key = (topic.name, p.partition)
        if asked is not None and key not in asked:
            return None
        updated, code, message = _elect_one(p, election_type, live)
        if code != ErrorCode.election_not_needed.value or asked is not None:
            results[key] = (code, message)
        return updated

    elections = _changed_partitions(image, change)
    for key in (asked or ()):
        if key not in results:
            results[key] = (ErrorCode.unknown_topic_or_partition.value,
                            f"no partition {key[0]}-{key[1]}")
    return elections, results


def _elect_one(p: PartitionRegistration, election_type: int, live: set[NodeId]
               ) -> tuple[PartitionRegistration | None, int, str]:
    if election_type == PREFERRED_ELECTION:
        first = p.replicas[0] if p.replicas else None
        if first == p.leader:
            return None, ErrorCode.election_not_needed.value, "the preferred replica leads"
        if first is None or first not in live or first not in p.isr:
            return None, ErrorCode.preferred_leader_not_available.value, (
                f"the preferred replica {first} is not live and in sync")
        return dataclasses.replace(p, leader=first, leader_epoch=p.leader_epoch + 1), 0, ""
    if p.leader in live:
        return None, ErrorCode.election_not_needed.value, f"node {p.leader} leads"
    in_sync = [r for r in p.replicas if r in p.isr and r in live]
    if in_sync:
        return dataclasses.replace(p, leader=in_sync[0], leader_epoch=p.leader_epoch + 1), 0, ""
    outside = [r for r in p.replicas if r in live]
    if outside:
        return dataclasses.replace(p, leader=outside[0], leader_epoch=p.leader_epoch + 1,
                                   isr=(outside[0],)), 0, ""
    return None, ErrorCode.eligible_leaders_not_available.value, "no replica is live"


def alter_isr(
    image: MetadataImage, changes: IsrChanges,
    expected: Mapping[tuple[str, int], Collection[NodeId]] | None = None,
) -> tuple[MetadataImage, dict[tuple[str, int], tuple[NodeId, ...]]]:
    """The image with the ISR changes that still apply, and those changes. A change whose
    partition has another leader or epoch by now, another ISR than ``expected`` names for it
    (the one the leader computed the change from, Kafka's partition epoch check), is gone,
    would drop the leader, add a node that is not a replica, not live or in controlled
    shutdown (Kafka's INELIGIBLE_REPLICA: a fenced node's last position is no proof it is in
    sync), or changes nothing is left out."""
    applied: dict[tuple[str, int], tuple[NodeId, ...]] = {}
    topics: dict[TopicName, TopicRegistration] = {}
    stopping = {n.node_id for n in image.log_nodes if n.in_controlled_shutdown}
    for (name, index), (leader, epoch, isr) in changes.items():
        topic = topics.get(TopicName(name)) or image.topics.get(TopicName(name))
        if topic is None or not 0 <= index < len(topic.partitions):
            continue
        p = topic.partitions[index]
        if (p.leader != leader or p.leader_epoch != epoch or leader not in isr
                or not set(isr) <= set(p.replicas) or set(isr) == set(p.isr)
                or (set(isr) - set(p.isr)) & stopping):
            continue
        if expected is not None and (name, index) in expected and (
                set(expected[(name, index)]) != set(p.isr)):
            continue
        if not set(isr) - set(p.isr) <= set(image.live_node_ids):
            continue
        partitions = list(topic.partitions)
        partitions[index] = dataclasses.replace(p, isr=tuple(isr))
        topics[topic.name] = dataclasses.replace(topic, partitions=tuple(partitions))
        applied[(name, index)] = tuple(isr)
    return (image.with_topics(added=topics.values()) if applied else image), applied


class PartitionControlManager:
    def __init__(self, core: ControllerCore, unclean_leader_election: bool) -> None:
        self._core = core
        self._unclean_default = unclean_leader_election

    async def _elect(self, rule: Callable[[MetadataImage], Elections], what: str
                     ) -> Elections | None:
        """Commit the partitions ``rule`` changes; returns the changes (None: not saved)."""

        def elect(image: MetadataImage) -> tuple[MetadataImage, Elections]:
            changed, elections = rule(image)
            return (image.with_topics(added=changed) if changed else image), (changed, elections)

        try:
            return await self._core.commit(elect)
        except OSError:
            log.exception("could not save %s; retrying later", what)
            return None

    async def fence(self, fenced: Collection[NodeId]) -> None:
        """Commit new leaders and smaller ISRs for the partitions of ``fenced`` nodes."""
        if not fenced:
            return
        done = await self._elect(lambda image: fence(
            image, fenced, image.active_node_ids, unclean_default=self._unclean_default),
            "the partitions of fenced log nodes")
        changed, elections = done or ([], [])
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
        """Give partitions back to their preferred replica; returns how many moved."""
        done = await self._elect(lambda image: preferred(image, image.active_node_ids),
                                 "preferred leaders")
        elections = done[1] if done else []
        for e in elections:
            metrics.LEADER_ELECTIONS.labels("preferred").inc()
            log.info("%s-%d: leadership back to the preferred replica %d (from %d) at epoch %d",
                     e.topic, e.partition, e.new_leader, e.old_leader, e.leader_epoch)
        return len(elections)

    async def elect_leaders(self, election_type: int,
                            wanted: Collection[tuple[str, int]] | None) -> ElectionResults:
        """Commit the elections an operator asked for (see :func:`requested`) and return each
        partition's answer; REQUEST_TIMED_OUT for those asked when the change cannot be
        saved."""
        answers: ElectionResults = {}

        def rule(image: MetadataImage) -> Elections:
            elections, results = requested(image, election_type, wanted,
                                           image.active_node_ids)
            answers.clear()
            answers.update(results)
            return elections

        done = await self._elect(rule, "requested leader elections")
        if done is None:
            return {key: (ErrorCode.request_timed_out.value, "the election could not be saved")
                    if code == 0 else (code, message)
                    for key, (code, message) in answers.items()}
        kind = "preferred" if election_type == PREFERRED_ELECTION else "unclean"
        for e in done[1]:
            metrics.LEADER_ELECTIONS.labels(kind if not e.clean or kind == "preferred"
                                            else "clean").inc()
            log.info("%s-%d: node %d leads at epoch %d (requested %s election, from %d)",
                     e.topic, e.partition, e.new_leader, e.leader_epoch, kind, e.old_leader)
        return answers

    async def controlled_shutdown(self, node: NodeId) -> list[tuple[str, int]]:
        """Commit ``node``'s controlled shutdown in one change: the node marked so, out of
        every ISR, its partitions led by others where they can be (see
        :func:`controlled_shutdown`). Returns the partitions it still leads. Raises OSError
        if the change could not be saved (nothing changed)."""

        def change(image: MetadataImage) -> tuple[MetadataImage, tuple[
                Elections, list[tuple[str, int]]]]:
            marked = with_controlled_shutdown(image, node)
            changed, elections = controlled_shutdown(
                marked, node, marked.active_node_ids, unclean_default=self._unclean_default)
            updated = marked.with_topics(added=changed) if changed else marked
            staying = [(t.name, p.partition) for t in updated.topics.values()
                       for p in t.partitions if p.leader == node]
            return updated, ((changed, elections), staying)

        (changed, elections), staying = await self._core.commit(change)
        for e in elections:
            kind = "controlled" if e.clean else "unclean"
            metrics.LEADER_ELECTIONS.labels(kind).inc()
            log.info("%s-%d: log node %d is in controlled shutdown; node %d leads at epoch %d%s",
                     e.topic, e.partition, e.old_leader, e.new_leader, e.leader_epoch,
                     "" if e.clean else " (unclean election)")
        if changed:
            log.info("log node %d is out of every ISR; %d leadership(s) moved, %d kept", node,
                     len(elections), len(staying))
        for topic, partition in staying:
            log.warning("%s-%d: no other replica can lead it; log node %d leads it until it "
                        "stops", topic, partition, node)
        return staying

    async def change_isr(
        self, changes: IsrChanges,
        expected: Mapping[tuple[str, int], Collection[NodeId]] | None = None,
    ) -> dict[tuple[str, int], tuple[NodeId, ...]]:
        """Commit the ISR changes that still apply (see :func:`alter_isr`), in one new
        version with the reassignments they complete; returns them. Raises OSError if the
        save failed (nothing changed)."""

        def change(image: MetadataImage) -> tuple[MetadataImage, tuple[
                dict[tuple[str, int], tuple[NodeId, ...]], list[tuple[tuple[str, int],
                                                                  PartitionRegistration]]]]:
            changed, applied = alter_isr(image, changes, expected)
            completed, done = reassignments.complete_all(changed, only=applied)
            return completed, (applied, done)

        applied, done = await self._core.commit(change)
        for (name, index), isr in applied.items():
            log.info("%s-%d: ISR is now %s", name, index, list(isr))
        reassignments.log_completed(done)
        return applied
