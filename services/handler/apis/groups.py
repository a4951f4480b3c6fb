"""The classic group protocol (Kafka's ``KafkaApis`` handlers of FindCoordinator, JoinGroup,
SyncGroup, Heartbeat, LeaveGroup, ListGroups, DescribeGroups and DeleteGroups), over the
:class:`~..groups.coordinator.GroupCoordinator`.

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

Versions matter where Kafka's behaviour changes with them: JoinGroup v4+ hands a new member its
id with MEMBER_ID_REQUIRED first (an unknown version counts as the newest); LeaveGroup before v3
names one member and answers its error at the top level; DescribeGroups v6+ reports a group
that does not exist as GROUP_ID_NOT_FOUND (KIP-1043), earlier versions as Dead without an
error. Coordinator keys of transactions are
COORDINATOR_NOT_AVAILABLE (there is no transaction coordinator), other key types
INVALID_REQUEST. A group whose partition cannot be served answers COORDINATOR_NOT_AVAILABLE (or
NOT_COORDINATOR when its leader moved), which sends clients back to FindCoordinator.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from services.common.errors import ErrorCode

from ..groups.coordinator import CoordinatorError, GroupCoordinator
from ..groups.group import STATES_BY_NAME, GroupState, JoinRequest, JoinResult
from ..metadata_cache import MetadataCache, MetadataUnavailableError
from ..request_context import RequestContext, broker_port
from . import group_offsets
from .cluster import AUTHORIZED_OPERATIONS_OMITTED, AclOperation, operations_bitfield

log = logging.getLogger(__name__)

GROUP_KEY_TYPE = 0
TRANSACTION_KEY_TYPE = 1
GROUP_OPERATIONS = operations_bitfield(AclOperation.READ, AclOperation.DESCRIBE,
                                       AclOperation.DELETE)
CLASSIC_GROUP_TYPE = "classic"

COORDINATOR_NOT_AVAILABLE = ErrorCode.coordinator_not_available.value
INVALID_REQUEST = ErrorCode.invalid_request.value
GROUP_ID_NOT_FOUND = ErrorCode.group_id_not_found.value


def _error_message(code: int) -> str | None:
    return None if code == 0 else ErrorCode(code).name.upper()


# --- FindCoordinator ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class FindCoordinatorRequest:
    key_type: int = GROUP_KEY_TYPE
    # One key (v0-3) or many (v4+).
    keys: Sequence[str] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Coordinator:
    key: str
    error_code: int = 0
    error_message: str | None = None
    node_id: int = -1
    host: str = ""
    port: int = -1


@dataclass(frozen=True, slots=True, kw_only=True)
class FindCoordinatorResponse:
    coordinators: Sequence[Coordinator] = ()


def find_coordinator_error(request: FindCoordinatorRequest, code: int) -> FindCoordinatorResponse:
    return FindCoordinatorResponse(coordinators=[
        Coordinator(key=key, error_code=code, error_message=_error_message(code))
        for key in request.keys])


class FindCoordinatorApi:
    def __init__(self, cache: MetadataCache, coordinator: GroupCoordinator) -> None:
        self._cache = cache
        self._coordinator = coordinator

    async def handle(self, request: FindCoordinatorRequest,
                     context: RequestContext) -> FindCoordinatorResponse:
        answers = []
        for key in request.keys:
            if request.key_type == TRANSACTION_KEY_TYPE:
                code, node_id = COORDINATOR_NOT_AVAILABLE, -1
            elif request.key_type != GROUP_KEY_TYPE:
                code, node_id = INVALID_REQUEST, -1
            else:
                code, node_id = await self._coordinator.find_coordinator(key)
            answers.append(await self._answer(key, code, node_id, context))
        return FindCoordinatorResponse(coordinators=answers)

    async def _answer(self, key: str, code: int, node_id: int,
                      context: RequestContext) -> Coordinator:
        if code:
            return Coordinator(key=key, error_code=code, error_message=_error_message(code))
        try:
            metadata = await self._cache.current()
        except MetadataUnavailableError:
            return Coordinator(key=key, error_code=COORDINATOR_NOT_AVAILABLE,
                               error_message=_error_message(COORDINATOR_NOT_AVAILABLE))
        if metadata.live_node(node_id) is None:
            return Coordinator(key=key, error_code=COORDINATOR_NOT_AVAILABLE,
                               error_message=_error_message(COORDINATOR_NOT_AVAILABLE))
        return Coordinator(key=key, node_id=node_id, host=context.advertised_host,
                           port=broker_port(context, node_id))


# --- JoinGroup ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class JoinGroupRequest:
    group_id: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    member_id: str = ""
    group_instance_id: str | None = None
    protocol_type: str = ""
    protocols: Sequence[tuple[str, bytes]] = ()
    reason: str | None = None


def join_group_error(request: JoinGroupRequest, code: int) -> JoinResult:
    return JoinResult(error=code, member_id=request.member_id)


class JoinGroupApi:
    def __init__(self, coordinator: GroupCoordinator) -> None:
        self._coordinator = coordinator

    async def handle(self, request: JoinGroupRequest, context: RequestContext) -> JoinResult:
        version = context.api_version
        # Version 0 has no rebalance timeout: it is the session timeout (Kafka).
        rebalance_timeout = request.rebalance_timeout_ms
        if rebalance_timeout < 0 or version == 0:
            rebalance_timeout = request.session_timeout_ms
        join = JoinRequest(
            member_id=request.member_id,
            group_instance_id=request.group_instance_id,
            client_id=context.client_id,
            client_host=f"/{context.client_host}" if context.client_host else "",
            session_timeout_ms=request.session_timeout_ms,
            rebalance_timeout_ms=rebalance_timeout,
            protocol_type=request.protocol_type,
            protocols=tuple((name, bytes(metadata)) for name, metadata in request.protocols),
            require_known_member_id=version is None or version >= 4,
        )
        code = await self._coordinator.not_coordinator(request.group_id, context.broker_id)
        if code:
            return join_group_error(request, code)
        try:
            return await self._coordinator.join(request.group_id, join)
        except CoordinatorError as exc:
            return join_group_error(request, exc.code)


# --- SyncGroup ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class SyncGroupRequest:
    group_id: str
    generation_id: int
    member_id: str
    group_instance_id: str | None = None
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignments: Sequence[tuple[str, bytes]] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class SyncGroupResponse:
    error_code: int = 0
    assignment: bytes = b""
    protocol_type: str | None = None
    protocol_name: str | None = None


def sync_group_error(request: SyncGroupRequest, code: int) -> SyncGroupResponse:
    return SyncGroupResponse(error_code=code)


class SyncGroupApi:
    def __init__(self, coordinator: GroupCoordinator) -> None:
        self._coordinator = coordinator

    async def handle(self, request: SyncGroupRequest,
                     context: RequestContext) -> SyncGroupResponse:
        code = await self._coordinator.not_coordinator(request.group_id, context.broker_id)
        if code:
            return sync_group_error(request, code)
        try:
            result = await self._coordinator.sync(
                request.group_id, request.member_id, request.group_instance_id,
                request.generation_id, request.protocol_type, request.protocol_name,
                dict(request.assignments))
        except CoordinatorError as exc:
            return sync_group_error(request, exc.code)
        return SyncGroupResponse(error_code=result.error, assignment=result.assignment,
                                 protocol_type=result.protocol_type,
                                 protocol_name=result.protocol_name)


# --- Heartbeat ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class HeartbeatRequest:
    group_id: str
    generation_id: int
    member_id: str
    group_instance_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class HeartbeatResponse:
    error_code: int = 0


class HeartbeatApi:
    def __init__(self, coordinator: GroupCoordinator) -> None:
        self._coordinator = coordinator

    async def handle(self, request: HeartbeatRequest,
                     context: RequestContext) -> HeartbeatResponse:
        code = await self._coordinator.not_coordinator(request.group_id, context.broker_id)
        if code:
            return HeartbeatResponse(error_code=code)
        try:
            code = await self._coordinator.heartbeat(
                request.group_id, request.member_id, request.group_instance_id,
                request.generation_id)
        except CoordinatorError as exc:
            code = exc.code
        return HeartbeatResponse(error_code=code)


# --- LeaveGroup --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class LeavingMember:
    member_id: str
    group_instance_id: str | None = None
    reason: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaveGroupRequest:
    group_id: str
    members: Sequence[LeavingMember] = ()
    # v0-2: one member, named at the top level; its error is the response's error.
    single: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class LeftMember:
    member_id: str
    group_instance_id: str | None = None
    error_code: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaveGroupResponse:
    error_code: int = 0
    members: Sequence[LeftMember] = ()


def leave_group_error(request: LeaveGroupRequest, code: int) -> LeaveGroupResponse:
    return LeaveGroupResponse(error_code=code)


class LeaveGroupApi:
    def __init__(self, coordinator: GroupCoordinator) -> None:
        self._coordinator = coordinator

    async def handle(self, request: LeaveGroupRequest,
                     context: RequestContext) -> LeaveGroupResponse:
        if not request.group_id:
            return LeaveGroupResponse(error_code=ErrorCode.invalid_group_id.value)
        code = await self._coordinator.not_coordinator(request.group_id, context.broker_id)
        if code:
            return leave_group_error(request, code)
        try:
            errors = await self._coordinator.leave(
                request.group_id,
                [(m.member_id, m.group_instance_id) for m in request.members])
        except CoordinatorError as exc:
            return leave_group_error(request, exc.code)
        members = [LeftMember(member_id=m.member_id, group_instance_id=m.group_instance_id,
                              error_code=code)
                   for m, code in zip(request.members, errors, strict=True)]
        if request.single:
            return LeaveGroupResponse(error_code=members[0].error_code if members else 0)
        return LeaveGroupResponse(error_code=0, members=members)


# --- ListGroups --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class ListGroupsRequest:
    states_filter: Sequence[str] = ()
    types_filter: Sequence[str] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class ListedGroup:
    group_id: str
    protocol_type: str
    group_state: str
    group_type: str = CLASSIC_GROUP_TYPE


@dataclass(frozen=True, slots=True, kw_only=True)
class ListGroupsResponse:
    error_code: int = 0
    groups: Sequence[ListedGroup] = ()


def list_groups_error(request: ListGroupsRequest, code: int) -> ListGroupsResponse:
    return ListGroupsResponse(error_code=code)


class ListGroupsApi:
    def __init__(self, coordinator: GroupCoordinator) -> None:
        self._coordinator = coordinator

    async def handle(self, request: ListGroupsRequest,
                     context: RequestContext) -> ListGroupsResponse:
        """The groups this broker coordinates (each broker of a cluster lists its own, and
        admin clients ask them all)."""
        types = {t.lower() for t in request.types_filter}
        if types and CLASSIC_GROUP_TYPE not in types:
            return ListGroupsResponse()
        states: set[GroupState] = set()
        for name in request.states_filter:
            state = STATES_BY_NAME.get(name.lower())
            if state is None:
                return ListGroupsResponse()  # no group is in a state Kafka does not know
            states.add(state)
        try:
            listings = await self._coordinator.list_groups(context.broker_id)
        except CoordinatorError as exc:
            return list_groups_error(request, exc.code)
        return ListGroupsResponse(groups=[
            ListedGroup(group_id=g.group_id, protocol_type=g.protocol_type,
                        group_state=g.state.kafka_name)
            for g in listings if not states or g.state in states])


# --- DescribeGroups ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class DescribeGroupsRequest:
    groups: Sequence[str] = ()
    include_authorized_operations: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class DescribedMember:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    member_metadata: bytes = b""
    member_assignment: bytes = b""


@dataclass(frozen=True, slots=True, kw_only=True)
class DescribedGroup:
    group_id: str
    error_code: int = 0
    error_message: str | None = None
    group_state: str = GroupState.DEAD.kafka_name
    protocol_type: str = ""
    protocol_data: str = ""
    members: Sequence[DescribedMember] = ()
    authorized_operations: int = AUTHORIZED_OPERATIONS_OMITTED


@dataclass(frozen=True, slots=True, kw_only=True)
class DescribeGroupsResponse:
    groups: Sequence[DescribedGroup] = field(default_factory=list)


def describe_groups_error(request: DescribeGroupsRequest, code: int) -> DescribeGroupsResponse:
    return DescribeGroupsResponse(groups=[DescribedGroup(group_id=g, error_code=code)
                                          for g in request.groups])


class DescribeGroupsApi:
    """Kafka's group summary: protocol, member metadata and assignments only once Stable; a
    group that does not exist is reported Dead, without an error before v6 and with
    GROUP_ID_NOT_FOUND from v6 on (an unknown version counts as the newest)."""

    def __init__(self, coordinator: GroupCoordinator) -> None:
        self._coordinator = coordinator

    async def handle(self, request: DescribeGroupsRequest,
                     context: RequestContext) -> DescribeGroupsResponse:
        operations = (GROUP_OPERATIONS if request.include_authorized_operations
                      else AUTHORIZED_OPERATIONS_OMITTED)
        not_found_is_an_error = context.api_version is None or context.api_version >= 6
        described = []
        for group_id in request.groups:
            code = await self._coordinator.not_coordinator(group_id, context.broker_id)
            if code:
                described.append(DescribedGroup(group_id=group_id, error_code=code))
                continue
            try:
                group = await self._coordinator.describe(group_id)
            except CoordinatorError as exc:
                described.append(DescribedGroup(group_id=group_id, error_code=exc.code))
                continue
            if group is None:
                if not_found_is_an_error:
                    described.append(DescribedGroup(
                        group_id=group_id, error_code=GROUP_ID_NOT_FOUND,
                        error_message=f"Group {group_id} not found.",
                        authorized_operations=operations))
                else:
                    described.append(DescribedGroup(group_id=group_id,
                                                    authorized_operations=operations))
                continue
            stable = group.state is GroupState.STABLE
            described.append(DescribedGroup(
                group_id=group_id,
                group_state=group.state.kafka_name,
                protocol_type=group.protocol_type or "",
                protocol_data=(group.protocol_name or "") if stable else "",
                members=[DescribedMember(
                    member_id=m.member_id, group_instance_id=m.group_instance_id,
                    client_id=m.client_id, client_host=m.client_host,
                    member_metadata=m.metadata(group.protocol_name) if stable else b"",
                    member_assignment=m.assignment if stable else b"")
                    for m in group.members.values()],
                authorized_operations=operations,
            ))
        return DescribeGroupsResponse(groups=described)


# --- DeleteGroups ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class DeleteGroupsRequest:
    groups: Sequence[str] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class DeleteGroupsResponse:
    # (group id, error code)
    results: Sequence[tuple[str, int]] = ()


def delete_groups_error(request: DeleteGroupsRequest, code: int) -> DeleteGroupsResponse:
    return DeleteGroupsResponse(results=[(g, code) for g in request.groups])


class DeleteGroupsApi:
    def __init__(self, coordinator: GroupCoordinator) -> None:
        self._coordinator = coordinator

    async def handle(self, request: DeleteGroupsRequest,
                     context: RequestContext) -> DeleteGroupsResponse:
        results = []
        for group_id in dict.fromkeys(request.groups):
            code = await self._coordinator.not_coordinator(group_id, context.broker_id)
            try:
                code = code or await self._coordinator.delete_group(group_id)
            except CoordinatorError as exc:
                code = exc.code
            results.append((group_id, code))
        return DeleteGroupsResponse(results=results)


# --- all of them -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupApis:
    """The group and committed-offset APIs, as the servicer is given them."""

    find_coordinator: FindCoordinatorApi
    join_group: JoinGroupApi
    sync_group: SyncGroupApi
    heartbeat: HeartbeatApi
    leave_group: LeaveGroupApi
    list_groups: ListGroupsApi
    describe_groups: DescribeGroupsApi
    delete_groups: DeleteGroupsApi
    offset_commit: group_offsets.OffsetCommitApi
    offset_fetch: group_offsets.OffsetFetchApi
    offset_delete: group_offsets.OffsetDeleteApi

    @classmethod
    def over(cls, cache: MetadataCache, coordinator: GroupCoordinator) -> GroupApis:
        return cls(
            find_coordinator=FindCoordinatorApi(cache, coordinator),
            join_group=JoinGroupApi(coordinator),
            sync_group=SyncGroupApi(coordinator),
            heartbeat=HeartbeatApi(coordinator),
            leave_group=LeaveGroupApi(coordinator),
            list_groups=ListGroupsApi(coordinator),
            describe_groups=DescribeGroupsApi(coordinator),
            delete_groups=DeleteGroupsApi(coordinator),
            offset_commit=group_offsets.OffsetCommitApi(cache, coordinator),
            offset_fetch=group_offsets.OffsetFetchApi(coordinator),
            offset_delete=group_offsets.OffsetDeleteApi(cache, coordinator),
        )
