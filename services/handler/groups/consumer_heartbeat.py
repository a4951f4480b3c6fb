"""ConsumerGroupHeartbeat as a pure transition of a consumer group (Kafka's
``GroupMetadataManager.consumerGroupHeartbeat`` and ``consumerGroupLeave``): no I/O, no clock
(``now`` is given), errors raised as :class:`GroupError` with Kafka's code.

A heartbeat, in Kafka's order:

1. Checks (INVALID_REQUEST): a group id; no empty instance or rack id; a member id (v1+, where
   clients make their own, or any epoch but 0); an epoch of 0 (join), -1 (leave), -2 (a static
   member leaving for now) or above; a join names its rebalance timeout, no owned partitions,
   and topics or a regular expression. An unknown ``server_assignor`` is UNSUPPORTED_ASSIGNOR,
   a regular expression RE2 does not compile (Kafka's RE2/J syntax, :mod:`.topic_regex`)
   INVALID_REGULAR_EXPRESSION.
2. The group: a join creates it; an empty classic group of the same id is replaced (its
   committed offsets stay); a classic group in use is converted when the migration policy
   allows upgrades and its members speak the consumer protocol (:mod:`.conversion`);
   anything else is GROUP_ID_NOT_FOUND. A group at ``group.consumer.max.size`` turns away new
   members (GROUP_MAX_SIZE_REACHED).
3. The member: a new one joins with epoch 0; a known one must send its epoch, or its previous
   epoch while owning only part of what it has (the answer that bumped it may be lost), else
   FENCED_MEMBER_EPOCH; an unknown one is UNKNOWN_MEMBER_ID. A static member (instance id)
   joining replaces the member that holds its instance id only if that one left with epoch
   -2 (else UNRELEASED_INSTANCE_ID), taking over its assignment; a static member's heartbeat
   under another member id is FENCED_INSTANCE_ID.
4. A changed subscription (topics, regex) or changed partition counts of the subscribed
   topics bump the group epoch; then the target assignment is computed anew with the
   preferred server assignor, and the member reconciles towards it (:mod:`.reconciliation`).
5. The answer: member id, epoch, heartbeat interval, and the assignment when the member sent
   a full request or its assignment changed.

Leaving: epoch -1 removes the member (its assignment goes back to the group, which rebalances
at a new epoch); a static member with -2 keeps its place and assignment, marked with epoch
-2, until it rejoins under a new member id or its session ends. When the last member speaking
the consumer protocol leaves and classic members remain, the group becomes a classic group
again if the migration policy allows downgrades.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from services.common.errors import ErrorCode

from .assignors import ASSIGNORS, MemberSpec, PartitionAssignorError
from .consumer_config import ConsumerGroupConfig, GroupError, TopicImage
from .consumer_group import (
    LEAVE_GROUP_MEMBER_EPOCH,
    LEAVE_GROUP_STATIC_MEMBER_EPOCH,
    ConsumerGroup,
    ConsumerMember,
    MemberState,
    ResolvedRegex,
    SubscribedTopic,
    TopicAssignment,
    freeze,
)
from .conversion import (
    can_downgrade,
    can_upgrade,
    classic_is_empty,
    convert_from_classic,
    convert_to_classic,
)
from .reconciliation import FencedMemberEpochError, reconcile
from .topic_regex import InvalidRegexError, TopicFilter, compile_regex, matching_topics

INVALID_REQUEST = ErrorCode.invalid_request.value
UNSUPPORTED_ASSIGNOR = ErrorCode.unsupported_assignor.value
INVALID_REGULAR_EXPRESSION = ErrorCode.invalid_regular_expression.value
GROUP_ID_NOT_FOUND = ErrorCode.group_id_not_found.value
GROUP_MAX_SIZE_REACHED = ErrorCode.group_max_size_reached.value
UNKNOWN_MEMBER_ID = ErrorCode.unknown_member_id.value
FENCED_MEMBER_EPOCH = ErrorCode.fenced_member_epoch.value
FENCED_INSTANCE_ID = ErrorCode.fenced_instance_id.value
UNRELEASED_INSTANCE_ID = ErrorCode.unreleased_instance_id.value
UNKNOWN_SERVER_ERROR = ErrorCode.unknown_server_error.value

# Kafka's REGEX_BATCH_REFRESH_INTERVAL_MS: regular expressions are resolved again at most
# this often (sooner when one is not resolved yet).
REGEX_REFRESH_INTERVAL_MS = 10_000
# The first ConsumerGroupHeartbeat version whose clients make their own member ids (KIP-1082).
CLIENT_MEMBER_ID_VERSION = 1

@dataclass(frozen=True, slots=True, kw_only=True)
class HeartbeatRequest:
    group_id: str
    member_id: str
    member_epoch: int
    instance_id: str | None = None
    rack_id: str | None = None
    rebalance_timeout_ms: int = -1
    subscribed_topic_names: tuple[str, ...] | None = None
    subscribed_topic_regex: str | None = None
    server_assignor: str | None = None
    # Owned partitions by topic id; None when the request leaves them out.
    owned: Mapping[str, frozenset[int]] | None = None
    client_id: str = ""
    client_host: str = ""
    api_version: int = CLIENT_MEMBER_ID_VERSION


@dataclass(frozen=True, slots=True, kw_only=True)
class Timers:
    """Timers a change implies (armed after its write): session timers to (re)arm by member
    (ms), members whose timers go, and revocation deadlines (member id, epoch, ms)."""

    sessions: Mapping[str, int] = field(default_factory=dict)
    disarm: tuple[str, ...] = ()
    revocations: tuple[tuple[str, int, int], ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class HeartbeatResult:
    member_id: str
    member_epoch: int
    heartbeat_interval_ms: int = 0
    # By topic id; None: not sent.
    assignment: TopicAssignment | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Change:
    """What a transition did: the consumer group after it (None: gone, or a classic group
    took its place: ``classic_after``), whether a classic group of the id must be deleted
    (replaced or converted), its answer and its timers."""

    after: ConsumerGroup | None
    result: object = None
    timers: Timers = Timers()
    delete_classic: bool = False
    classic_after: object = None


# --- checks ----------------------------------------------------------------------------------


def check_regex(regex: str) -> None:
    """A subscription's regular expression must be one Kafka's RE2/J compiles
    (:mod:`.topic_regex`), else INVALID_REGULAR_EXPRESSION."""
    try:
        compile_regex(regex)
    except InvalidRegexError as exc:
        raise GroupError(INVALID_REGULAR_EXPRESSION,
                         f"SubscribedTopicRegex `{regex}` is not a valid regular expression: "
                         f"{exc}.") from None


def validate(request: HeartbeatRequest, config: ConsumerGroupConfig) -> None:
    """Kafka's ``throwIfConsumerGroupHeartbeatRequestIsInvalid``."""
    def invalid(message: str) -> GroupError:
        return GroupError(INVALID_REQUEST, message)

    if not request.group_id:
        raise invalid("GroupId can't be empty.")
    if request.instance_id == "":
        raise invalid("InstanceId can't be empty.")
    if request.rack_id == "":
        raise invalid("RackId can't be empty.")
    if request.api_version >= CLIENT_MEMBER_ID_VERSION and not request.member_id:
        raise invalid("MemberId can't be empty.")
    epoch = request.member_epoch
    if epoch > 0 or epoch == LEAVE_GROUP_MEMBER_EPOCH:
        if not request.member_id:
            raise invalid("MemberId can't be empty.")
    elif epoch == 0:
        if request.rebalance_timeout_ms == -1:
            raise invalid("RebalanceTimeoutMs must be provided in first request.")
        if request.owned is None or any(request.owned.values()):
            raise invalid("TopicPartitions must be empty when (re-)joining.")
        if request.subscribed_topic_names is None and request.subscribed_topic_regex is None:
            raise invalid("Either SubscribedTopicNames or SubscribedTopicRegex must be non-null "
                          "when (re-)joining.")
    elif epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH:
        if not request.member_id:
            raise invalid("MemberId can't be empty.")
        if request.instance_id is None:
            raise invalid("InstanceId can't be null.")
    else:
        raise invalid("MemberEpoch is invalid.")
    if request.subscribed_topic_regex:
        check_regex(request.subscribed_topic_regex)
    if request.server_assignor is not None and request.server_assignor not in config.assignors:
        raise GroupError(UNSUPPORTED_ASSIGNOR,
                         f"ServerAssignor {request.server_assignor} is not supported. Supported "
                         f"assignors: {', '.join(config.assignors)}.")


