"""Server-side partition assignors of consumer groups (KIP-848; Kafka's ``UniformAssignor``
and ``RangeAssignor`` of the group coordinator), pure functions of the group's subscriptions,
its previous target assignment and the partition counts of the subscribed topics.

    uniform  sticky and balanced. When every member subscribes to the same topics (Kafka's
             homogeneous case) the result is Kafka's: the total partition count divided by
             the members gives each a quota (the first ``total % members`` members, in member
             order, one more); each member keeps what it had up to its quota, and the
             partitions left over go, in topic and partition order, to the members with room,
             in member order. When subscriptions differ (Kafka's heterogeneous case), a
             partition goes only to a member that subscribes to its topic, as Kafka's
             ``UniformHeterogeneousAssignmentBuilder`` does it step for step
             (:class:`_Heterogeneous`): each member keeps what it had of the topics it still
             subscribes to, the rest goes topic by topic to the least loaded subscribers,
             then each topic's partitions move from its most to its least loaded subscribers
             until their loads differ by one at most.
    range    not sticky: per topic, its subscribers in order (static members by instance id
             first, then the others by member id) take consecutive ranges of
             ``partitions // subscribers`` partitions, the first ``partitions % subscribers``
             one more.

Members are ordered by member id where Kafka iterates a hash map, so that every handler
computes the same assignment. Topics are named by topic id, partitions by number.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

Assignment = dict[str, frozenset[int]]


@dataclass(frozen=True, slots=True, kw_only=True)
class MemberSpec:
    """What an assignor knows of a member: its subscribed topics (by id) and its part of the
    previous target assignment."""

    member_id: str
    instance_id: str | None = None
    topics: frozenset[str] = frozenset()
    current: Mapping[str, frozenset[int]] = field(default_factory=dict)
    # What the member subscribed to: topic names and regular expression (None: ``topics``).
    subscription: tuple[frozenset[str], str | None] | None = None


class PartitionAssignorError(Exception):
    """The assignment cannot be computed (a subscribed topic without metadata)."""


def _order(members: Sequence[MemberSpec]) -> list[MemberSpec]:
    return sorted(members, key=lambda m: m.member_id)


def uniform(members: Sequence[MemberSpec], partitions: Mapping[str, int]) -> dict[str, Assignment]:
    """Kafka's UniformAssignor: see the module docstring."""
    if not members:
        return {}
    if homogeneous(members):
        return _uniform_homogeneous(_order(members), partitions)
    return uniform_heterogeneous(_order(members), partitions)


def homogeneous(members: Sequence[MemberSpec]) -> bool:
    """Kafka's ``ConsumerGroup.subscriptionType``: every member subscribes to the same topic
    names, or every member to the same regular expression and none to names."""
    subscriptions = {m.subscription if m.subscription is not None else (m.topics, None)
                     for m in members}
    if len(subscriptions) != 1:
        return False
    names, regex = next(iter(subscriptions))
    return not (regex and names)


def _partitions_of(topic: str, partitions: Mapping[str, int]) -> int:
    count = partitions.get(topic, -1)
    if count < 0:
        raise PartitionAssignorError(f"members subscribe to topic {topic} without metadata")
    return count


def _uniform_homogeneous(members: list[MemberSpec],
                         partitions: Mapping[str, int]) -> dict[str, Assignment]:
    topics = sorted(members[0].topics)
    if not topics:
        return {m.member_id: {} for m in members}
    assigned = {(t, p) for m in members for t, ps in m.current.items() for p in ps}
    unassigned: list[tuple[str, int]] = []
    total = 0
    for topic in topics:
        count = _partitions_of(topic, partitions)
        unassigned += [(topic, p) for p in range(count) if (topic, p) not in assigned]
        total += count
    minimum, extra = divmod(total, len(members))
    result: dict[str, dict[str, set[int]]] = {}
    room: list[tuple[str, int]] = []
    taken: set[tuple[str, int]] = set()
    for member in members:
        quota = minimum
        if extra > 0:
            quota += 1
            extra -= 1
        kept: dict[str, set[int]] = {}
        for topic in sorted(member.current):
            owned = sorted(member.current[topic])
            if topic not in member.topics:
                continue
            for p in owned:
                if p >= partitions.get(topic, 0) or (topic, p) in taken:
                    continue  # not a partition any more (the topic shrank), or held twice
                if quota > 0:
                    kept.setdefault(topic, set()).add(p)
                    taken.add((topic, p))
                    quota -= 1
                else:
                    unassigned.append((topic, p))
        result[member.member_id] = kept
        if quota > 0:
            room.append((member.member_id, quota))
    # Each partition once, none that a member kept (only targets that overlap, which a
    # coordinator never writes, could make it otherwise), none forgotten.
    unassigned = [tp for tp in dict.fromkeys(unassigned) if tp not in taken]
    listed = set(unassigned)
    unassigned += [(t, p) for t in topics for p in range(partitions[t])
                   if (t, p) not in taken and (t, p) not in listed]
    position = 0
    for member_id, quota in room:
        for _ in range(quota):
            if position >= len(unassigned):
                break
            topic, p = unassigned[position]
            position += 1
            result[member_id].setdefault(topic, set()).add(p)
    if position < len(unassigned):
        raise PartitionAssignorError("partitions were left unassigned")
    return {m: {t: frozenset(ps) for t, ps in a.items()} for m, a in result.items()}


