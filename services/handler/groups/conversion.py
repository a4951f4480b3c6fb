"""Online migration between the classic and the consumer group protocol (Kafka 4's KIP-848
migration), as pure functions of the groups:

Upgrade (``convertToConsumerGroup``): each classic member becomes a consumer group member at
the classic generation, Stable, holding the partitions of its last assignment, subscribed to
the topics of its subscription, keeping its session timeout and protocols; the group and
target epochs are the generation. Allowed only for a group of the ``consumer`` protocol type
whose size fits ``group.consumer.max.size``; a group still before its first generation has no
protocol chosen yet, and each member's subscription is then its first protocol's.

Downgrade (``convertToClassicGroup``): the remaining members become classic members (their
protocols, their current assignment as a ConsumerProtocolAssignment), the group a classic
group at generation = group epoch, the first member its leader, and a rebalance starts.

``group.consumer.migration.policy`` says which directions are allowed (Kafka 4's default:
both).
"""

from __future__ import annotations

from services.common.errors import ErrorCode

from ..coordinator.schema import RecordFormatError
from .consumer_config import ConsumerGroupConfig, GroupError, TopicImage
from .consumer_group import ClassicMember, ConsumerGroup, ConsumerMember, MemberState, freeze
from .consumer_protocol import (
    read_assignment,
    read_subscription,
    subscription_version,
    write_assignment,
)
from .group import Group, GroupConfig, GroupState, Member

CONSUMER_PROTOCOL_TYPE = "consumer"
GROUP_ID_NOT_FOUND = ErrorCode.group_id_not_found.value


def classic_is_empty(classic: Group) -> bool:
    return not classic.members


def can_upgrade(classic: Group, config: ConsumerGroupConfig) -> bool:
    """Kafka's ``validateOnlineUpgrade``."""
    return (config.upgrades and classic.protocol_type == CONSUMER_PROTOCOL_TYPE
            and len(classic.members) <= config.max_size)


def topic_ids(partitions: dict[str, frozenset[int]], image: TopicImage,
              ) -> dict[str, frozenset[int]]:
    """Partitions by topic name, by topic id instead (topics the image lacks left out)."""
    return freeze({image.topics[name].topic_id: ps for name, ps in partitions.items()
                   if name in image.topics})


def topic_names(partitions: dict[str, frozenset[int]] | object, image: TopicImage,
                ) -> dict[str, frozenset[int]]:
    """Partitions by topic id, by topic name instead (topics the image lacks left out)."""
    by_id = image.names_by_id()
    return {by_id[t]: ps for t, ps in partitions.items()  # type: ignore[attr-defined]
            if t in by_id}


def convert_from_classic(classic: Group, image: TopicImage) -> ConsumerGroup:
    """Kafka's ``ConsumerGroup.fromClassicGroup``. Raises GroupError (GROUP_ID_NOT_FOUND)
    when a member's embedded protocol cannot be read."""
    members: dict[str, ConsumerMember] = {}
    target: dict[str, dict[str, frozenset[int]]] = {}
    for m in classic.members.values():
        try:
            # Before its first generation a group has no protocol yet: the member's first.
            metadata = m.metadata(classic.protocol_name) if classic.protocol_name else (
                m.protocols[0][1] if m.protocols else b"")
            subscription = read_subscription(metadata)
            assigned = topic_ids(read_assignment(m.assignment), image)
        except RecordFormatError:
            raise GroupError(GROUP_ID_NOT_FOUND, f"Cannot upgrade the classic group "
                             f"{classic.group_id} to consumer group because the embedded "
                             "consumer protocol is malformed.") from None
        members[m.member_id] = ConsumerMember(
            member_id=m.member_id, instance_id=m.group_instance_id, rack_id=subscription.rack_id,
            client_id=m.client_id, client_host=m.client_host,
            subscribed_topic_names=subscription.topics,
            rebalance_timeout_ms=m.rebalance_timeout_ms,
            classic=ClassicMember(session_timeout_ms=m.session_timeout_ms,
                                  protocols=m.protocols),
            member_epoch=classic.generation, previous_member_epoch=classic.generation,
            state=MemberState.STABLE, assigned=assigned)
        target[m.member_id] = assigned
    metadata = {name: image.topics[name] for m in members.values()
                for name in m.subscribed_topic_names if name in image.topics}
    return ConsumerGroup(group_id=classic.group_id, epoch=classic.generation,
                         assignment_epoch=classic.generation, members=members, target=target,
                         subscription_metadata=dict(sorted(metadata.items())))


def can_downgrade(group: ConsumerGroup, leaving: str, config: ConsumerGroupConfig) -> bool:
    """Kafka's ``validateOnlineDowngradeWithFencedMember``."""
    return (group.all_classic_except(leaving) and len(group.members) > 1
            and config.downgrades and len(group.members) - 1 <= config.classic_max_size)


def convert_to_classic(group: ConsumerGroup, leaving: str, *, now: int = -1,
                       image: TopicImage | None = None,
                       classic_config: GroupConfig | None = None) -> Group:
    """Kafka's ``ClassicGroup.fromConsumerGroup`` and the rebalance that follows it: a
    classic group at generation = group epoch with the other members, preparing a
    rebalance."""
    image = image or TopicImage()
    classic = Group(group_id=group.group_id, state=GroupState.STABLE, generation=group.epoch,
                    protocol_type=CONSUMER_PROTOCOL_TYPE, state_timestamp_ms=now)
    for m in group.members.values():
        if m.member_id == leaving or m.classic is None:
            continue
        protocols = m.classic.protocols
        version = subscription_version(protocols[0][1]) if protocols else 0
        member = Member(
            member_id=m.member_id, group_instance_id=m.instance_id, client_id=m.client_id,
            client_host=m.client_host, rebalance_timeout_ms=max(m.rebalance_timeout_ms, 0),
            session_timeout_ms=m.classic.session_timeout_ms,
            protocol_type=CONSUMER_PROTOCOL_TYPE, protocols=protocols,
            assignment=write_assignment(topic_names(m.assigned, image), version))
        classic.members[member.member_id] = member
        if classic.leader_id is None:
            classic.leader_id = member.member_id
    classic.protocol_name = classic.select_protocol()
    classic.prepare_rebalance(now, classic_config or GroupConfig())
    return classic
