"""What fencing log nodes does to partitions (Kafka's controller on a broker fencing, with its
``PartitionChangeBuilder`` election rules). Pure: an image in, the changed partitions out.

For every partition touching a fenced node:

- its leader fenced: the first replica (in replica order) that is in the ISR, live and not
  fenced leads; the fenced nodes leave the ISR; the leader epoch goes up by one. With no such
  replica, and ``unclean.leader.election.enable`` (the topic's, else the broker default), the
  first live replica outside the ISR leads with an ISR of itself (records the old ISR had may
  be lost: that is what "unclean" means). Otherwise the partition stays as it is, offline,
  until a replica of its ISR comes back;
- a follower fenced: it leaves the ISR (the leader stays, the epoch too).

A partition whose fenced leader was its only in-sync replica therefore keeps that leader and
ISR: when the node returns, it leads again without an election, having lost nothing.

Preferred leaders (Kafka's auto.leader.rebalance.enable): a partition led by another replica
than its first one (the preferred leader, where placement spread the leaders evenly) goes back
to it at the next epoch once it is live and in the ISR, so that failovers do not leave the
leadership piled on the survivors.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from dataclasses import dataclass

from ..metadata import MetadataImage, NodeId, PartitionRegistration, TopicRegistration

UNCLEAN_CONFIG = "unclean.leader.election.enable"


@dataclass(frozen=True, slots=True, kw_only=True)
class Election:
    topic: str
    partition: int
    old_leader: NodeId
    new_leader: NodeId
    leader_epoch: int
    clean: bool


def unclean_allowed(topic: TopicRegistration, default: bool) -> bool:
    value = topic.configs.get(UNCLEAN_CONFIG)
    return default if value is None else value.strip().lower() == "true"


def fence(
    image: MetadataImage,
    fenced: Collection[NodeId],
    live: Collection[NodeId],
    *,
    unclean_default: bool = False,
) -> tuple[list[TopicRegistration], list[Election]]:
    """The topics whose partitions change because ``fenced`` nodes are gone (``live``: the
    nodes that answer), and the leader elections among those changes."""
    fenced, live = set(fenced), set(live)
    changed: list[TopicRegistration] = []
    elections: list[Election] = []
    for topic in image.topics.values():
        partitions = list(topic.partitions)
        touched = False
        for index, p in enumerate(partitions):
            if not fenced & (set(p.isr) | {p.leader}):
                continue
            updated = _fence_partition(topic, p, fenced, live, unclean_default)
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


def preferred(
    image: MetadataImage, live: Collection[NodeId]
) -> tuple[list[TopicRegistration], list[Election]]:
    """The topics whose partitions go back to their preferred (first) replica, and those
    elections: every partition whose preferred replica is live, in the ISR and not leading."""
    live = set(live)
    changed: list[TopicRegistration] = []
    elections: list[Election] = []
    for topic in image.topics.values():
        partitions = list(topic.partitions)
        touched = False
        for index, p in enumerate(partitions):
            first = p.replicas[0] if p.replicas else None
            if first is None or first == p.leader or first not in live or first not in p.isr:
                continue
            partitions[index] = dataclasses.replace(p, leader=first,
                                                    leader_epoch=p.leader_epoch + 1)
            touched = True
            elections.append(Election(topic=topic.name, partition=p.partition,
                                      old_leader=p.leader, new_leader=first,
                                      leader_epoch=p.leader_epoch + 1, clean=True))
        if touched:
            changed.append(dataclasses.replace(topic, partitions=tuple(partitions)))
    return changed, elections


def _fence_partition(
    topic: TopicRegistration,
    p: PartitionRegistration,
    fenced: set[NodeId],
    live: set[NodeId],
    unclean_default: bool,
) -> PartitionRegistration | None:
    remaining = tuple(r for r in p.isr if r not in fenced)
    if p.leader not in fenced:
        if remaining == tuple(p.isr):
            return None
        return dataclasses.replace(p, isr=remaining)
    candidates = [r for r in p.replicas if r in remaining and r in live]
    if candidates:
        return dataclasses.replace(p, leader=candidates[0], leader_epoch=p.leader_epoch + 1,
                                   isr=remaining)
    if unclean_allowed(topic, unclean_default):
        outside = [r for r in p.replicas if r in live and r not in fenced]
        if outside:
            return dataclasses.replace(p, leader=outside[0], leader_epoch=p.leader_epoch + 1,
                                       isr=(outside[0],))
    return None
