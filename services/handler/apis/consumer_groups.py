"""The consumer group protocol of KIP-848 (Kafka's ``KafkaApis`` handlers of
ConsumerGroupHeartbeat and ConsumerGroupDescribe), over the
:class:`~..groups.coordinator.GroupCoordinator`, on the generated messages of
``kbroker.kafka.v1``.

    ConsumerGroupHeartbeat Request => group_id member_id member_epoch instance_id rack_id
                                      rebalance_timeout_ms [subscribed_topic_names]
                                      subscribed_topic_regex (v1+) server_assignor
                                      [topic_partitions => topic_id [partitions]]
    ConsumerGroupHeartbeat Response => throttle_time_ms error_code error_message member_id
                                       member_epoch heartbeat_interval_ms
                                       assignment => [topic_partitions => topic_id [partitions]]
    ConsumerGroupDescribe Request => [group_ids] include_authorized_operations
    ConsumerGroupDescribe Response => throttle_time_ms [groups => error_code error_message
                                      group_id group_state group_epoch assignment_epoch
                                      assignor_name [members => member_id instance_id rack_id
                                      member_epoch client_id client_host
                                      [subscribed_topic_names] subscribed_topic_regex
                                      assignment target_assignment member_type (v1+)]
                                      authorized_operations]

ConsumerGroupHeartbeat v0 lets the coordinator pick a joining member's id; from v1 (KIP-1082)
the client sends its own, and may subscribe by regular expression (v0 clients cannot send
one). The semantics are :mod:`..groups.consumer_heartbeat`'s; a partition that cannot be
served answers as the classic APIs do (NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE).
ConsumerGroupDescribe answers GROUP_ID_NOT_FOUND for an id that is no consumer group ("Group
X is not a consumer group." for a classic one, which admin clients then describe with
DescribeGroups); members report their current and target assignments with topic names, and
from v1 whether they speak the classic (0) or the consumer (1) protocol.

Authorization (Kafka's): ConsumerGroupHeartbeat needs READ on the group
(GROUP_AUTHORIZATION_FAILED) and DESCRIBE on the topics it subscribes to by name
(TOPIC_AUTHORIZATION_FAILED); a regular expression matches only the topics the member whose
heartbeat resolves it may DESCRIBE (Kafka 4's ``TopicRegexResolver``).
ConsumerGroupDescribe needs DESCRIBE on each group.
"""

from __future__ import annotations

from kbroker.kafka.v1 import kafka_pb2 as k
from services.common.acls import Operation, ResourceType
from services.common.errors import ErrorCode

from ..coordinator.placement import CoordinatorError
from ..groups.consumer_group import ConsumerGroup, TopicAssignment
from ..groups.consumer_heartbeat import GroupError, HeartbeatRequest
from ..groups.topic_regex import TopicFilter
from ..request_context import RequestContext
from ..topic_identity import canonical_topic_id
from .cluster import AUTHORIZED_OPERATIONS_OMITTED, authorized
from .groups import GroupApi, optional

GROUP_ID_NOT_FOUND = ErrorCode.group_id_not_found.value
TOPIC_AUTHORIZATION_FAILED = ErrorCode.topic_authorization_failed.value
CONSUMER_MEMBER = 1
CLASSIC_MEMBER = 0

HeartbeatAssignment = k.ConsumerGroupHeartbeatResponse.Assignment
DescribedGroup = k.ConsumerGroupDescribeResponse.DescribedGroup
DescribedMember = k.ConsumerGroupDescribeResponse.Member


class ConsumerGroupHeartbeatApi(GroupApi):
    async def handle(self, request: k.ConsumerGroupHeartbeatRequest,
                     context: RequestContext) -> k.ConsumerGroupHeartbeatResponse:
        def error(code: int, message: str = "") -> k.ConsumerGroupHeartbeatResponse:
            return k.ConsumerGroupHeartbeatResponse(
                error_code=code, error_message=message or None, member_epoch=0,
                heartbeat_interval_ms=0)

        denied = context.access.check(Operation.READ, ResourceType.GROUP, request.group_id)
        if denied:
            return error(denied)
        names = None if request.subscribed_topic_names_is_null else tuple(
            request.subscribed_topic_names)
        if names and context.access.denied(Operation.DESCRIBE, ResourceType.TOPIC, names):
            return error(TOPIC_AUTHORIZATION_FAILED)
        owned = None
        if not request.topic_partitions_is_null:
            owned = {}
            for tp in request.topic_partitions:
                topic_id = canonical_topic_id(tp.topic_id) or tp.topic_id
                owned[topic_id] = owned.get(topic_id, frozenset()) | frozenset(tp.partitions)
        beat = HeartbeatRequest(
            group_id=request.group_id, member_id=request.member_id,
            member_epoch=request.member_epoch, instance_id=optional(request, "instance_id"),
            rack_id=optional(request, "rack_id"),
            rebalance_timeout_ms=request.rebalance_timeout_ms, subscribed_topic_names=names,
            subscribed_topic_regex=optional(request, "subscribed_topic_regex"),
            server_assignor=optional(request, "server_assignor"), owned=owned,
            client_id=context.client_id,
            client_host=f"/{context.client_host}" if context.client_host else "",
            api_version=1 if context.api_version is None else context.api_version)
        code = await self._not_coordinator(request.group_id, context) if request.group_id \
            else 0
        if code:
            return error(code)
        try:
            result = await self._coordinator.consumer.heartbeat(beat, _describable(context))
        except GroupError as exc:
            return error(exc.code, exc.message)
        except CoordinatorError as exc:
            return error(exc.code)
        response = k.ConsumerGroupHeartbeatResponse(
            error_code=0, member_id=result.member_id, member_epoch=result.member_epoch,
            heartbeat_interval_ms=result.heartbeat_interval_ms)
        if result.assignment is not None:
            response.assignment.CopyFrom(_heartbeat_assignment(result.assignment))
        return response


