"""The classic group protocol (Kafka's ``KafkaApis`` handlers of FindCoordinator, JoinGroup,
SyncGroup, Heartbeat, LeaveGroup, ListGroups, DescribeGroups and DeleteGroups), over the
:class:`~..groups.coordinator.GroupCoordinator`, on the generated messages of
``kbroker.kafka.v1``.

    FindCoordinator Request => key key_type [coordinator_keys]          (keys batched from v4)
    FindCoordinator Response => error_code error_message node_id host port
                                [coordinators => key node_id host port error_code error_message]
    JoinGroup Request => group_id session_timeout_ms rebalance_timeout_ms member_id
                         group_instance_id protocol_type [protocols => name metadata] reason
    JoinGroup Response => error_code generation_id protocol_type protocol_name leader
                          skip_assignment member_id [members => member_id group_instance_id
                          metadata]
    SyncGroup Request => group_id generation_id member_id group_instance_id protocol_type
                         protocol_name [assignments => member_id assignment]
    SyncGroup Response => error_code protocol_type protocol_name assignment
    Heartbeat Request => group_id generation_id member_id group_instance_id
    Heartbeat Response => error_code
    LeaveGroup Request => group_id member_id [members => member_id group_instance_id reason]
    LeaveGroup Response => error_code [members => member_id group_instance_id error_code]
    ListGroups Request => [states_filter] [types_filter]
    ListGroups Response => error_code [groups => group_id protocol_type group_state group_type]
    DescribeGroups Request => [groups] include_authorized_operations
    DescribeGroups Response => [groups => error_code error_message group_id group_state
                                protocol_type protocol_data [members] authorized_operations]
    DeleteGroups Request => [groups_names]
    DeleteGroups Response => [results => group_id error_code]

Versions matter where the request's shape or Kafka's behaviour changes with them (the
client's version is ``context.api_version``; unknown counts as the newest, or, for the shape,
as whichever spelling the request uses): FindCoordinator before v4 names one ``key`` and is
answered at the top level (the answer carries both forms; the frontend encodes the client's);
JoinGroup v0 has no rebalance timeout (the session timeout stands in) and from v4 hands a new
member its id with MEMBER_ID_REQUIRED first; LeaveGroup before v3 names one ``member_id`` and
answers its error at the top level; DescribeGroups v6+ reports a group that does not exist as
GROUP_ID_NOT_FOUND (KIP-1043), earlier versions as Dead without an error. FindCoordinator
also finds the coordinators of transactional ids (key type 1: the leader of the id's
``__transaction_state`` partition, the topic created on first need); other key types are
INVALID_REQUEST. A group whose partition cannot be served answers
COORDINATOR_NOT_AVAILABLE (or NOT_COORDINATOR when its leader moved), which sends clients back
to FindCoordinator.

Authorization (Kafka's): FindCoordinator needs DESCRIBE on the group or transactional id
(GROUP_AUTHORIZATION_FAILED, TRANSACTIONAL_ID_AUTHORIZATION_FAILED per key); JoinGroup,
SyncGroup, Heartbeat and LeaveGroup READ on the group; DescribeGroups DESCRIBE on each group,
DeleteGroups DELETE on each (GROUP_AUTHORIZATION_FAILED); ListGroups lists every group to a
principal that may DESCRIBE the cluster, else only the groups it may DESCRIBE.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from kbroker.kafka.v1 import kafka_pb2 as k
from services.common.acls import Operation, ResourceType
from services.common.errors import ErrorCode

from ..coordinator.placement import CoordinatorError, Placement
from ..groups.consumer_group import ConsumerGroup
from ..groups.coordinator import GroupCoordinator
from ..groups.group import (
    COORDINATOR_NOT_AVAILABLE,
    GROUP_ID_NOT_FOUND,
    INVALID_GROUP_ID,
    GroupState,
    JoinRequest,
)
from ..request_context import RequestContext, broker_port
from .cluster import AUTHORIZED_OPERATIONS_OMITTED, authorized

GROUP_KEY_TYPE = 0
TRANSACTION_KEY_TYPE = 1
CLASSIC_GROUP_TYPE = "classic"
CONSUMER_GROUP_TYPE = "consumer"

INVALID_REQUEST = ErrorCode.invalid_request.value

T = TypeVar("T")

Coordinator = k.FindCoordinatorResponse.Coordinator
LeftMember = k.LeaveGroupResponse.MemberResponse
DescribedGroup = k.DescribeGroupsResponse.DescribedGroup


def newer_shape(context: RequestContext, since: int, present: bool) -> bool:
    """Whether a request uses the shape its API took in version ``since``: by the client's
    version, or, when that is unknown, by whether the newer field is ``present``."""
    return present if context.api_version is None else context.api_version >= since


def optional(message: Any, name: str) -> Any:
    """A field where null means something (an instance id, a protocol to check): its value,
    or None when unset."""
    return getattr(message, name) if message.HasField(name) else None


class GroupApi:
    """An API served by the group coordinator, with its coordinator check."""

    def __init__(self, coordinator: GroupCoordinator) -> None:
        self._coordinator = coordinator

    async def _not_coordinator(self, group_id: str, context: RequestContext) -> int:
        return await self._coordinator.placement.not_coordinator(group_id, context.broker_id)

    async def _serve(self, group_id: str, context: RequestContext,
                     operation: Callable[[], Awaitable[T]]) -> tuple[int, T | None]:
        """(0, what ``operation()`` gives) if this broker coordinates ``group_id`` and the
        operation can be done; else (the error to answer, None): NOT_COORDINATOR, or the
        reason the group's partition cannot be served now."""
        code = await self._not_coordinator(group_id, context)
        if code:
            return code, None
        try:
            return 0, await operation()
        except CoordinatorError as exc:
            return exc.code, None