# --- the heartbeat ---------------------------------------------------------------------------


def _is_subset(owned: Mapping[str, frozenset[int]] | None, held: TopicAssignment) -> bool:
    if owned is None:
        return False
    return all(ps <= held.get(topic, frozenset()) for topic, ps in owned.items() if ps)


def check_member_epoch(member: ConsumerMember, received: int,
                       owned: Mapping[str, frozenset[int]] | None) -> None:
    """Kafka's ``throwIfConsumerGroupMemberEpochIsInvalid``."""
    if received > member.member_epoch:
        raise GroupError(FENCED_MEMBER_EPOCH,
                         f"The consumer group member has a greater member epoch ({received}) "
                         f"than the one known by the group coordinator ({member.member_epoch}). "
                         "The member must abandon all its partitions and rejoin.")
    if received < member.member_epoch and (
            received != member.previous_member_epoch or not _is_subset(owned, member.assigned)):
        raise GroupError(FENCED_MEMBER_EPOCH,
                         f"The consumer group member has a smaller member epoch ({received}) "
                         f"than the one known by the group coordinator ({member.member_epoch}). "
                         "The member must abandon all its partitions and rejoin.")


def replace_member(group: ConsumerGroup, old: ConsumerMember, new: ConsumerMember,
                   ) -> ConsumerGroup:
    """Kafka's ``replaceMember``: a static member's new incarnation takes the old one's place
    and target assignment."""
    members = {i: m for i, m in group.members.items() if i != old.member_id}
    members[new.member_id] = new
    target = {i: t for i, t in group.target.items() if i != old.member_id}
    target[new.member_id] = group.target.get(old.member_id, {})
    return replace(group, members=members, target=target)


