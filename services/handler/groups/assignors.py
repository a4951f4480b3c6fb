"""Server-side partition assignors of consumer groups (KIP-848; Kafka's ``UniformAssignor``
and ``RangeAssignor`` of the group coordinator), pure functions of the group's subscriptions,
its previous target assignment and the partition counts of the subscribed topics.

    uniform  sticky and balanced. When every member subscribes to the same topics (Kafka's
             homogeneous case) the result is Kafka's: the total partition count divided by
             the members gives each a quota (the first ``total % members`` members, in member
             order, one more); each member keeps what it had up to its quota, and the
             partitions left over go, in topic and partition order, to the members with room,
             in member order. When subscriptions differ, a partition goes only to a member
             that subscribes to its topic: each member keeps what it had and still
             subscribes to, partitions left over go to the least loaded member that can take
             them, then partitions move from the most to the least loaded member able to take
             them until no move makes the counts more even. Kafka's heterogeneous builder
             pursues the same two goals (balance within what subscriptions allow, then
             stickiness) and may pick other partitions to move.
    range    not sticky: per topic, its subscribers in order (static members by instance id
             first, then the others by member id) take consecutive ranges of
             ``partitions // subscribers`` partitions, the first ``partitions % subscribers``
             one more.

Members are ordered by member id where Kafka iterates a hash map, so that every handler
computes the same assignment. Topics are named by topic id, partitions by number.
"""

from __future__ import annotations

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


class PartitionAssignorError(Exception):
    """The assignment cannot be computed (a subscribed topic without metadata)."""


def _order(members: Sequence[MemberSpec]) -> list[MemberSpec]:
    return sorted(members, key=lambda m: m.member_id)


def uniform(members: Sequence[MemberSpec], partitions: Mapping[str, int]) -> dict[str, Assignment]:
    """Kafka's UniformAssignor: see the module docstring."""
    if not members:
        return {}
    subscriptions = {m.topics for m in members}
    if len(subscriptions) == 1:
        return _uniform_homogeneous(_order(members), partitions)
    return _uniform_heterogeneous(_order(members), partitions)


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


def _uniform_heterogeneous(members: list[MemberSpec],
                           partitions: Mapping[str, int]) -> dict[str, Assignment]:
    topics = sorted({t for m in members for t in m.topics})
    owner: dict[tuple[str, int], str] = {}
    load = {m.member_id: 0 for m in members}
    subscribers = {t: [m.member_id for m in members if t in m.topics] for t in topics}
    for member in members:
        for topic, owned in sorted(member.current.items()):
            if topic not in member.topics:
                continue
            count = _partitions_of(topic, partitions)
            for p in sorted(owned):
                if p < count and (topic, p) not in owner:
                    owner[(topic, p)] = member.member_id
                    load[member.member_id] += 1
    for topic in topics:
        for p in range(_partitions_of(topic, partitions)):
            if (topic, p) not in owner:
                chosen = min(subscribers[topic], key=lambda m: (load[m], m))
                owner[(topic, p)] = chosen
                load[chosen] += 1
    # Even out: move a partition from a member to one subscribed to its topic that has at
    # least two fewer, as long as such a move exists (each move lowers the sum of squares).
    moved = True
    while moved:
        moved = False
        for tp in sorted(owner, key=lambda tp: (-load[owner[tp]], tp)):
            source = owner[tp]
            target = min(subscribers[tp[0]], key=lambda m: (load[m], m))
            if load[source] - load[target] >= 2:
                owner[tp] = target
                load[source] -= 1
                load[target] += 1
                moved = True
                break
    result: dict[str, dict[str, set[int]]] = {m.member_id: {} for m in members}
    for (topic, p), member_id in owner.items():
        result[member_id].setdefault(topic, set()).add(p)
    return {m: {t: frozenset(ps) for t, ps in a.items()} for m, a in result.items()}


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
