"""Classic and consumer protocols in one group (Kafka 4's online migration, KIP-848): a
classic group whose members start speaking the consumer protocol becomes a consumer group
(upgrade), classic members keep their place in it and are served JoinGroup, SyncGroup,
Heartbeat and LeaveGroup by the consumer group (their assignment computed by the server
assignor and handed over in SyncGroup), and a consumer group left with only classic members
becomes a classic group again (downgrade). ``group.consumer.migration.policy`` says which
directions are allowed (Kafka 4's default: both).

Upgrade and downgrade themselves are :mod:`.conversion`.

A classic member of a consumer group (``classicGroup*ToConsumerGroup``): JoinGroup updates its
subscription (from the embedded ConsumerProtocolSubscription, whose owned partitions it has
revoked), reconciles it and answers with its member epoch as the generation; SyncGroup answers
its assigned partitions; Heartbeat answers REBALANCE_IN_PROGRESS when it must rejoin (the
group epoch moved past it, it has partitions to revoke, or partitions it waits for were
released); LeaveGroup fences it. Errors as Kafka's: UNKNOWN_MEMBER_ID, FENCED_INSTANCE_ID,
ILLEGAL_GENERATION, INCONSISTENT_GROUP_PROTOCOL, REBALANCE_IN_PROGRESS.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import replace

from services.common.errors import ErrorCode

from ..coordinator.schema import RecordFormatError
from .consumer_group import (
    ClassicMember,
    ConsumerGroup,
    ConsumerMember,
    MemberState,
)
from .consumer_heartbeat import (
    GROUP_MAX_SIZE_REACHED,
    Change,
    ConsumerGroupConfig,
    GroupError,
    Timers,
    TopicImage,
    compute_target,
    fence,
    reconcile_member,
    replace_member,
    resolve_regexes,
    update_epoch,
)
from .consumer_protocol import (
    read_subscription,
    subscription_version,
    write_assignment,
)
from .conversion import (
    CONSUMER_PROTOCOL_TYPE,
    convert_to_classic,
    topic_ids,
    topic_names,
)
from .group import GroupConfig

UNKNOWN_MEMBER_ID = ErrorCode.unknown_member_id.value
FENCED_INSTANCE_ID = ErrorCode.fenced_instance_id.value
ILLEGAL_GENERATION = ErrorCode.illegal_generation.value
INCONSISTENT_GROUP_PROTOCOL = ErrorCode.inconsistent_group_protocol.value
REBALANCE_IN_PROGRESS = ErrorCode.rebalance_in_progress.value
MEMBER_ID_REQUIRED = ErrorCode.member_id_required.value


# --- classic members of a consumer group -----------------------------------------------------


def _classic_member(group: ConsumerGroup, member_id: str, instance_id: str | None,
                    ) -> ConsumerMember:
    """Kafka's ``validateConsumerGroupMember``."""
    if instance_id is not None:
        member = group.static_member(instance_id)
        if member is None:
            raise GroupError(UNKNOWN_MEMBER_ID, f"Instance id {instance_id} is unknown.")
        if member.member_id != member_id:
            raise GroupError(FENCED_INSTANCE_ID, f"Static member {member_id} with instance id "
                             f"{instance_id} was fenced by member {member.member_id}.")
        return member
    member = group.members.get(member_id)
    if member is None:
        raise GroupError(UNKNOWN_MEMBER_ID, f"Member {member_id} is not a member of group "
                         f"{group.group_id}.")
    return member


def classic_join(group: ConsumerGroup, *, member_id: str, instance_id: str | None,
                 client_id: str, client_host: str, session_timeout_ms: int,
                 rebalance_timeout_ms: int, protocol_type: str,
                 protocols: Sequence[tuple[str, bytes]], require_known_member_id: bool,
                 image: TopicImage, config: ConsumerGroupConfig, now: int,
                 classic_config: GroupConfig | None = None) -> Change:
    """Kafka's ``classicGroupJoinToConsumerGroup``: the result is (error, member id,
    generation, protocol name). A static member taking the place of the last member that
    spoke the consumer protocol turns the group into a classic group (downgrade), as the
    migration policy allows. Raises GroupError."""
    unknown = not member_id
    if unknown:
        member_id = f"{client_id}-{uuid.uuid4()}"
    if len(group.members) >= config.max_size and member_id not in group.members:
        raise GroupError(GROUP_MAX_SIZE_REACHED, "The consumer group has reached its maximum "
                         f"capacity of {config.max_size} members.")
    if protocol_type != CONSUMER_PROTOCOL_TYPE or not protocols:
        raise GroupError(INCONSISTENT_GROUP_PROTOCOL, "The group does not support the classic "
                         f"protocol type {protocol_type} or its protocols.")
    if unknown and instance_id is None and require_known_member_id:
        return Change(after=group, result=(MEMBER_ID_REQUIRED, member_id, -1, ""))
    try:
        subscription = read_subscription(protocols[0][1])
    except RecordFormatError:
        raise GroupError(INCONSISTENT_GROUP_PROTOCOL,
                         "Malformed embedded consumer protocol.") from None
    before = group
    replaced: ConsumerMember | None = None
    if instance_id is None:
        # The id handed out with MEMBER_ID_REQUIRED, or one of an earlier generation: a
        # classic member joining with any id is created (Kafka's createIfNotExists).
        member = group.members.get(member_id) or ConsumerMember(member_id=member_id)
    else:
        existing = group.static_member(instance_id)
        if existing is None:
            member = group.members.get(member_id) or ConsumerMember(member_id=member_id)
        elif unknown:
            member = replace(existing, member_id=member_id, member_epoch=0,
                             previous_member_epoch=0, assignment_epochs={})
            group = replace_member(group, existing, member)
            replaced = existing
        else:
            member = _classic_member(group, member_id, instance_id)
    previous = group.members.get(member_id)
    updated = replace(
        member, instance_id=instance_id, rack_id=subscription.rack_id or member.rack_id,
        rebalance_timeout_ms=rebalance_timeout_ms, server_assignor=None,
        subscribed_topic_names=subscription.topics, subscribed_topic_regex=None,
        client_id=client_id, client_host=client_host,
        classic=ClassicMember(session_timeout_ms=session_timeout_ms, protocols=tuple(protocols)))
    bump = previous is None or previous.subscribed_topic_names != updated.subscribed_topic_names \
        or previous.subscribed_topic_regex is not None
    group = replace(group, members={**group.members, member_id: updated})
    group = resolve_regexes(group, image, now)
    group = update_epoch(before, group, image, bump or group.regexes != before.regexes)
    if group.epoch > group.assignment_epoch:
        group = compute_target(group, config)
    owned = topic_ids(dict(subscription.owned or {}), image)
    reconciled = reconcile_member(group, updated, owned)
    group = replace(group, members={**group.members, member_id: reconciled})
    result = (0, member_id, reconciled.member_epoch,
              updated.classic.protocol_name if updated.classic else "")
    if replaced is not None and not replaced.uses_classic_protocol and \
            before.all_classic_except(replaced.member_id) and config.downgrades and \
            len(before.members) <= config.classic_max_size:
        # Kafka's validateOnlineDowngradeWithReplacedMemberId: every member speaks the
        # classic protocol now.
        return Change(after=None, result=result, timers=Timers(disarm=(replaced.member_id,)),
                      classic_after=convert_to_classic(group, "", now=now, image=image,
                                                       classic_config=classic_config))
    return Change(after=group, result=result,
                  timers=Timers(sessions={member_id: session_timeout_ms}))