def resolve_regexes(group: ConsumerGroup, image: TopicImage, now: int,
                    describable: TopicFilter = None) -> ConsumerGroup:
    """Resolve the group's subscribed regular expressions against the topics when one is
    unresolved, or the last resolution is older than :data:`REGEX_REFRESH_INTERVAL_MS` and
    the metadata changed since (Kafka resolves them in the background on the same terms);
    resolutions no member needs any more go. With an authorizer on, a resolution keeps only
    the topics the member whose heartbeat resolved it may DESCRIBE (``describable``), as
    Kafka 4 does."""
    wanted = set(group.subscribed_regexes())
    regexes = {r: v for r, v in group.regexes.items() if r in wanted}
    unresolved = wanted - set(regexes)
    last = max((v.timestamp for v in regexes.values()), default=-1)
    stale = any(v.version < image.version for v in regexes.values()) and \
        now > last + REGEX_REFRESH_INTERVAL_MS
    if unresolved or stale:
        for regex in wanted:
            topics = matching_topics(regex, image.topics, describable)
            previous = regexes.get(regex)
            if previous is None or previous.topics != topics or regex in unresolved:
                regexes[regex] = ResolvedRegex(topics=topics, version=image.version,
                                               timestamp=now)
    if regexes == dict(group.regexes):
        return group
    return replace(group, regexes=regexes)


def subscription_metadata(group: ConsumerGroup, image: TopicImage) -> dict[str, SubscribedTopic]:
    """The subscribed topics that exist, with their ids and partition counts."""
    return {name: image.topics[name] for name in sorted(group.subscribed_topic_names())
            if name in image.topics}


def update_epoch(before: ConsumerGroup, group: ConsumerGroup, image: TopicImage,
                 bump: bool) -> ConsumerGroup:
    """Refresh the partition metadata of the subscribed topics; bump the group epoch if it
    changed or ``bump`` (a subscription changed)."""
    metadata = subscription_metadata(group, image)
    if metadata != dict(before.subscription_metadata):
        group = replace(group, subscription_metadata=metadata)
        bump = True
    if bump:
        group = replace(group, epoch=before.epoch + 1)
    return group


