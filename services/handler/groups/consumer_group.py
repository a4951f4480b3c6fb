"""A consumer group of the KIP-848 protocol (Kafka's ``ConsumerGroup`` and
``ConsumerGroupMember``) as pure data, its records in ``__consumer_offsets`` and how they are
replayed. The transitions (heartbeats, leaving, classic members) are :mod:`.consumer_heartbeat`'s.

A group has three epochs: the group epoch (bumped whenever what the assignment depends on
changes: members, their subscriptions, the partition counts of the subscribed topics), the
target assignment epoch (the group epoch the target assignment was computed for), and each
member's epoch (the target assignment epoch its current assignment has caught up with).
Its state (Kafka's ``ConsumerGroupState``) follows from them: Empty without members,
Assigning while the target lags the group epoch, Reconciling while some member has not caught
up with the target, else Stable.

Records, as Kafka writes them (:mod:`..coordinator_records`): the group epoch
(ConsumerGroupMetadata), the subscribed topics' partition counts (ConsumerGroupPartitionMetadata),
each member's subscription (ConsumerGroupMemberMetadata), the target assignment's epoch and each
member's part of it (ConsumerGroupTargetAssignmentMetadata/Member), each member's current
assignment with its epochs and state (ConsumerGroupCurrentMemberAssignment), and each subscribed
regular expression's topics (ConsumerGroupRegularExpression). A change is written as the
records that differ between the group before and after it (:func:`records_between`); replaying
them (:func:`replay`) gives the group after. Topics are named by topic id in assignments.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from ..coordinator.schema import decode, encode
from ..coordinator_records import (
    ClassicMemberMetadata,
    ClassicProtocol,
    ConsumerGroupCurrentMemberAssignmentKey,
    ConsumerGroupCurrentMemberAssignmentValue,
    ConsumerGroupMemberMetadataKey,
    ConsumerGroupMemberMetadataValue,
    ConsumerGroupMetadataKey,
    ConsumerGroupMetadataValue,
    ConsumerGroupPartitionMetadataKey,
    ConsumerGroupPartitionMetadataValue,
    ConsumerGroupRegularExpressionKey,
    ConsumerGroupRegularExpressionValue,
    ConsumerGroupTargetAssignmentMemberKey,
    ConsumerGroupTargetAssignmentMemberValue,
    ConsumerGroupTargetAssignmentMetadataKey,
    ConsumerGroupTargetAssignmentMetadataValue,
    TopicMetadata,
    TopicPartitions,
)

Record = tuple[bytes, bytes | None]
# Partitions by topic id.
TopicAssignment = Mapping[str, frozenset[int]]

# Kafka's ConsumerGroupHeartbeatRequest.LEAVE_GROUP_MEMBER_EPOCH and
# LEAVE_GROUP_STATIC_MEMBER_EPOCH.
LEAVE_GROUP_MEMBER_EPOCH = -1
LEAVE_GROUP_STATIC_MEMBER_EPOCH = -2


class MemberState(enum.IntEnum):
    """Kafka's ``MemberState`` (values persist)."""

    UNREVOKED_PARTITIONS = 0
    UNRELEASED_PARTITIONS = 1
    STABLE = 2
    UNKNOWN = 127


class ConsumerGroupState(enum.Enum):
    EMPTY = "Empty"
    ASSIGNING = "Assigning"
    RECONCILING = "Reconciling"
    STABLE = "Stable"
    DEAD = "Dead"


CONSUMER_STATES_BY_NAME = {s.value.lower(): s for s in ConsumerGroupState}


def freeze(assignment: Mapping[str, set[int] | frozenset[int]] | None) -> dict[str, frozenset[int]]:
    """An assignment without empty topics, its partition sets frozen."""
    return {t: frozenset(ps) for t, ps in (assignment or {}).items() if ps}