# Kafka's MAX_ITERATION_COUNT: rounds of the final balancing over the topics.
MAX_BALANCING_ROUNDS = 16


def _topic_id_order(topic_id: str) -> tuple[int, int, str]:
    """Kafka's ``Uuid.compareTo``: the most, then the least significant 64 bits, as signed
    numbers (ids that are no uuids, in tests, by name)."""
    try:
        value = uuid.UUID(topic_id).int
    except ValueError:
        return (0, 0, topic_id)

    def signed(bits: int) -> int:
        return bits - (1 << 64) if bits >= 1 << 63 else bits

    return (signed(value >> 64), signed(value & ((1 << 64) - 1)), "")


class _Heterogeneous:
    """Kafka's ``UniformHeterogeneousAssignmentBuilder`` (4.0): members are numbered in
    member id order, and what each had of the topics it still subscribes to is kept. The
    partitions nobody kept are handed out topic by topic, the topics ordered by partitions per
    subscriber (most first), then by subscriber count (fewest first), then by topic id; within a
    topic, in partition order, each to the least loaded subscriber (:class:`_Balancer`). Then,
    over the topics with two subscribers or more, in the same order and for at most
    :data:`MAX_BALANCING_ROUNDS` rounds, until a whole round moved nothing: a topic's
    partitions move from its most to its least loaded subscribers (a member gives up its
    highest partition of the topic) until their loads differ by one at most."""

    def __init__(self, members: Sequence[MemberSpec], partitions: Mapping[str, int]) -> None:
        self.members = list(members)
        self.sizes = [0] * len(self.members)
        self.subscribers: dict[str, list[int]] = {}
        for index, member in enumerate(self.members):
            for topic in sorted(member.topics):
                _partitions_of(topic, partitions)
                self.subscribers.setdefault(topic, []).append(index)
        self.partitions = {t: partitions[t] for t in self.subscribers}
        self.owners = {t: [-1] * n for t, n in self.partitions.items()}
        self.assignment: list[dict[str, set[int]]] = [{} for _ in self.members]

    def topic_order(self, topic: str) -> tuple[float, int, tuple[int, int, str]]:
        count, subscribers = self.partitions[topic], len(self.subscribers[topic])
        return (-count / subscribers, subscribers, _topic_id_order(topic))

    def member_order(self, index: int) -> tuple[int, int]:
        return (self.sizes[index], index)

    def assign(self, topic: str, partition: int, index: int) -> None:
        previous = self.owners[topic][partition]
        if previous != -1:
            held = self.assignment[previous][topic]
            held.discard(partition)
            if not held:
                del self.assignment[previous][topic]
            self.sizes[previous] -= 1
        self.assignment[index].setdefault(topic, set()).add(partition)
        self.owners[topic][partition] = index
        self.sizes[index] += 1

    def build(self) -> dict[str, Assignment]:
        if self.subscribers:
            self.keep_current()
            self.assign_remaining()
            self.balance()
        return {m.member_id: {t: frozenset(ps) for t, ps in self.assignment[i].items()}
                for i, m in enumerate(self.members)}

    def keep_current(self) -> None:
        """Kafka's ``maybeRevokePartitions``: what a member had of a topic it no longer
        subscribes to goes; the rest stays (a partition past the topic's count, or one a
        member before it kept, is no longer its to keep)."""
        for index, member in enumerate(self.members):
            for topic, held in sorted(member.current.items()):
                if topic not in member.topics:
                    continue
                for p in sorted(held):
                    if p < self.partitions[topic] and self.owners[topic][p] == -1:
                        self.assign(topic, p, index)

    def assign_remaining(self) -> None:
        balancer = _Balancer(self)
        unassigned = {t: [p for p, owner in enumerate(owners) if owner == -1]
                      for t, owners in self.owners.items()}
        for topic in sorted((t for t, ps in unassigned.items() if ps), key=self.topic_order):
            balancer.initialize(self.subscribers[topic])
            for p in unassigned[topic]:
                self.assign(topic, p, balancer.next_least_loaded())

    def balance(self) -> None:
        """Kafka's ``balanceTopics``."""
        topics = sorted((t for t, s in self.subscribers.items() if len(s) >= 2),
                        key=self.topic_order)
        if not topics:
            return
        balancer = _Balancer(self)
        last_moved = -1
        for _ in range(MAX_BALANCING_ROUNDS):
            for position, topic in enumerate(topics):
                if position == last_moved:
                    return  # a whole round without a move
                if self.balance_topic(topic, balancer) > 0 or last_moved == -1:
                    last_moved = position

    def balance_topic(self, topic: str, balancer: _Balancer) -> int:
        """Kafka's ``balanceTopic``: the partitions moved."""
        moved = 0
        if balancer.initialize(self.subscribers[topic]) <= 1:
            return moved
        owners = self.owners[topic]
        # The topic's partitions grouped by owner; each owner gives up its last one first.
        ordered = sorted(range(self.partitions[topic]), key=lambda p: (owners[p], p))
        start: dict[int, int] = {}
        end: dict[int, int] = {}
        for i, p in enumerate(ordered):
            start.setdefault(owners[p], i)
            end[owners[p]] = i + 1
        while not balancer.is_balanced():
            giver = -1
            while True:
                giver = balancer.next_most_loaded()
                if giver == -1:
                    break
                if end.get(giver, 0) - start.get(giver, 0) <= 0:
                    balancer.exclude_most_loaded()
                    continue
                break
            if giver == -1:
                break
            end[giver] -= 1
            partition = ordered[end[giver]]
            taker = balancer.next_least_loaded()
            if balancer.is_balanced():
                break
            self.assign(topic, partition, taker)
            moved += 1
        return moved