# --- FindCoordinator ---------------------------------------------------------------------------

# What a coordinator key names, by key type (DESCRIBE on it finds its coordinator).
_KEY_RESOURCES = {GROUP_KEY_TYPE: ResourceType.GROUP,
                  TRANSACTION_KEY_TYPE: ResourceType.TRANSACTIONAL_ID}


class FindCoordinatorApi(GroupApi):
    def __init__(self, coordinator: GroupCoordinator,
                 transactions: Placement | None = None) -> None:
        super().__init__(coordinator)
        self._placements = {GROUP_KEY_TYPE: coordinator.placement}
        if transactions is not None:
            self._placements[TRANSACTION_KEY_TYPE] = transactions

    async def handle(self, request: k.FindCoordinatorRequest,
                     context: RequestContext) -> k.FindCoordinatorResponse:
        batched = newer_shape(context, 4, bool(request.coordinator_keys))
        response = k.FindCoordinatorResponse()
        placement = self._placements.get(request.key_type)
        resource = _KEY_RESOURCES.get(request.key_type)
        for key in request.coordinator_keys if batched else [request.key]:
            denied = context.access.check(Operation.DESCRIBE, resource, key) if resource else 0
            if denied:
                code, node_id = denied, -1
            elif placement is None:
                code, node_id = (COORDINATOR_NOT_AVAILABLE if request.key_type ==
                                 TRANSACTION_KEY_TYPE else INVALID_REQUEST), -1
            else:
                code, node_id = await placement.find(key)
            if code:
                response.coordinators.add(key=key, node_id=-1, host="", port=-1, error_code=code,
                                          error_message=ErrorCode(code).name.upper())
            else:
                response.coordinators.add(key=key, node_id=node_id, host=context.advertised_host,
                                          port=broker_port(context, node_id), error_code=0)
        # Before v4 the one key is answered at the top level.
        first = response.coordinators[0] if response.coordinators else Coordinator(
            node_id=-1, host="", port=-1, error_code=0)
        for name in ("error_code", "node_id", "host", "port", "error_message"):
            if first.HasField(name):
                setattr(response, name, getattr(first, name))
        return response


# --- JoinGroup, SyncGroup, Heartbeat, LeaveGroup -----------------------------------------------