@dataclass(frozen=True, slots=True, kw_only=True)
class ClassicMember:
    """What a member speaking the classic protocol joined with (its session timeout and its
    protocols in preference order)."""

    session_timeout_ms: int
    protocols: tuple[tuple[str, bytes], ...]

    @property
    def protocol_name(self) -> str:
        return self.protocols[0][0] if self.protocols else ""


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerMember:
    member_id: str
    instance_id: str | None = None
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    subscribed_topic_names: tuple[str, ...] = ()
    subscribed_topic_regex: str | None = None
    rebalance_timeout_ms: int = -1
    server_assignor: str | None = None
    classic: ClassicMember | None = None
    # The current assignment.
    member_epoch: int = 0
    previous_member_epoch: int = 0
    state: MemberState = MemberState.STABLE
    assigned: TopicAssignment = field(default_factory=dict)
    pending_revocation: TopicAssignment = field(default_factory=dict)
    # The member epoch at which each partition held (assigned or pending revocation) was
    # assigned to the member (KIP-1251), by (topic id, partition); a partition not listed
    # was assigned at max(member epoch, 0) (records written without them).
    assignment_epochs: Mapping[tuple[str, int], int] = field(default_factory=dict)

    @property
    def uses_classic_protocol(self) -> bool:
        return self.classic is not None

    def assignment_epoch(self, topic_id: str, partition: int) -> int | None:
        """The epoch at which the member got a partition it holds (assigned or pending
        revocation); None if it does not hold it (Kafka's ``getAssignmentEpoch`` and
        ``getPendingRevocationEpoch``)."""
        if partition not in self.assigned.get(topic_id, frozenset()) and \
                partition not in self.pending_revocation.get(topic_id, frozenset()):
            return None
        return self.assignment_epochs.get((topic_id, partition), max(self.member_epoch, 0))

    def with_epochs(self, before: ConsumerMember | None, new_epoch: int) -> ConsumerMember:
        """The member with the assignment epoch of each partition it holds: what it already
        held under ``before`` keeps its epoch, what is new was assigned at ``new_epoch``
        (Kafka's ``CurrentAssignmentBuilder``)."""
        epochs: dict[tuple[str, int], int] = {}
        for holding in (self.assigned, self.pending_revocation):
            for topic, partitions in holding.items():
                for p in partitions:
                    held = None if before is None else before.assignment_epoch(topic, p)
                    epochs[(topic, p)] = new_epoch if held is None else held
        return replace(self, assignment_epochs=epochs)

    def is_reconciled_to(self, epoch: int) -> bool:
        return self.state is MemberState.STABLE and self.member_epoch == epoch

    def subscription_value(self) -> ConsumerGroupMemberMetadataValue:
        classic = self.classic
        return ConsumerGroupMemberMetadataValue(
            instance_id=self.instance_id, rack_id=self.rack_id, client_id=self.client_id,
            client_host=self.client_host,
            subscribed_topic_names=tuple(self.subscribed_topic_names),
            subscribed_topic_regex=self.subscribed_topic_regex,
            rebalance_timeout_ms=self.rebalance_timeout_ms,
            server_assignor=self.server_assignor,
            classic_member_metadata=None if classic is None else ClassicMemberMetadata(
                session_timeout_ms=classic.session_timeout_ms,
                supported_protocols=tuple(ClassicProtocol(name=n, metadata=m)
                                          for n, m in classic.protocols)))

    def assignment_value(self) -> ConsumerGroupCurrentMemberAssignmentValue:
        return ConsumerGroupCurrentMemberAssignmentValue(
            member_epoch=self.member_epoch, previous_member_epoch=self.previous_member_epoch,
            state=self.state.value,
            assigned_partitions=_topic_partitions(self.assigned, self.assignment_epoch),
            partitions_pending_revocation=_topic_partitions(self.pending_revocation,
                                                            self.assignment_epoch))

    def with_subscription(self, value: ConsumerGroupMemberMetadataValue) -> ConsumerMember:
        classic = value.classic_member_metadata
        return replace(
            self, instance_id=value.instance_id, rack_id=value.rack_id,
            client_id=value.client_id, client_host=value.client_host,
            subscribed_topic_names=tuple(value.subscribed_topic_names),
            subscribed_topic_regex=value.subscribed_topic_regex,
            rebalance_timeout_ms=value.rebalance_timeout_ms,
            server_assignor=value.server_assignor,
            classic=None if classic is None else ClassicMember(
                session_timeout_ms=classic.session_timeout_ms,
                protocols=tuple((p.name, p.metadata) for p in classic.supported_protocols)))

    def with_assignment(self, value: ConsumerGroupCurrentMemberAssignmentValue) -> ConsumerMember:
        state = value.state if value.state in MemberState._value2member_map_ else 127
        # Records without epochs: Kafka's default, the member epoch (never below 0).
        default = max(value.member_epoch, 0)
        return replace(
            self, member_epoch=value.member_epoch,
            previous_member_epoch=value.previous_member_epoch, state=MemberState(state),
            assigned=_assignment(value.assigned_partitions),
            pending_revocation=_assignment(value.partitions_pending_revocation),
            assignment_epochs={
                **_epochs(value.assigned_partitions, default),
                **_epochs(value.partitions_pending_revocation, default)})


