"""A classic consumer group and its state machine (Kafka's ``ClassicGroup`` with the rules of
``GroupMetadataManager`` for JoinGroup, SyncGroup, Heartbeat and LeaveGroup), as pure data and
transitions: no I/O, no clock (every transition is given ``now``, wall-clock milliseconds).

States and transitions (Kafka's ``ClassicGroupState``):

    Empty ──join──> PreparingRebalance ──all joined / deadline──> CompletingRebalance
      ^                 ^     │                                          │ leader's SyncGroup
      │                 │     └──no member left──> Empty                 v
      │                 └──join (leader or changed metadata), leave, expiry── Stable
      └── DeleteGroups removes an Empty group entirely (Dead is only ever reported, for groups
          that do not exist).

Kafka keeps the rebalance in progress in memory (members awaiting join, the DelayedJoin) and
persists only stable points; here the whole :class:`Group` is persisted after every change, so
any handler can continue any group: ``Member.joined`` is Kafka's "awaiting join",
``join_deadline`` the expiry of the DelayedJoin (or InitialDelayedJoin) in progress,
``pending_members`` the member ids handed out with MEMBER_ID_REQUIRED (KIP-394), and
``pending_sync`` with ``sync_deadline`` Kafka's pending-sync members and DelayedSync: when a
join phase ends every member owes a SyncGroup, and those that have not sent one within the
rebalance timeout are removed and the group rebalances (:meth:`Group.expire_pending_sync`).
:meth:`Group.deadline_ms` is the one deadline a group has at a time (join phase or pending
syncs); the coordinator keeps a purgatory timer on it and calls :meth:`Group.on_deadline`
when it passes. Parked
JoinGroup and SyncGroup requests are not part of the state: their waiters re-read the group
and decide (see :mod:`.coordinator`).

A transition mutates the group it is called on; callers work on a :meth:`Group.copy` and
compare it with the original to know whether anything must be written. Errors are returned
as Kafka error codes, never raised.
"""

from __future__ import annotations

import enum
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import ClassVar

from kbroker.kafka.v1 import kafka_pb2 as k
from services.common.errors import ErrorCode

from ..coordinator.schema import RecordFormatError, decode, kafka
from ..coordinator_records import (
    GroupExtension,
    GroupMetadataValue,
    MemberExtension,
    MemberMetadata,
    PendingMember,
    ProtocolMetadata,
)

NONE = 0
COORDINATOR_NOT_AVAILABLE = ErrorCode.coordinator_not_available.value
UNKNOWN_MEMBER_ID = ErrorCode.unknown_member_id.value
ILLEGAL_GENERATION = ErrorCode.illegal_generation.value
INCONSISTENT_GROUP_PROTOCOL = ErrorCode.inconsistent_group_protocol.value
REBALANCE_IN_PROGRESS = ErrorCode.rebalance_in_progress.value
MEMBER_ID_REQUIRED = ErrorCode.member_id_required.value
FENCED_INSTANCE_ID = ErrorCode.fenced_instance_id.value
GROUP_MAX_SIZE_REACHED = ErrorCode.group_max_size_reached.value
INVALID_GROUP_ID = ErrorCode.invalid_group_id.value
GROUP_ID_NOT_FOUND = ErrorCode.group_id_not_found.value
NON_EMPTY_GROUP = ErrorCode.non_empty_group.value

# Kafka's JoinGroupRequest.UNKNOWN_MEMBER_ID.
UNKNOWN_MEMBER = ""

# Answers, as the generated messages (unset fields: Kafka's defaults).
JoinResult = k.JoinGroupResponse
JoinedMember = k.JoinGroupResponse.JoinGroupResponseMember
SyncResult = k.SyncGroupResponse


class GroupState(enum.Enum):
    """Kafka's names, as DescribeGroups and ListGroups report them; values persist."""

    EMPTY = 0
    PREPARING_REBALANCE = 1
    COMPLETING_REBALANCE = 2
    STABLE = 3
    DEAD = 4

    @property
    def kafka_name(self) -> str:
        """``PreparingRebalance`` for PREPARING_REBALANCE."""
        return self.name.title().replace("_", "")