def _check_protocol(member: ConsumerMember, protocol_type: str | None,
                    protocol_name: str | None) -> None:
    name = member.classic.protocol_name if member.classic else ""
    if protocol_type is not None and protocol_type != CONSUMER_PROTOCOL_TYPE or \
            protocol_name is not None and protocol_name != name:
        raise GroupError(INCONSISTENT_GROUP_PROTOCOL, "The protocol does not match the one "
                         "returned in the join response.")


def classic_sync(group: ConsumerGroup, *, member_id: str, instance_id: str | None,
                 generation: int, protocol_type: str | None, protocol_name: str | None,
                 image: TopicImage) -> tuple[bytes, str]:
    """Kafka's ``classicGroupSyncToConsumerGroup``: (assignment, protocol name). Raises
    GroupError."""
    member = _classic_member(group, member_id, instance_id)
    if member.classic is None:
        raise GroupError(UNKNOWN_MEMBER_ID, f"Member {member_id} does not use the classic "
                         "protocol.")
    if generation != member.member_epoch:
        raise GroupError(ILLEGAL_GENERATION, f"The generation id {generation} is not equal "
                         f"to the member epoch {member.member_epoch}.")
    _check_protocol(member, protocol_type, protocol_name)
    if group.epoch > member.member_epoch and \
            member.state is not MemberState.UNREVOKED_PARTITIONS:
        raise GroupError(REBALANCE_IN_PROGRESS, "A new rebalance is triggered.")
    protocols = member.classic.protocols
    version = subscription_version(protocols[0][1]) if protocols else 0
    return (write_assignment(topic_names(member.assigned, image), version),
            member.classic.protocol_name)


def classic_heartbeat(group: ConsumerGroup, *, member_id: str, instance_id: str | None,
                      generation: int) -> int:
    """Kafka's ``classicGroupHeartbeatToConsumerGroup``: the error to answer. Raises
    GroupError."""
    member = _classic_member(group, member_id, instance_id)
    if member.classic is None:
        raise GroupError(UNKNOWN_MEMBER_ID, f"Member {member_id} does not use the classic "
                         "protocol.")
    if generation != member.member_epoch:
        raise GroupError(ILLEGAL_GENERATION, f"The generation id {generation} is not equal "
                         f"to the member epoch {member.member_epoch}.")
    if member.member_epoch < group.epoch or \
            member.state is MemberState.UNREVOKED_PARTITIONS or (
                member.state is MemberState.UNRELEASED_PARTITIONS
                and not group.waiting_on_unreleased_partition(member)):
        return REBALANCE_IN_PROGRESS
    return 0


def classic_leave(group: ConsumerGroup, members: Sequence[tuple[str, str | None]],
                  config: ConsumerGroupConfig, **context: object) -> tuple[Change, list[int]]:
    """Kafka's ``classicGroupLeaveToConsumerGroup``: fence each leaving member; one error
    per (member id, instance id)."""
    errors: list[int] = []
    change = Change(after=group)
    gone: list[str] = []
    for member_id, instance_id in members:
        current = change.after
        if current is None:
            errors.append(UNKNOWN_MEMBER_ID)
            continue
        try:
            if instance_id is None:
                member = _classic_member(current, member_id, None)
            else:
                member = current.static_member(instance_id)
                if member is None:
                    raise GroupError(UNKNOWN_MEMBER_ID, "unknown instance id")
                if member_id and member.member_id != member_id:
                    raise GroupError(FENCED_INSTANCE_ID, "fenced")
        except GroupError as exc:
            errors.append(exc.code)
            continue
        change = fence(current, member.member_id, config, **context)  # type: ignore[arg-type]
        gone.append(member.member_id)
        errors.append(0)
    return replace(change, timers=Timers(disarm=tuple(gone))), errors