@dataclass(frozen=True, slots=True, kw_only=True)
class ResolvedRegex:
    topics: frozenset[str]
    version: int
    timestamp: int


@dataclass(frozen=True, slots=True, kw_only=True)
class SubscribedTopic:
    topic_id: str
    partitions: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerGroup:
    group_id: str
    epoch: int = 0
    assignment_epoch: int = 0
    # Subscribed topic name -> its id and partition count, as the last assignment saw them.
    subscription_metadata: Mapping[str, SubscribedTopic] = field(default_factory=dict)
    members: Mapping[str, ConsumerMember] = field(default_factory=dict)
    # Member id -> its part of the target assignment.
    target: Mapping[str, TopicAssignment] = field(default_factory=dict)
    regexes: Mapping[str, ResolvedRegex] = field(default_factory=dict)

    # -- queries ---------------------------------------------------------------------------

    @property
    def state(self) -> ConsumerGroupState:
        """Kafka's ``maybeUpdateGroupState``."""
        if not self.members:
            return ConsumerGroupState.EMPTY
        if self.epoch > self.assignment_epoch:
            return ConsumerGroupState.ASSIGNING
        if any(not m.is_reconciled_to(self.assignment_epoch) for m in self.members.values()):
            return ConsumerGroupState.RECONCILING
        return ConsumerGroupState.STABLE

    def static_member(self, instance_id: str | None) -> ConsumerMember | None:
        if instance_id is None:
            return None
        return next((m for m in self.members.values() if m.instance_id == instance_id), None)

    def partition_epochs(self) -> dict[tuple[str, int], int]:
        """Who holds each partition now (assigned or pending revocation): the holder's member
        epoch, by (topic id, partition) (Kafka's ``currentPartitionEpoch``)."""
        epochs: dict[tuple[str, int], int] = {}
        for member in self.members.values():
            for holding in (member.assigned, member.pending_revocation):
                for topic, partitions in holding.items():
                    for p in partitions:
                        epochs[(topic, p)] = member.member_epoch
        return epochs

    def subscribed_regexes(self) -> Counter[str]:
        return Counter(m.subscribed_topic_regex for m in self.members.values()
                       if m.subscribed_topic_regex)

    def subscribed_topic_names(self) -> set[str]:
        """Topics some member subscribes to, by name or through a resolved regex."""
        names: set[str] = set()
        for member in self.members.values():
            names.update(member.subscribed_topic_names)
            if member.subscribed_topic_regex:
                resolved = self.regexes.get(member.subscribed_topic_regex)
                if resolved is not None:
                    names.update(resolved.topics)
        return names

    def member_topics(self, member: ConsumerMember) -> set[str]:
        names = set(member.subscribed_topic_names)
        if member.subscribed_topic_regex:
            resolved = self.regexes.get(member.subscribed_topic_regex)
            if resolved is not None:
                names.update(resolved.topics)
        return names

    def preferred_assignor(self, default: str) -> str:
        """The server assignor most members ask for (Kafka's ``preferredServerAssignor``),
        else ``default``."""
        counts = Counter(m.server_assignor for m in self.members.values() if m.server_assignor)
        if not counts:
            return default
        return max(sorted(counts), key=lambda name: counts[name])

    def all_classic_except(self, member_id: str) -> bool:
        """Whether every member other than ``member_id`` speaks the classic protocol."""
        return all(m.uses_classic_protocol for i, m in self.members.items() if i != member_id)

    def waiting_on_unreleased_partition(self, member: ConsumerMember) -> bool:
        """Whether a partition of the member's target is still held by another member."""
        if member.state is not MemberState.UNRELEASED_PARTITIONS:
            return False
        epochs = self.partition_epochs()
        for topic, partitions in self.target.get(member.member_id, {}).items():
            held = member.assigned.get(topic, frozenset())
            for p in partitions:
                if p not in held and (topic, p) in epochs:
                    return True
        return False


def _topic_partitions(assignment: TopicAssignment,
                      epoch_of: Callable[[str, int], int | None] | None = None,
                      ) -> tuple[TopicPartitions, ...]:
    """Records' partitions by topic; with ``epoch_of``, each partition's assignment epoch."""
    return tuple(TopicPartitions(
        topic_id=t, partitions=tuple(sorted(ps)),
        assignment_epochs=None if epoch_of is None else tuple(
            epoch_of(t, p) or 0 for p in sorted(ps)))
        for t, ps in sorted(assignment.items()) if ps)