STATES_BY_NAME = {state.kafka_name.lower(): state for state in GroupState}


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupConfig:
    """Kafka's group.* broker settings."""

    initial_rebalance_delay_ms: int = 3000
    min_session_timeout_ms: int = 6000
    max_session_timeout_ms: int = 1_800_000
    max_size: int = 2**31 - 1


@dataclass(slots=True, kw_only=True)
class Member:
    member_id: str
    group_instance_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    rebalance_timeout_ms: int = 0
    session_timeout_ms: int = 0
    protocol_type: str = ""
    # (name, metadata) in the member's order of preference.
    protocols: tuple[tuple[str, bytes], ...] = ()
    assignment: bytes = b""
    # Has sent JoinGroup for the rebalance in progress (Kafka: awaiting join).
    joined: bool = False

    @property
    def is_static(self) -> bool:
        return self.group_instance_id is not None

    def metadata(self, protocol: str | None) -> bytes:
        for name, metadata in self.protocols:
            if name == protocol:
                return metadata
        return b""

    def matches(self, protocols: Sequence[tuple[str, bytes]]) -> bool:
        return tuple(protocols) == self.protocols


@dataclass(frozen=True, slots=True, kw_only=True)
class JoinRequest:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: tuple[tuple[str, bytes], ...]
    # JoinGroup v4+: a new member must first obtain its id (MEMBER_ID_REQUIRED).
    require_known_member_id: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class JoinWait:
    """The member joined a rebalance: answer once the group moves past ``generation``."""

    member_id: str
    generation: int


@dataclass(frozen=True, slots=True, kw_only=True)
class SyncWait:
    """A follower waiting for the leader's assignment of ``generation``."""

    generation: int


class Expiry(enum.Enum):
    """What a lapsed session timer meant for its member."""

    GONE = "gone"  # not a member (any more): nothing to do
    REMOVED = "removed"
    KEEP_ALIVE = "keep_alive"  # awaiting the end of a join phase: re-arm, as Kafka does