class JoinGroupApi(GroupApi):
    async def handle(self, request: k.JoinGroupRequest,
                     context: RequestContext) -> k.JoinGroupResponse:
        version = context.api_version
        # Version 0 has no rebalance timeout: it is the session timeout (Kafka).
        rebalance_timeout = request.rebalance_timeout_ms
        if rebalance_timeout < 0 or version == 0:
            rebalance_timeout = request.session_timeout_ms
        denied = context.access.check(Operation.READ, ResourceType.GROUP, request.group_id)
        if denied:
            return k.JoinGroupResponse(error_code=denied, member_id=request.member_id)
        join = JoinRequest(
            member_id=request.member_id,
            group_instance_id=optional(request, "group_instance_id"),
            client_id=context.client_id,
            client_host=f"/{context.client_host}" if context.client_host else "",
            session_timeout_ms=request.session_timeout_ms,
            rebalance_timeout_ms=rebalance_timeout,
            protocol_type=request.protocol_type,
            protocols=tuple((p.name, p.metadata) for p in request.protocols),
            require_known_member_id=version is None or version >= 4,
        )
        code, answer = await self._serve(
            request.group_id, context,
            lambda: self._coordinator.membership.join(request.group_id, join))
        return k.JoinGroupResponse(error_code=code, member_id=request.member_id) if code \
            else answer


class SyncGroupApi(GroupApi):
    async def handle(self, request: k.SyncGroupRequest,
                     context: RequestContext) -> k.SyncGroupResponse:
        denied = context.access.check(Operation.READ, ResourceType.GROUP, request.group_id)
        if denied:
            return k.SyncGroupResponse(error_code=denied, assignment=b"")
        code, answer = await self._serve(request.group_id, context, lambda: (
            self._coordinator.membership.sync(
                request.group_id, request.member_id, optional(request, "group_instance_id"),
                request.generation_id, optional(request, "protocol_type"),
                optional(request, "protocol_name"),
                {a.member_id: a.assignment for a in request.assignments})))
        return k.SyncGroupResponse(error_code=code, assignment=b"") if code else answer


class HeartbeatApi(GroupApi):
    async def handle(self, request: k.HeartbeatRequest,
                     context: RequestContext) -> k.HeartbeatResponse:
        denied = context.access.check(Operation.READ, ResourceType.GROUP, request.group_id)
        if denied:
            return k.HeartbeatResponse(error_code=denied)
        code, error = await self._serve(request.group_id, context, lambda: (
            self._coordinator.membership.heartbeat(
                request.group_id, request.member_id, optional(request, "group_instance_id"),
                request.generation_id)))
        return k.HeartbeatResponse(error_code=code or error)


class LeaveGroupApi(GroupApi):
    async def handle(self, request: k.LeaveGroupRequest,
                     context: RequestContext) -> k.LeaveGroupResponse:
        # Before v3 one member, named at the top level; its error is the response's error.
        single = not newer_shape(context, 3, bool(request.members))
        members = [k.LeaveGroupRequest.MemberIdentity(member_id=request.member_id)] if single \
            else request.members
        denied = context.access.check(Operation.READ, ResourceType.GROUP, request.group_id)
        if denied:
            return k.LeaveGroupResponse(error_code=denied)
        if not request.group_id:
            return k.LeaveGroupResponse(error_code=INVALID_GROUP_ID)
        code, errors = await self._serve(request.group_id, context, lambda: (
            self._coordinator.membership.leave(
                request.group_id,
                [(m.member_id, optional(m, "group_instance_id")) for m in members])))
        if errors is None:
            return k.LeaveGroupResponse(error_code=code)
        if single:
            return k.LeaveGroupResponse(error_code=errors[0])
        return k.LeaveGroupResponse(error_code=0, members=[
            LeftMember(member_id=m.member_id, group_instance_id=optional(m, "group_instance_id"),
                       error_code=error) for m, error in zip(members, errors, strict=True)])


# --- ListGroups, DescribeGroups, DeleteGroups --------------------------------------------------