def _epochs(entries: tuple[TopicPartitions, ...], default: int) -> dict[tuple[str, int], int]:
    """The assignment epochs of a record's partitions (``default`` where it has none)."""
    epochs: dict[tuple[str, int], int] = {}
    for entry in entries:
        given = entry.assignment_epochs or ()
        for i, p in enumerate(entry.partitions):
            epochs[(entry.topic_id, p)] = given[i] if i < len(given) else default
    return epochs


def _assignment(entries: tuple[TopicPartitions, ...]) -> dict[str, frozenset[int]]:
    result: dict[str, frozenset[int]] = {}
    for entry in entries:
        result[entry.topic_id] = result.get(entry.topic_id, frozenset()) | frozenset(
            entry.partitions)
    return freeze(result)


# --- records ---------------------------------------------------------------------------------


def _key(value: object) -> bytes:
    return encode(value)


def _member_tombstones(group_id: str, member_id: str) -> list[Record]:
    """Kafka's ``removeMember``: current assignment, target assignment and subscription."""
    return [
        (_key(ConsumerGroupCurrentMemberAssignmentKey(group=group_id, member_id=member_id)), None),
        (_key(ConsumerGroupTargetAssignmentMemberKey(group=group_id, member_id=member_id)), None),
        (_key(ConsumerGroupMemberMetadataKey(group=group_id, member_id=member_id)), None),
    ]


def _metadata_value(group: ConsumerGroup) -> ConsumerGroupPartitionMetadataValue:
    return ConsumerGroupPartitionMetadataValue(topics=tuple(
        TopicMetadata(topic_id=t.topic_id, topic_name=name, num_partitions=t.partitions)
        for name, t in sorted(group.subscription_metadata.items())))


def records_between(before: ConsumerGroup | None, after: ConsumerGroup | None) -> list[Record]:
    """The records that turn ``before`` into ``after`` (None: no group), in the order Kafka
    writes them: departures, subscriptions, resolved regexes, partition metadata, the group
    epoch, target assignments, the target epoch, current assignments; a deleted group's
    tombstones end with its epoch's."""
    empty = ConsumerGroup(group_id=(after or before).group_id if (after or before) else "")
    old, new = before or empty, after or empty
    gid = old.group_id or new.group_id
    records: list[Record] = []
    for member_id in old.members:
        if member_id not in new.members:
            records += _member_tombstones(gid, member_id)
    for member_id, member in new.members.items():
        previous = old.members.get(member_id)
        if previous is None or previous.subscription_value() != member.subscription_value():
            records.append((_key(ConsumerGroupMemberMetadataKey(group=gid, member_id=member_id)),
                            encode(member.subscription_value(), 0)))
    for regex in old.regexes:
        if regex not in new.regexes:
            records.append((_key(ConsumerGroupRegularExpressionKey(
                group=gid, regular_expression=regex)), None))
    for regex, resolved in new.regexes.items():
        if old.regexes.get(regex) != resolved:
            records.append((_key(ConsumerGroupRegularExpressionKey(
                group=gid, regular_expression=regex)), encode(ConsumerGroupRegularExpressionValue(
                    topics=tuple(sorted(resolved.topics)), version=resolved.version,
                    timestamp=resolved.timestamp), 0)))
    if after is None:
        if before is not None:
            records += [
                (_key(ConsumerGroupTargetAssignmentMetadataKey(group=gid)), None),
                (_key(ConsumerGroupPartitionMetadataKey(group=gid)), None),
                (_key(ConsumerGroupMetadataKey(group=gid)), None)]
        return records
    if before is None or old.subscription_metadata != new.subscription_metadata:
        records.append((_key(ConsumerGroupPartitionMetadataKey(group=gid)),
                        encode(_metadata_value(new), 0)))
    if before is None or old.epoch != new.epoch:
        records.append((_key(ConsumerGroupMetadataKey(group=gid)),
                        encode(ConsumerGroupMetadataValue(epoch=new.epoch), 0)))
    for member_id, target in new.target.items():
        if member_id in new.members and (
                member_id not in old.target or freeze(old.target[member_id]) != freeze(target)
                or member_id not in old.members):
            records.append((_key(ConsumerGroupTargetAssignmentMemberKey(
                group=gid, member_id=member_id)), encode(ConsumerGroupTargetAssignmentMemberValue(
                    topic_partitions=_topic_partitions(target)), 0)))
    if before is None or old.assignment_epoch != new.assignment_epoch:
        records.append((_key(ConsumerGroupTargetAssignmentMetadataKey(group=gid)), encode(
            ConsumerGroupTargetAssignmentMetadataValue(assignment_epoch=new.assignment_epoch), 0)))
    for member_id, member in new.members.items():
        previous = old.members.get(member_id)
        if previous is None or previous.assignment_value() != member.assignment_value():
            records.append((_key(ConsumerGroupCurrentMemberAssignmentKey(
                group=gid, member_id=member_id)), encode(member.assignment_value(), 0)))
    return records