def compute_target(group: ConsumerGroup, config: ConsumerGroupConfig) -> ConsumerGroup:
    """The target assignment of the group epoch (Kafka's ``TargetAssignmentBuilder``), from
    the preferred assignor; a member with epoch -2 (a static member away) keeps its share."""
    ids = {name: t.topic_id for name, t in group.subscription_metadata.items()}
    counts = {t.topic_id: t.partitions for t in group.subscription_metadata.values()}
    specs = [MemberSpec(member_id=m.member_id, instance_id=m.instance_id,
                        topics=frozenset(ids[n] for n in group.member_topics(m) if n in ids),
                        current=freeze(group.target.get(m.member_id)),
                        subscription=(frozenset(m.subscribed_topic_names),
                                      m.subscribed_topic_regex))
             for m in group.members.values()]
    assignor = ASSIGNORS[group.preferred_assignor(config.default_assignor)]
    try:
        target = assignor(specs, counts)
    except PartitionAssignorError as exc:
        raise GroupError(UNKNOWN_SERVER_ERROR, f"Failed to compute a new target assignment "
                         f"for epoch {group.epoch}: {exc}.") from None
    return replace(group, target={m: freeze(a) for m, a in target.items()},
                   assignment_epoch=group.epoch)


def reconcile_member(group: ConsumerGroup, member: ConsumerMember,
                     owned: Mapping[str, frozenset[int]] | None) -> ConsumerMember:
    """Kafka's ``maybeReconcile``."""
    if member.is_reconciled_to(group.assignment_epoch):
        return member
    epochs = group.partition_epochs()
    # The member's own holdings are not in another's way.
    for holding in (member.assigned, member.pending_revocation):
        for topic, partitions in holding.items():
            for p in partitions:
                epochs.pop((topic, p), None)
    try:
        return reconcile(member, group.assignment_epoch, group.target.get(member.member_id, {}),
                         lambda t, p: epochs.get((t, p), -1), owned)
    except FencedMemberEpochError as exc:
        raise GroupError(FENCED_MEMBER_EPOCH, str(exc)) from None


def revocation_timer(before: ConsumerMember | None, after: ConsumerMember) -> tuple[int, ...]:
    """(epoch, timeout) of the revocation deadline to arm, when the member has just been
    asked to revoke partitions."""
    if after.state is MemberState.UNREVOKED_PARTITIONS and (
            before is None or before.state is not MemberState.UNREVOKED_PARTITIONS
            or before.member_epoch != after.member_epoch):
        return (after.member_epoch, max(after.rebalance_timeout_ms, 0))
    return ()