class _Balancer:
    """Kafka's ``MemberAssignmentBalancer``: a topic's subscribers sorted by load, a range of
    the least loaded ones that grows to the right as they are given partitions (each level
    filled in member order before the next), and a range of the most loaded ones that grows
    to the left as they give partitions up; balanced once the levels of the two ranges differ
    by one at most. Loads are the builder's, read as they change."""

    def __init__(self, builder: _Heterogeneous) -> None:
        self.sizes = builder.sizes
        self.order = builder.member_order
        self.members: list[int] = []
        self.least_end = self.least_level = self.next_least = 0
        self.most_start = self.most_end = self.most_level = self.next_most = 0

    def initialize(self, members: list[int]) -> int:
        """Start over with these members; the difference between the largest and the
        smallest load among them."""
        self.members = sorted(members, key=self.order)
        sizes, first, last = self.sizes, self.members[0], self.members[-1]
        self.least_end, self.least_level, self.next_least = 0, sizes[first] - 1, 0
        self.most_start = self.most_end = len(self.members)
        self.most_level, self.next_most = sizes[last] + 1, len(self.members) - 1
        return sizes[last] - sizes[first]

    def next_least_loaded(self) -> int:
        """The member to give the next partition to (counted as given)."""
        sizes, members = self.sizes, self.members
        if self.next_least >= self.least_end:
            self.least_level += 1
            while self.least_end < len(members) and \
                    sizes[members[self.least_end]] == self.least_level:
                self.least_end += 1
            self.next_least = 0
        member = members[self.next_least]
        self.next_least += 1
        return member

    def next_most_loaded(self) -> int:
        """The member to take the next partition from (counted as taken), -1 if none."""
        sizes, members = self.sizes, self.members
        if self.next_most < self.most_start:
            if self.most_end <= self.most_start and self.most_start > 0:
                self.most_level = sizes[members[self.most_start - 1]]
            else:
                self.most_level -= 1
            while self.most_start > 0 and sizes[members[self.most_start - 1]] == self.most_level:
                self.most_start -= 1
            self.next_most = self.most_end - 1
        if self.next_most < 0:
            return -1
        member = members[self.next_most]
        self.next_most -= 1
        return member

    def exclude_most_loaded(self) -> None:
        """Drop the member :meth:`next_most_loaded` returned last from the most loaded range
        (it has nothing of the topic to give)."""
        members, i = self.members, self.next_most + 1
        members[i], members[self.most_end - 1] = members[self.most_end - 1], members[i]
        self.most_end -= 1

    def is_balanced(self) -> bool:
        return self.most_level - self.least_level <= 1


def uniform_heterogeneous(members: Sequence[MemberSpec],
                          partitions: Mapping[str, int]) -> dict[str, Assignment]:
    """The uniform assignor's assignment for subscriptions that differ (members in the
    order given)."""
    return _Heterogeneous(members, partitions).build()


def _range_order(member: MemberSpec) -> tuple[int, str]:
    return (0, member.instance_id) if member.instance_id is not None else (1, member.member_id)


def range_(members: Sequence[MemberSpec], partitions: Mapping[str, int]) -> dict[str, Assignment]:
    """Kafka's RangeAssignor (of consumer groups): see the module docstring."""
    ordered = sorted(members, key=_range_order)
    result: dict[str, Assignment] = {m.member_id: {} for m in ordered}
    for topic in sorted({t for m in ordered for t in m.topics}):
        count = _partitions_of(topic, partitions)
        takers = [m for m in ordered if topic in m.topics]
        minimum, extra = divmod(count, len(takers))
        start = 0
        for member in takers:
            quota = minimum + (1 if extra > 0 else 0)
            extra -= 1 if extra > 0 else 0
            end = min(start + quota, count)
            if start < end:
                result[member.member_id][topic] = frozenset(range(start, end))
            start = end
    return result


ASSIGNORS: dict[str, Callable[[Sequence[MemberSpec], Mapping[str, int]],
                              dict[str, Assignment]]] = {"uniform": uniform, "range": range_}