@dataclass(slots=True, kw_only=True)
class Group:
    group_id: str
    state: GroupState = GroupState.EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str | None = None
    # In join order (the first member becomes the leader when there is none).
    members: dict[str, Member] = field(default_factory=dict)
    # Member ids handed out with MEMBER_ID_REQUIRED -> when they lapse (ms).
    pending_members: dict[str, int] = field(default_factory=dict)
    state_timestamp_ms: int = -1
    # The end of the join phase in progress (ms), -1 outside PreparingRebalance.
    join_deadline_ms: int = -1
    # >= 0 while the join phase is an initial delay: what the rebalance timeout has left.
    initial_delay_remaining_ms: int = -1
    new_member_added: bool = False
    # Members of the generation that have not sent SyncGroup yet (CompletingRebalance and
    # Stable), and when they are removed for it (ms; -1 when none is pending).
    pending_sync: set[str] = field(default_factory=set)
    sync_deadline_ms: int = -1

    def copy(self) -> Group:
        return replace(self, members={i: replace(m) for i, m in self.members.items()},
                       pending_members=dict(self.pending_members),
                       pending_sync=set(self.pending_sync))

    # -- queries ---------------------------------------------------------------------------

    def static_member_id(self, group_instance_id: str | None) -> str | None:
        if group_instance_id is None:
            return None
        for member in self.members.values():
            if member.group_instance_id == group_instance_id:
                return member.member_id
        return None

    def is_static_member_fenced(self, group_instance_id: str | None, member_id: str) -> bool:
        """Kafka's check: the instance id belongs to a member with another id."""
        existing = self.static_member_id(group_instance_id)
        return existing is not None and existing != member_id

    def validate_member(self, member_id: str, group_instance_id: str | None) -> int:
        """FENCED_INSTANCE_ID, UNKNOWN_MEMBER_ID or NONE (Kafka's ``validateMember``)."""
        if self.is_static_member_fenced(group_instance_id, member_id):
            return FENCED_INSTANCE_ID
        if member_id not in self.members or (
                group_instance_id is not None and self.static_member_id(group_instance_id) is None):
            return UNKNOWN_MEMBER_ID
        return NONE

    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def deadline_ms(self) -> int:
        """When the group must be looked at by time alone (-1: never): the end of the join
        phase in PreparingRebalance, else the deadline of the pending SyncGroups."""
        if self.state is GroupState.PREPARING_REBALANCE:
            return self.join_deadline_ms
        if self.state in (GroupState.COMPLETING_REBALANCE, GroupState.STABLE) and \
                self.pending_sync:
            return self.sync_deadline_ms
        return -1

    def all_members_joined(self) -> bool:
        return all(m.joined for m in self.members.values()) and not self.pending_members

    def candidate_protocols(self) -> set[str]:
        """Protocols every member supports."""
        counts = Counter(name for m in self.members.values() for name, _ in m.protocols)
        return {name for name, count in counts.items() if count == len(self.members)}

    def supports_protocols(self, protocol_type: str,
                           protocols: Sequence[tuple[str, bytes]]) -> bool:
        if not self.members:
            return bool(protocol_type) and bool(protocols)
        candidates = self.candidate_protocols()
        return protocol_type == self.protocol_type and any(n in candidates for n, _ in protocols)

    def select_protocol(self) -> str | None:
        """Each member votes for its most preferred candidate; the most votes win (ties: the
        candidate first preferred by the earliest member)."""
        candidates = self.candidate_protocols()
        votes: Counter[str] = Counter()
        for member in self.members.values():
            for name, _ in member.protocols:
                if name in candidates:
                    votes[name] += 1
                    break
        if not votes:
            return None
        return max(votes, key=lambda name: votes[name])

    def subscribed_topics(self) -> set[str] | None:
        """Topics the members subscribe to, from consumer protocol metadata; None when some
        member's metadata cannot be read (or the group is not a consumer group)."""
        if self.protocol_type != "consumer" or self.protocol_name is None:
            return None
        topics: set[str] = set()
        for member in self.members.values():
            parsed = consumer_subscription_topics(member.metadata(self.protocol_name))
            if parsed is None:
                return None
            topics |= parsed
        return topics

    # -- transitions -----------------------------------------------------------------------

    def _transition(self, state: GroupState, now: int) -> None:
        self.state = state
        self.state_timestamp_ms = now

    def _add(self, member: Member) -> None:
        if not self.members:
            self.protocol_type = member.protocol_type
        self.members[member.member_id] = member
        if self.leader_id is None:
            self.leader_id = member.member_id

    def _remove(self, member_id: str) -> None:
        self.members.pop(member_id, None)
        self._synced(member_id)
        if self.leader_id == member_id:
            self.leader_id = next(iter(self.members), None)

    def _synced(self, member_id: str) -> None:
        """Kafka's ``removePendingSyncMember``: the member owes no SyncGroup any more."""
        self.pending_sync.discard(member_id)
        if not self.pending_sync:
            self.sync_deadline_ms = -1

    def _clear_pending_sync(self) -> None:
        self.pending_sync = set()
        self.sync_deadline_ms = -1

    def maybe_prepare_rebalance(self, now: int, config: GroupConfig) -> None:
        if self.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE, GroupState.EMPTY):
            self.prepare_rebalance(now, config)

    def prepare_rebalance(self, now: int, config: GroupConfig) -> None:
        """Start a join phase: an initial delay for an empty group (Kafka's
        InitialDelayedJoin), else up to the longest rebalance timeout (DelayedJoin). Members
        waiting for an assignment learn of it as REBALANCE_IN_PROGRESS."""
        if self.state is GroupState.COMPLETING_REBALANCE:
            for member in self.members.values():
                member.assignment = b""
        self._clear_pending_sync()
        timeout = self.rebalance_timeout_ms()
        if self.state is GroupState.EMPTY:
            delay = config.initial_rebalance_delay_ms
            self.join_deadline_ms = now + delay
            self.initial_delay_remaining_ms = max(timeout - delay, 0)
        else:
            self.join_deadline_ms = now + timeout
            self.initial_delay_remaining_ms = -1
        self.new_member_added = False
        self._transition(GroupState.PREPARING_REBALANCE, now)

    def maybe_complete_join(self, now: int, config: GroupConfig) -> bool:
        """End the join phase if it may end now; True if the group left PreparingRebalance.

        An initial delay ends only by time, and starts over (within the rebalance timeout)
        while new members keep arriving; any other join phase ends once every member has
        joined, or at its deadline."""
        if self.state is not GroupState.PREPARING_REBALANCE:
            return False
        self._drop_lapsed_pending(now)
        if self.initial_delay_remaining_ms >= 0:
            if now < self.join_deadline_ms:
                return False
            if self.new_member_added and self.initial_delay_remaining_ms > 0:
                delay = min(config.initial_rebalance_delay_ms, self.initial_delay_remaining_ms)
                self.join_deadline_ms = now + delay
                self.initial_delay_remaining_ms = max(self.initial_delay_remaining_ms - delay, 0)
                self.new_member_added = False
                return False
            return self.complete_join(now)
        if self.all_members_joined() or now >= self.join_deadline_ms:
            return self.complete_join(now)
        return False

    def complete_join(self, now: int) -> bool:
        """Kafka's ``onCompleteJoin``: drop dynamic members that did not rejoin, then start
        the next generation (CompletingRebalance, or Empty when nobody is left). If only
        static members that have not rejoined remain, the join phase starts over."""
        for member in [m for m in self.members.values() if not m.joined and not m.is_static]:
            self._remove(member.member_id)
        joined = [m for m in self.members.values() if m.joined]
        if self.members and not joined:
            self.join_deadline_ms = now + self.rebalance_timeout_ms()
            self.initial_delay_remaining_ms = -1
            return False
        if self.leader_id is None or not self.members[self.leader_id].joined:
            self.leader_id = joined[0].member_id if joined else None
        self.generation += 1
        self.join_deadline_ms = -1
        self.initial_delay_remaining_ms = -1
        self.new_member_added = False
        if self.members:
            self.protocol_name = self.select_protocol()
            for member in self.members.values():
                member.joined = False
                member.assignment = b""
            self._transition(GroupState.COMPLETING_REBALANCE, now)
            # Kafka's schedulePendingSync: every member now owes a SyncGroup.
            self.pending_sync = set(self.members)
            self.sync_deadline_ms = now + self.rebalance_timeout_ms()
        else:
            self.protocol_name = None
            self._clear_pending_sync()
            self._transition(GroupState.EMPTY, now)
        return True

    def _drop_lapsed_pending(self, now: int) -> None:
        for member_id in [m for m, expires in self.pending_members.items() if expires <= now]:
            del self.pending_members[member_id]

    def join_answer(self, member_id: str) -> JoinResult:
        """The answer of a member whose join is over (the group is past its join phase): the
        leader also gets every member with its metadata for the selected protocol."""
        return JoinResult(
            error_code=NONE, member_id=member_id, generation_id=self.generation,
            protocol_type=self.protocol_type, protocol_name=self.protocol_name,
            leader=self.leader_id or "", members=[
                JoinedMember(member_id=m.member_id, group_instance_id=m.group_instance_id,
                             metadata=m.metadata(self.protocol_name))
                for m in self.members.values()] if self.leader_id == member_id else [])

    def join(self, request: JoinRequest, now: int, config: GroupConfig,
             new_member_id: Callable[[str], str] | None = None) -> JoinResult | JoinWait:
        """Kafka's ``classicGroupJoin`` once the request is valid (group id and session
        timeout are checked by the caller)."""
        make_id = new_member_id or _new_member_id
        if self.state is GroupState.DEAD:
            return JoinResult(error_code=COORDINATOR_NOT_AVAILABLE, member_id=request.member_id)
        if request.member_id == UNKNOWN_MEMBER:
            return self._join_new_member(request, now, config, make_id)
        return self._join_known_member(request, now, config)

    def _new_member(self, member_id: str, request: JoinRequest) -> Member:
        return Member(
            member_id=member_id, group_instance_id=request.group_instance_id,
            client_id=request.client_id, client_host=request.client_host,
            rebalance_timeout_ms=request.rebalance_timeout_ms,
            session_timeout_ms=request.session_timeout_ms,
            protocol_type=request.protocol_type, protocols=request.protocols, joined=True,
        )

    def _join_new_member(self, request: JoinRequest, now: int, config: GroupConfig,
                         make_id: Callable[[str], str]) -> JoinResult | JoinWait:
        if not self.supports_protocols(request.protocol_type, request.protocols):
            return JoinResult(error_code=INCONSISTENT_GROUP_PROTOCOL)
        existing = self.static_member_id(request.group_instance_id)
        if existing is None and len(self.members) + len(self.pending_members) >= \
                config.max_size:
            return JoinResult(error_code=GROUP_MAX_SIZE_REACHED)
        member_id = make_id(request.client_id)
        if request.group_instance_id is not None:
            if existing is not None:
                return self._replace_static_member(existing, member_id, request, now, config)
        elif request.require_known_member_id:
            self.pending_members[member_id] = now + request.session_timeout_ms
            return JoinResult(error_code=MEMBER_ID_REQUIRED, member_id=member_id)
        return self._add_member_and_rebalance(self._new_member(member_id, request), now, config)

    def _add_member_and_rebalance(self, member: Member, now: int,
                                  config: GroupConfig) -> JoinWait:
        if self.state is GroupState.PREPARING_REBALANCE and self.generation == 0:
            self.new_member_added = True
        self._add(member)
        self.maybe_prepare_rebalance(now, config)
        self.maybe_complete_join(now, config)
        return JoinWait(member_id=member.member_id, generation=self._awaited_generation())

    def _awaited_generation(self) -> int:
        """The generation a member that just joined waits to get past: the current one, or
        the one before it if the join phase already ended."""
        if self.state is GroupState.PREPARING_REBALANCE:
            return self.generation
        return self.generation - 1

    def _update_member_and_rebalance(self, member: Member, request: JoinRequest, now: int,
                                     config: GroupConfig) -> JoinWait:
        member.protocols = request.protocols
        member.rebalance_timeout_ms = request.rebalance_timeout_ms
        member.session_timeout_ms = request.session_timeout_ms
        member.joined = True
        self.maybe_prepare_rebalance(now, config)
        self.maybe_complete_join(now, config)
        return JoinWait(member_id=member.member_id, generation=self._awaited_generation())

    def _replace_static_member(self, old_id: str, new_id: str, request: JoinRequest, now: int,
                               config: GroupConfig) -> JoinResult | JoinWait:
        """A static member came back under a new member id: it takes the old member's place
        (the old id is fenced) without a rebalance unless its protocols change the selected
        one (Kafka's ``updateStaticMemberAndRebalance``)."""
        old = self.members.pop(old_id)
        member = replace(old, member_id=new_id, client_id=request.client_id,
                         client_host=request.client_host,
                         rebalance_timeout_ms=request.rebalance_timeout_ms,
                         session_timeout_ms=request.session_timeout_ms,
                         protocols=request.protocols)
        self.members[new_id] = member
        if self.leader_id == old_id:
            self.leader_id = new_id
        if old_id in self.pending_sync:
            self.pending_sync.discard(old_id)
            self.pending_sync.add(new_id)
        if self.state is GroupState.STABLE:
            if self.select_protocol() == self.protocol_name:
                # KIP-814: a returning leader learns the members but keeps the assignment.
                answer = self.join_answer(new_id)
                answer.skip_assignment = self.leader_id == new_id
                return answer
            member.joined = True
            self.maybe_prepare_rebalance(now, config)
            self.maybe_complete_join(now, config)
            return JoinWait(member_id=new_id, generation=self._awaited_generation())
        if self.state is GroupState.COMPLETING_REBALANCE:
            return self.join_answer(new_id)
        # PreparingRebalance: it joins the rebalance in progress.
        member.joined = True
        self.maybe_complete_join(now, config)
        return JoinWait(member_id=new_id, generation=self._awaited_generation())

    def _join_known_member(self, request: JoinRequest, now: int,
                           config: GroupConfig) -> JoinResult | JoinWait:
        member_id = request.member_id
        if member_id in self.pending_members:
            if not self.supports_protocols(request.protocol_type, request.protocols):
                return JoinResult(error_code=INCONSISTENT_GROUP_PROTOCOL, member_id=member_id)
            del self.pending_members[member_id]
            return self._add_member_and_rebalance(self._new_member(member_id, request), now,
                                                  config)
        error = self.validate_member(member_id, request.group_instance_id)
        if error:
            return JoinResult(error_code=error, member_id=member_id)
        if not self.supports_protocols(request.protocol_type, request.protocols):
            return JoinResult(error_code=INCONSISTENT_GROUP_PROTOCOL, member_id=member_id)
        member = self.members[member_id]
        member.client_id, member.client_host = request.client_id, request.client_host
        state = self.state
        if state is GroupState.PREPARING_REBALANCE:
            return self._update_member_and_rebalance(member, request, now, config)
        if state is GroupState.COMPLETING_REBALANCE:
            if member.matches(request.protocols):
                # It missed the answer of this generation's join: give it again.
                return self.join_answer(member_id)
            return self._update_member_and_rebalance(member, request, now, config)
        if state is GroupState.STABLE:
            if self.leader_id == member_id or not member.matches(request.protocols):
                # The leader rejoining forces a rebalance (e.g. topic metadata changed).
                return self._update_member_and_rebalance(member, request, now, config)
            return self.join_answer(member_id)
        return JoinResult(error_code=UNKNOWN_MEMBER_ID, member_id=member_id)

    def rejoin(self, member_id: str, now: int, config: GroupConfig) -> JoinWait | None:
        """A member whose JoinGroup is still parked when a newer rebalance began (before its
        answer went out) joins that one too, as a client would that got its answer and
        rejoined at once. None if it is no longer a member."""
        member = self.members.get(member_id)
        if member is None:
            return None
        member.joined = True
        self.maybe_prepare_rebalance(now, config)
        self.maybe_complete_join(now, config)
        return JoinWait(member_id=member_id, generation=self._awaited_generation())

    def sync(self, member_id: str, group_instance_id: str | None, generation: int,
             protocol_type: str | None, protocol_name: str | None,
             assignments: dict[str, bytes], now: int) -> SyncResult | SyncWait:
        """Kafka's ``classicGroupSync``: the leader's assignment makes the group Stable."""
        if self.state is GroupState.DEAD:
            return SyncResult(error_code=COORDINATOR_NOT_AVAILABLE)
        error = self.validate_member(member_id, group_instance_id)
        if error:
            return SyncResult(error_code=error)
        if generation != self.generation:
            return SyncResult(error_code=ILLEGAL_GENERATION)
        if (protocol_type is not None and protocol_type != self.protocol_type) or (
                protocol_name is not None and protocol_name != self.protocol_name):
            return SyncResult(error_code=INCONSISTENT_GROUP_PROTOCOL)
        if self.state is GroupState.EMPTY:
            return SyncResult(error_code=UNKNOWN_MEMBER_ID)
        if self.state is GroupState.PREPARING_REBALANCE:
            return SyncResult(error_code=REBALANCE_IN_PROGRESS)
        self._synced(member_id)
        if self.state is GroupState.COMPLETING_REBALANCE:
            if self.leader_id != member_id:
                return SyncWait(generation=generation)
            # Members the leader left out get an empty assignment; unknown ids are ignored.
            for member in self.members.values():
                member.assignment = assignments.get(member.member_id, b"")
            self._transition(GroupState.STABLE, now)
        return self.sync_answer(member_id)

    def sync_answer(self, member_id: str) -> SyncResult:
        member = self.members[member_id]
        return SyncResult(error_code=NONE, assignment=member.assignment,
                          protocol_type=self.protocol_type, protocol_name=self.protocol_name)

    def heartbeat(self, member_id: str, group_instance_id: str | None, generation: int) -> int:
        """Kafka's ``classicGroupHeartbeat`` checks (no change to the group)."""
        if self.state is GroupState.DEAD:
            return COORDINATOR_NOT_AVAILABLE
        error = self.validate_member(member_id, group_instance_id)
        if error:
            return error
        if generation != self.generation:
            return ILLEGAL_GENERATION
        if self.state is GroupState.EMPTY:
            return UNKNOWN_MEMBER_ID
        if self.state is GroupState.PREPARING_REBALANCE:
            return REBALANCE_IN_PROGRESS
        return NONE

    def leave(self, members: Sequence[tuple[str, str | None]], now: int,
              config: GroupConfig) -> list[int]:
        """Kafka's ``classicGroupLeave``: one error per (member id, instance id); a static
        member may leave by instance id alone."""
        errors = []
        removed = False
        for member_id, group_instance_id in members:
            if group_instance_id is None and member_id in self.pending_members:
                del self.pending_members[member_id]
                errors.append(NONE)
                removed = True
                continue
            if group_instance_id is not None:
                existing = self.static_member_id(group_instance_id)
                if existing is None:
                    errors.append(UNKNOWN_MEMBER_ID)
                    continue
                if member_id != UNKNOWN_MEMBER and member_id != existing:
                    errors.append(FENCED_INSTANCE_ID)
                    continue
                member_id = existing
            elif member_id not in self.members:
                errors.append(UNKNOWN_MEMBER_ID)
                continue
            self._remove(member_id)
            errors.append(NONE)
            removed = True
        if removed:
            self._after_removal(now, config)
        return errors

    def _after_removal(self, now: int, config: GroupConfig) -> None:
        if self.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self.prepare_rebalance(now, config)
        self.maybe_complete_join(now, config)

    def expire_pending_sync(self, now: int, config: GroupConfig) -> list[str]:
        """Kafka's ``expirePendingSync``: once the sync deadline has passed, every member that
        has not sent SyncGroup for this generation is removed (the leader too, heartbeating or
        not) and the group rebalances without them. Returns the removed member ids."""
        if self.state not in (GroupState.COMPLETING_REBALANCE, GroupState.STABLE):
            self._clear_pending_sync()
            return []
        if not self.pending_sync or now < self.sync_deadline_ms:
            return []
        removed = sorted(self.pending_sync)
        for member_id in removed:
            self._remove(member_id)
        self._clear_pending_sync()
        self._after_removal(now, config)
        return removed

    def on_deadline(self, now: int, config: GroupConfig) -> list[str]:
        """:meth:`deadline_ms` has passed (the DelayedJoin or DelayedSync expires): end the
        join phase without the members that did not rejoin, or remove the members that did
        not sync. Returns the members removed; a deadline not reached yet changes nothing."""
        if self.state is GroupState.PREPARING_REBALANCE:
            before = set(self.members)
            self.maybe_complete_join(now, config)
            return sorted(before - set(self.members))
        return self.expire_pending_sync(now, config)

    def keep_alive_ms(self, member: Member, now: int) -> int:
        """How much longer a member whose session timer ran out is still alive (0: not).

        Kafka's ``shouldKeepAlive``: a member waiting for a join phase to end is alive; and
        Kafka re-arms every member's timer when a join phase ends (and the waiting members'
        when the assignment comes), so a member is alive for a session timeout from the
        group's last change to CompletingRebalance or Stable. (Here the answers re-arm the
        timers a moment after that change, so a timer may run out just before.)"""
        if self.state is GroupState.PREPARING_REBALANCE and member.joined:
            return member.session_timeout_ms
        if self.state in (GroupState.COMPLETING_REBALANCE, GroupState.STABLE):
            return max(self.state_timestamp_ms + member.session_timeout_ms - now, 0)
        return 0

    def expire(self, member_id: str, now: int, config: GroupConfig) -> Expiry:
        """A member's session timer lapsed (Kafka's ``onExpireHeartbeat``): it is removed
        unless :meth:`keep_alive_ms` says it is alive."""
        if member_id in self.pending_members:
            del self.pending_members[member_id]
            self.maybe_complete_join(now, config)
            return Expiry.REMOVED
        member = self.members.get(member_id)
        if member is None:
            return Expiry.GONE
        if self.keep_alive_ms(member, now) > 0:
            return Expiry.KEEP_ALIVE
        self._remove(member_id)
        self._after_removal(now, config)
        return Expiry.REMOVED

    def validate_offset_commit(self, member_id: str, group_instance_id: str | None,
                               generation: int, transactional: bool = False) -> int:
        """Kafka's ``ClassicGroup.validateOffsetCommit``: a commit naming no member and no
        generation comes from outside group management (simple consumers, admin tools) and is
        accepted only while the group is Empty; a member's commit must match the generation,
        and waits out the assignment of a new one (REBALANCE_IN_PROGRESS). A transactional
        commit (TxnOffsetCommit, whose versions before 3 name no member) is accepted whatever
        the group's state."""
        if self.state is GroupState.DEAD:
            return COORDINATOR_NOT_AVAILABLE
        if generation >= 0 or member_id != UNKNOWN_MEMBER or group_instance_id is not None:
            error = self.validate_member(member_id, group_instance_id)
            if error:
                return error
            if generation != self.generation:
                return ILLEGAL_GENERATION
        elif self.state is not GroupState.EMPTY and not transactional:
            return UNKNOWN_MEMBER_ID
        if self.state is GroupState.COMPLETING_REBALANCE and not transactional:
            return REBALANCE_IN_PROGRESS
        return NONE

    # -- persistence -----------------------------------------------------------------------

    def to_record(self) -> GroupMetadataValue:
        """The group as a GroupMetadataValue (v4) with its extension."""
        protocol = self.protocol_name
        return GroupMetadataValue(
            protocol_type=self.protocol_type or "",
            generation=self.generation,
            protocol=protocol,
            leader=self.leader_id,
            current_state_timestamp=self.state_timestamp_ms,
            members=tuple(
                MemberMetadata(
                    member_id=m.member_id, group_instance_id=m.group_instance_id,
                    client_id=m.client_id, client_host=m.client_host,
                    rebalance_timeout=m.rebalance_timeout_ms,
                    session_timeout=m.session_timeout_ms,
                    subscription=m.metadata(protocol), assignment=m.assignment)
                for m in self.members.values()),
            extension=GroupExtension(
                state=self.state.value,
                join_deadline=self.join_deadline_ms,
                initial_delay_remaining=self.initial_delay_remaining_ms,
                new_member_added=self.new_member_added,
                pending=tuple(PendingMember(member_id=m, expires=t)
                              for m, t in self.pending_members.items()),
                sync_deadline=self.sync_deadline_ms,
                pending_sync=tuple(sorted(self.pending_sync)),
                members=tuple(
                    MemberExtension(member_id=m.member_id, joined=m.joined,
                                    protocol_type=m.protocol_type,
                                    protocols=tuple(ProtocolMetadata(name=n, metadata=d)
                                                    for n, d in m.protocols))
                    for m in self.members.values()),
            ),
        )

    @classmethod
    def from_record(cls, group_id: str, value: GroupMetadataValue) -> Group:
        """A group from its record. Records without an extension (written by Kafka) are
        stable points: Empty without members, else Stable, each member's protocol the
        selected one."""
        extension = value.extension
        extras = {m.member_id: m for m in extension.members} if extension else {}
        members = {}
        for m in value.members:
            extra = extras.get(m.member_id)
            protocols = tuple((p.name, p.metadata) for p in extra.protocols) if extra else (
                ((value.protocol, m.subscription),) if value.protocol else ())
            members[m.member_id] = Member(
                member_id=m.member_id, group_instance_id=m.group_instance_id,
                client_id=m.client_id, client_host=m.client_host,
                rebalance_timeout_ms=m.rebalance_timeout if m.rebalance_timeout >= 0
                else m.session_timeout,
                session_timeout_ms=m.session_timeout,
                protocol_type=extra.protocol_type if extra else value.protocol_type,
                protocols=protocols, assignment=m.assignment,
                joined=extra.joined if extra else False)
        if extension is not None:
            state = GroupState(extension.state)
        else:
            state = GroupState.STABLE if members else GroupState.EMPTY
        return cls(
            group_id=group_id, state=state, generation=value.generation,
            protocol_type=value.protocol_type or None, protocol_name=value.protocol,
            leader_id=value.leader, members=members,
            pending_members={p.member_id: p.expires for p in extension.pending}
            if extension else {},
            state_timestamp_ms=value.current_state_timestamp,
            join_deadline_ms=extension.join_deadline if extension else -1,
            initial_delay_remaining_ms=extension.initial_delay_remaining if extension else -1,
            new_member_added=extension.new_member_added if extension else False,
            pending_sync=set(extension.pending_sync) if extension else set(),
            sync_deadline_ms=extension.sync_deadline if extension else -1,
        )


def _new_member_id(client_id: str) -> str:
    """Kafka's member ids: the client id, a dash and a random UUID."""
    return f"{client_id}-{uuid.uuid4()}"


@dataclass(frozen=True, slots=True, kw_only=True)
class SubscriptionTopics:
    """How every version of Kafka's ConsumerProtocolSubscription starts: its topics."""

    __versions__: ClassVar[str] = "0+"
    topics: tuple[str, ...] = kafka(["string"])


def consumer_subscription_topics(metadata: bytes) -> set[str] | None:
    """The topics of a ConsumerProtocolSubscription; None when unreadable."""
    try:
        return set(decode(SubscriptionTopics, metadata).topics)
    except RecordFormatError:
        return None