def heartbeat(group: ConsumerGroup | None, classic: object, request: HeartbeatRequest,
              image: TopicImage, config: ConsumerGroupConfig, now: int,
              describable: TopicFilter = None) -> Change:
    """A ConsumerGroupHeartbeat (not a leave) on the group of its id; ``classic`` is the
    classic group of that id (a :class:`~.group.Group`), if any; ``describable`` filters the
    topics a regular expression matched by the member's DESCRIBE permission (None: no
    authorizer). Raises GroupError."""

    validate(request, config)
    if request.member_epoch in (LEAVE_GROUP_MEMBER_EPOCH, LEAVE_GROUP_STATIC_MEMBER_EPOCH):
        return leave(group, request, config, image=image, now=now)
    joining = request.member_epoch == 0
    delete_classic = False
    if group is None:
        if classic is not None and not classic_is_empty(classic):
            if not joining or not can_upgrade(classic, config):
                raise GroupError(GROUP_ID_NOT_FOUND,
                                 f"Group {request.group_id} is not a consumer group.")
            group = convert_from_classic(classic, image)
            delete_classic = True
        elif not joining:
            raise GroupError(GROUP_ID_NOT_FOUND,
                             f"Consumer group {request.group_id} not found.")
        else:
            delete_classic = classic is not None
            group = ConsumerGroup(group_id=request.group_id)
    before = group
    member_id = request.member_id or str(uuid.uuid4())
    if len(group.members) >= config.max_size and (
            not request.member_id or member_id not in group.members):
        raise GroupError(GROUP_MAX_SIZE_REACHED, "The consumer group has reached its maximum "
                         f"capacity of {config.max_size} members.")
    member = _member(group, member_id, request)
    if request.instance_id is not None and joining:
        existing = group.static_member(request.instance_id)
        if existing is not None and existing.member_id != member_id:
            group = replace_member(group, existing, member)
    updated = replace(
        member,
        instance_id=request.instance_id if request.instance_id is not None
        else member.instance_id,
        rack_id=request.rack_id if request.rack_id is not None else member.rack_id,
        rebalance_timeout_ms=request.rebalance_timeout_ms
        if request.rebalance_timeout_ms != -1 else member.rebalance_timeout_ms,
        server_assignor=request.server_assignor if request.server_assignor is not None
        else member.server_assignor,
        subscribed_topic_names=tuple(request.subscribed_topic_names)
        if request.subscribed_topic_names is not None else member.subscribed_topic_names,
        subscribed_topic_regex=request.subscribed_topic_regex
        if request.subscribed_topic_regex is not None else member.subscribed_topic_regex,
        client_id=request.client_id, client_host=request.client_host, classic=None)
    if request.subscribed_topic_regex == "":
        updated = replace(updated, subscribed_topic_regex=None)  # no regex (Kafka's isNotEmpty)
    previous = group.members.get(member_id)
    bump = previous is None or (
        previous.subscribed_topic_names != updated.subscribed_topic_names
        or previous.subscribed_topic_regex != updated.subscribed_topic_regex)
    group = replace(group, members={**group.members, member_id: updated})
    group = resolve_regexes(group, image, now, describable)
    bump = bump or group.regexes != before.regexes
    group = update_epoch(before, group, image, bump)
    if group.epoch > group.assignment_epoch:
        group = compute_target(group, config)
    reconciled = reconcile_member(group, updated, request.owned)
    group = replace(group, members={**group.members, member_id: reconciled})
    full = joining or (request.rebalance_timeout_ms != -1
                       and request.subscribed_topic_names is not None
                       and request.owned is not None)
    changed = previous is None or freeze(previous.assigned) != freeze(reconciled.assigned)
    revoke = revocation_timer(previous, reconciled)
    return Change(
        after=group, delete_classic=delete_classic,
        result=HeartbeatResult(
            member_id=member_id, member_epoch=reconciled.member_epoch,
            heartbeat_interval_ms=config.heartbeat_interval_ms,
            assignment=freeze(reconciled.assigned) if full or changed else None),
        timers=Timers(sessions={member_id: config.session_timeout_ms},
                      revocations=((member_id, *revoke),) if revoke else ()))


def _member(group: ConsumerGroup, member_id: str, request: HeartbeatRequest) -> ConsumerMember:
    """Kafka's ``getOrMaybeSubscribe{Dynamic,Static}ConsumerGroupMember``."""
    joining = request.member_epoch == 0
    if request.instance_id is None:
        member = group.members.get(member_id)
        if member is None:
            if not joining:
                raise GroupError(UNKNOWN_MEMBER_ID, f"Member {member_id} is not a member of "
                                 f"group {group.group_id}.")
            return ConsumerMember(member_id=member_id)
        check_member_epoch(member, request.member_epoch, request.owned)
        return member
    existing = group.static_member(request.instance_id)
    if joining:
        if existing is None:
            return group.members.get(member_id) or ConsumerMember(member_id=member_id)
        if existing.member_id == member_id:
            check_member_epoch(existing, 0, request.owned)
            return existing
        if not existing.uses_classic_protocol and \
                existing.member_epoch != LEAVE_GROUP_STATIC_MEMBER_EPOCH:
            raise GroupError(UNRELEASED_INSTANCE_ID, f"Static member {member_id} with instance "
                             f"id {request.instance_id} cannot join the group because the "
                             f"instance id is owned by {existing.member_id} member.")
        # What the new incarnation keeps counts as assigned at epoch 0.
        return replace(existing, member_id=member_id, member_epoch=0, previous_member_epoch=0,
                       assignment_epochs={})
    if existing is None:
        raise GroupError(UNKNOWN_MEMBER_ID, f"Instance id {request.instance_id} is unknown.")
    if existing.member_id != member_id:
        raise GroupError(FENCED_INSTANCE_ID, f"Static member {member_id} with instance id "
                         f"{request.instance_id} was fenced by member {existing.member_id}.")
    check_member_epoch(existing, request.member_epoch, request.owned)
    return existing