def _describable(context: RequestContext) -> TopicFilter:
    """The topics of a regular expression's match the member may DESCRIBE (None: no
    authorizer, all of them)."""
    access = context.access
    if not access.enabled:
        return None
    return lambda names: set(names) - access.denied(Operation.DESCRIBE, ResourceType.TOPIC,
                                                    names)


def _heartbeat_assignment(assignment: TopicAssignment) -> HeartbeatAssignment:
    return HeartbeatAssignment(topic_partitions=[
        k.ConsumerGroupHeartbeatResponse.TopicPartitions(topic_id=t, partitions=sorted(ps))
        for t, ps in sorted(assignment.items())])


class ConsumerGroupDescribeApi(GroupApi):
    async def handle(self, request: k.ConsumerGroupDescribeRequest,
                     context: RequestContext) -> k.ConsumerGroupDescribeResponse:
        response = k.ConsumerGroupDescribeResponse()
        for group_id in request.group_ids:
            denied = context.access.check(Operation.DESCRIBE, ResourceType.GROUP, group_id)
            if denied:
                response.groups.append(_group(group_id, error_code=denied))
                continue
            operations = authorized(request.include_authorized_operations, context.access,
                                    ResourceType.GROUP, group_id)

            async def describe(group_id: str = group_id):  # type: ignore[no-untyped-def]
                state = await self._coordinator.runtime.read(group_id)
                return state.consumer_group(group_id), state.exists(group_id)

            code, found = await self._serve(group_id, context, describe)
            if code:
                response.groups.append(_group(group_id, error_code=code))
                continue
            group, exists = found  # type: ignore[misc]
            if group is None:
                message = f"Group {group_id} is not a consumer group." if exists else \
                    f"Group {group_id} not found."
                response.groups.append(_group(group_id, error_code=GROUP_ID_NOT_FOUND,
                                              error_message=message))
                continue
            names = {t.topic_id: name for name, t in group.subscription_metadata.items()}
            try:
                image = await self._coordinator.consumer.image()
                names = {**image.names_by_id(), **names}
            except CoordinatorError:
                pass
            response.groups.append(_described(group, names, operations,
                                              self._coordinator.consumer_config))
        return response


def _group(group_id: str, **fields: object) -> DescribedGroup:
    return DescribedGroup(**{"group_id": group_id, "error_code": 0, "group_state": "Dead",
                             "group_epoch": -1, "assignment_epoch": -1, "assignor_name": "",
                             "authorized_operations": AUTHORIZED_OPERATIONS_OMITTED, **fields})


def _assignment(assignment: TopicAssignment,
                names: dict[str, str]) -> k.ConsumerGroupDescribeResponse.Assignment:
    return k.ConsumerGroupDescribeResponse.Assignment(topic_partitions=[
        k.ConsumerGroupDescribeResponse.TopicPartitions(
            topic_id=t, topic_name=names.get(t, ""), partitions=sorted(ps))
        for t, ps in sorted(assignment.items()) if ps])


def _described(group: ConsumerGroup, names: dict[str, str], operations: int,
               config: object) -> DescribedGroup:
    default = config.default_assignor  # type: ignore[attr-defined]
    return _group(
        group.group_id, group_state=group.state.value, group_epoch=group.epoch,
        assignment_epoch=group.assignment_epoch,
        assignor_name=group.preferred_assignor(default), authorized_operations=operations,
        members=[DescribedMember(
            member_id=m.member_id, instance_id=m.instance_id, rack_id=m.rack_id,
            member_epoch=m.member_epoch, client_id=m.client_id, client_host=m.client_host,
            subscribed_topic_names=list(m.subscribed_topic_names),
            subscribed_topic_regex=m.subscribed_topic_regex,
            assignment=_assignment(m.assigned, names),
            target_assignment=_assignment(group.target.get(m.member_id, {}), names),
            member_type=CLASSIC_MEMBER if m.uses_classic_protocol else CONSUMER_MEMBER)
            for m in group.members.values()])