class ListGroupsApi(GroupApi):
    async def handle(self, request: k.ListGroupsRequest,
                     context: RequestContext) -> k.ListGroupsResponse:
        """The groups this broker coordinates (each broker of a cluster lists its own, and
        admin clients ask them all)."""
        types = {t.lower() for t in request.types_filter}
        names = {name.lower() for name in request.states_filter}
        try:
            listings = await self._coordinator.list_groups(context.broker_id)
        except CoordinatorError as exc:
            return k.ListGroupsResponse(error_code=exc.code)
        access = context.access
        every = access.allows(Operation.DESCRIBE, ResourceType.CLUSTER)
        groups = []
        for g in listings:
            if isinstance(g, ConsumerGroup):
                kind, protocol_type, state = CONSUMER_GROUP_TYPE, "consumer", g.state.value
            else:
                kind, protocol_type = CLASSIC_GROUP_TYPE, g.protocol_type or ""
                state = g.state.kafka_name
            if types and kind not in types or names and state.lower() not in names:
                continue
            if every or access.allows(Operation.DESCRIBE, ResourceType.GROUP, g.group_id):
                groups.append(k.ListGroupsResponse.ListedGroup(
                    group_id=g.group_id, protocol_type=protocol_type, group_state=state,
                    group_type=kind))
        return k.ListGroupsResponse(error_code=0, groups=groups)


class DescribeGroupsApi(GroupApi):
    """Kafka's group summary: protocol, member metadata and assignments only once Stable; a
    group that does not exist is reported Dead, without an error before v6 and with
    GROUP_ID_NOT_FOUND from v6 on (an unknown version counts as the newest)."""

    async def handle(self, request: k.DescribeGroupsRequest,
                     context: RequestContext) -> k.DescribeGroupsResponse:
        not_found_is_an_error = newer_shape(context, 6, True)
        response = k.DescribeGroupsResponse()
        for group_id in request.groups:
            denied = context.access.check(Operation.DESCRIBE, ResourceType.GROUP, group_id)
            if denied:
                response.groups.append(_described(group_id, error_code=denied))
                continue
            operations = authorized(request.include_authorized_operations, context.access,
                                    ResourceType.GROUP, group_id)
            code, group = await self._serve(group_id, context,
                                            functools.partial(self._coordinator.describe, group_id))
            if code:
                response.groups.append(_described(group_id, error_code=code))
            elif isinstance(group, ConsumerGroup) and not_found_is_an_error:
                response.groups.append(_described(
                    group_id, error_code=GROUP_ID_NOT_FOUND,
                    error_message=f"Group {group_id} is not a classic group."))
            elif isinstance(group, ConsumerGroup):
                response.groups.append(_described(group_id))
            elif group is None and not_found_is_an_error:
                # Authorized operations come with groups answered without an error only.
                response.groups.append(_described(
                    group_id, error_code=GROUP_ID_NOT_FOUND,
                    error_message=f"Group {group_id} not found."))
            elif group is None:
                response.groups.append(_described(group_id, authorized_operations=operations))
            else:
                stable = group.state is GroupState.STABLE
                response.groups.append(_described(
                    group_id, group_state=group.state.kafka_name,
                    protocol_type=group.protocol_type or "",
                    protocol_data=(group.protocol_name or "") if stable else "",
                    authorized_operations=operations, members=[
                        k.DescribeGroupsResponse.DescribedGroupMember(
                            member_id=m.member_id, group_instance_id=m.group_instance_id,
                            client_id=m.client_id, client_host=m.client_host,
                            member_metadata=m.metadata(group.protocol_name) if stable else b"",
                            member_assignment=m.assignment if stable else b"")
                        for m in group.members.values()]))
        return response


def _described(group_id: str, **fields: Any) -> DescribedGroup:
    return DescribedGroup(**{"group_id": group_id, "error_code": 0,
                             "group_state": GroupState.DEAD.kafka_name, "protocol_type": "",
                             "protocol_data": "",
                             "authorized_operations": AUTHORIZED_OPERATIONS_OMITTED, **fields})


class DeleteGroupsApi(GroupApi):
    async def handle(self, request: k.DeleteGroupsRequest,
                     context: RequestContext) -> k.DeleteGroupsResponse:
        response = k.DeleteGroupsResponse()
        for group_id in dict.fromkeys(request.groups_names):
            denied = context.access.check(Operation.DELETE, ResourceType.GROUP, group_id)
            if denied:
                response.results.add(group_id=group_id, error_code=denied)
                continue
            code, error = await self._serve(
                group_id, context, functools.partial(self._coordinator.delete_group, group_id))
            response.results.add(group_id=group_id, error_code=code or error)
        return response