# --- leaving ---------------------------------------------------------------------------------


def leave(group: ConsumerGroup | None, request: HeartbeatRequest,
          config: ConsumerGroupConfig, *, image: TopicImage | None = None, now: int = -1,
          classic_config: object = None) -> Change:
    """Kafka's ``consumerGroupLeave``. Raises GroupError."""
    if group is None:
        raise GroupError(GROUP_ID_NOT_FOUND, f"Consumer group {request.group_id} not found.")
    if request.instance_id is None:
        member = group.members.get(request.member_id)
        if member is None:
            raise GroupError(UNKNOWN_MEMBER_ID, f"Member {request.member_id} is not a member "
                             f"of group {group.group_id}.")
    else:
        member = group.static_member(request.instance_id)
        if member is None:
            raise GroupError(UNKNOWN_MEMBER_ID,
                             f"Instance id {request.instance_id} is unknown.")
        if member.member_id != request.member_id:
            raise GroupError(FENCED_INSTANCE_ID, f"Static member {request.member_id} with "
                             f"instance id {request.instance_id} was fenced by member "
                             f"{member.member_id}.")
        if request.member_epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH:
            away = replace(member, member_epoch=LEAVE_GROUP_STATIC_MEMBER_EPOCH,
                           previous_member_epoch=member.member_epoch, pending_revocation={})
            return Change(after=replace(group, members={**group.members,
                                                        member.member_id: away}),
                          result=HeartbeatResult(member_id=member.member_id,
                                                 member_epoch=LEAVE_GROUP_STATIC_MEMBER_EPOCH))
    change = fence(group, member.member_id, config, image=image, now=now,
                   classic_config=classic_config)
    return replace(change, result=HeartbeatResult(member_id=request.member_id,
                                                  member_epoch=request.member_epoch))


def fence(group: ConsumerGroup, member_id: str, config: ConsumerGroupConfig, *,
          image: TopicImage | None = None, now: int = -1, classic_config: object = None,
          ) -> Change:
    """Kafka's ``consumerGroupFenceMember``: the member goes and the group epoch is bumped
    (its partition metadata recomputed without it when the topics are known); or, when only
    classic members would remain, the group becomes a classic group (downgrade)."""

    if can_downgrade(group, member_id, config):
        return Change(after=None, classic_after=convert_to_classic(
            group, member_id, now=now, image=image,
            classic_config=classic_config),  # type: ignore[arg-type]
                      timers=Timers(disarm=(member_id,)))
    members = {i: m for i, m in group.members.items() if i != member_id}
    target = {i: t for i, t in group.target.items() if i != member_id}
    after = replace(group, members=members, target=target)
    metadata = dict(group.subscription_metadata)
    names = after.subscribed_topic_names()
    metadata = {n: t for n, t in metadata.items() if n in names}
    after = replace(after, subscription_metadata=metadata,
                    regexes={r: v for r, v in after.regexes.items()
                             if r in after.subscribed_regexes()},
                    epoch=group.epoch + 1)
    return Change(after=after, timers=Timers(disarm=(member_id,)))


def expire_revocation(group: ConsumerGroup, member_id: str, epoch: int,
                      config: ConsumerGroupConfig, **context: object) -> Change | None:
    """The revocation deadline of ``member_id`` at ``epoch`` passed (Kafka's rebalance
    timeout): the member is fenced if it still has not revoked; None otherwise."""
    member = group.members.get(member_id)
    if member is None or member.state is not MemberState.UNREVOKED_PARTITIONS or \
            member.member_epoch != epoch:
        return None
    return fence(group, member_id, config, **context)  # type: ignore[arg-type]