# --- replay ----------------------------------------------------------------------------------

CONSUMER_GROUP_KEYS = (
    ConsumerGroupMetadataKey, ConsumerGroupPartitionMetadataKey, ConsumerGroupMemberMetadataKey,
    ConsumerGroupTargetAssignmentMetadataKey, ConsumerGroupTargetAssignmentMemberKey,
    ConsumerGroupCurrentMemberAssignmentKey, ConsumerGroupRegularExpressionKey)


def replay(groups: dict[str, ConsumerGroup], key: object, value: bytes | None) -> None:
    """Apply one consumer group record (``key`` decoded, ``value`` raw; None: a tombstone)
    to ``groups``. A group appears with its first record; the tombstone of its epoch
    removes it."""
    gid: str = key.group  # type: ignore[attr-defined]
    group = groups.get(gid)
    if group is None:
        if value is None:
            return
        group = ConsumerGroup(group_id=gid)
    if isinstance(key, ConsumerGroupMetadataKey):
        if value is None:
            groups.pop(gid, None)
            return
        group = replace(group, epoch=decode(ConsumerGroupMetadataValue, value).epoch)
    elif isinstance(key, ConsumerGroupPartitionMetadataKey):
        topics = {} if value is None else {
            t.topic_name: SubscribedTopic(topic_id=t.topic_id, partitions=t.num_partitions)
            for t in decode(ConsumerGroupPartitionMetadataValue, value).topics}
        group = replace(group, subscription_metadata=topics)
    elif isinstance(key, ConsumerGroupTargetAssignmentMetadataKey):
        epoch = 0 if value is None else decode(
            ConsumerGroupTargetAssignmentMetadataValue, value).assignment_epoch
        group = replace(group, assignment_epoch=epoch)
    elif isinstance(key, ConsumerGroupRegularExpressionKey):
        regexes = dict(group.regexes)
        if value is None:
            regexes.pop(key.regular_expression, None)
        else:
            resolved = decode(ConsumerGroupRegularExpressionValue, value)
            regexes[key.regular_expression] = ResolvedRegex(
                topics=frozenset(resolved.topics), version=resolved.version,
                timestamp=resolved.timestamp)
        group = replace(group, regexes=regexes)
    else:
        member_id: str = key.member_id  # type: ignore[attr-defined]
        members = dict(group.members)
        if isinstance(key, ConsumerGroupTargetAssignmentMemberKey):
            target = dict(group.target)
            if value is None:
                target.pop(member_id, None)
            else:
                target[member_id] = _assignment(decode(
                    ConsumerGroupTargetAssignmentMemberValue, value).topic_partitions)
            group = replace(group, target=target)
        elif isinstance(key, ConsumerGroupMemberMetadataKey):
            if value is None:
                members.pop(member_id, None)
            else:
                member = members.get(member_id) or ConsumerMember(member_id=member_id)
                members[member_id] = member.with_subscription(
                    decode(ConsumerGroupMemberMetadataValue, value))
            group = replace(group, members=members)
        elif isinstance(key, ConsumerGroupCurrentMemberAssignmentKey):
            if value is None:
                member = members.get(member_id)
                if member is not None:
                    members[member_id] = replace(
                        member, member_epoch=0, previous_member_epoch=0,
                        state=MemberState.STABLE, assigned={}, pending_revocation={},
                        assignment_epochs={})
            else:
                member = members.get(member_id) or ConsumerMember(member_id=member_id)
                members[member_id] = member.with_assignment(
                    decode(ConsumerGroupCurrentMemberAssignmentValue, value))
            group = replace(group, members=members)
    groups[gid] = group
