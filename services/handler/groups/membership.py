"""Group membership (Kafka's JoinGroup, SyncGroup, Heartbeat and LeaveGroup of the classic
protocol, with the rebalance deadlines and session expiry), over the coordinator runtime: each
operation computes its change with the pure state machine (:mod:`.group`) on a copy of the
fresh group and writes the new group record conditionally (:meth:`Membership.update_group`).

Waiting (the DelayedJoin of Kafka's rebalance purgatory): a JoinGroup that joined a rebalance
waits on the group's key with the threshold "a change past the end I read"; every change a
waiter cares about (a new state or generation, a member gone) is signalled on that key with
the partition's new end. A woken or timed-out waiter reads the group again and decides:
answer (its generation is complete), join the newer rebalance that started before it was
answered, or end the join phase itself when its deadline has passed (the DelayedJoin's expiry;
whichever waiter's write lands first does it, the others see it done). Followers' SyncGroup
waits the same way for the leader's assignment.

Deadlines (the expiries of DelayedJoin and DelayedSync): a group has at most one deadline at a
time (:meth:`.group.Group.deadline_ms`), and whoever writes a change of it arms its timer
(:mod:`.sessions`). When it runs out, a handler ends the join phase without the members that
did not rejoin, or removes the members of the new generation that did not send SyncGroup within
the rebalance timeout and starts a rebalance without them; so a group nobody waits on still
moves on at its deadline. A heartbeat that finds the deadline passed does the same (the
fallback when the purgatory is unreachable).

Consumer groups: while a group id is a non-empty consumer group (KIP-848), its classic members'
JoinGroup, SyncGroup, Heartbeat and LeaveGroup are served by it (:mod:`.consumer_groups`,
Kafka's ``classicGroup*ToConsumerGroup``), as are its members' expired timers; a JoinGroup
to an empty consumer group replaces it with a classic group (its offsets stay).

Sessions (DelayedHeartbeat): a member whose timer ran out is removed, unless it armed it again
since or waits in a join phase (kept alive, as Kafka's ``shouldKeepAlive``). Every handler
hears every expiry; the removal is a conditional write, so exactly one of them makes it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from services.common.errors import ErrorCode

from ..coordinator.placement import CoordinatorError
from ..coordinator.runtime import POLL_INTERVAL_S, CoordinatorRuntime
from ..metrics import GROUP_REBALANCES, GROUP_SESSION_EXPIRIES
from .consumer_config import GroupError
from .consumer_group import records_between
from .group import (
    INVALID_GROUP_ID,
    NONE,
    REBALANCE_IN_PROGRESS,
    UNKNOWN_MEMBER_ID,
    Expiry,
    Group,
    GroupConfig,
    GroupState,
    JoinRequest,
    JoinResult,
    JoinWait,
    SyncResult,
    SyncWait,
)
from .sessions import (
    DEADLINE_SLACK_MS,
    GroupTimers,
    parse_deadline_key,
    parse_member_key,
)
from .state import PartitionState, group_record

log = logging.getLogger(__name__)

T = TypeVar("T")

INVALID_SESSION_TIMEOUT = ErrorCode.invalid_session_timeout.value
MAX_SYNC_WAIT_MS = 25_000


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupChange(Generic[T]):
    """The outcome of a group update: the change function's result, the group before and
    after (None: absent), and the partition's end after the update."""

    result: T
    before: Group | None
    after: Group | None
    end: int


class Membership:
    """JoinGroup, SyncGroup, Heartbeat, LeaveGroup, deadlines and session expiry."""

    def __init__(self, runtime: CoordinatorRuntime[PartitionState], timers: GroupTimers,
                 config: GroupConfig) -> None:
        self._runtime = runtime
        self._timers = timers
        self.config = config
        # The consumer groups of the same coordinator (set by the coordinator's wiring).
        self.consumer: Any = None

    async def _consumer_group_in_use(self, group_id: str) -> bool:
        """Whether the id is a consumer group with members (classic requests go there)."""
        if self.consumer is None:
            return False
        group = (await self._runtime.read(group_id)).consumer_group(group_id)
        return group is not None and bool(group.members)

    async def update_group(self, group_id: str,
                           change: Callable[[Group, int], T]) -> GroupChange[T]:
        """Apply ``change(group, now)`` to a copy of the group (a new Empty group when it does
        not exist) and write it if it changed; wake the group's waiters when the change
        matters to them, and follow its deadline."""

        def compute(state: PartitionState, now: int):  # type: ignore[no-untyped-def]
            before = state.group(group_id)
            work = before.copy() if before is not None else Group(group_id=group_id)
            result = change(work, now)
            unchanged = work == (before or Group(group_id=group_id))
            records = [] if unchanged else [group_record(group_id, work)]
            replaced = state.consumer_group(group_id)
            if records and replaced is not None and not replaced.members:
                # An empty consumer group gives way to the classic group (Kafka's
                # maybeDeleteEmptyConsumerGroup); its offsets stay.
                records = records_between(replaced, None) + records
            return records, (result, before, None if unchanged and before is None else work)

        (result, before, after), end = await self._runtime.update(group_id, compute)
        if after is not None and before is not None and after.generation > before.generation:
            GROUP_REBALANCES.inc()
        if after is not None and _matters_to_waiters(before or Group(group_id=group_id), after):
            await self._runtime.signal(group_id, end)
        await self._timers.follow_deadline(group_id, before, after)
        return GroupChange(result=result, before=before, after=after, end=end)

    # -- JoinGroup ----------------------------------------------------------------------------

    async def join(self, group_id: str, request: JoinRequest) -> JoinResult:
        """Kafka's JoinGroup: answers at once (errors, MEMBER_ID_REQUIRED, the current
        generation for a member with nothing new), or once the rebalance it joined is over."""
        if not group_id:
            return JoinResult(error_code=INVALID_GROUP_ID, member_id=request.member_id)
        config = self.config
        if not config.min_session_timeout_ms <= request.session_timeout_ms <= \
                config.max_session_timeout_ms:
            return JoinResult(error_code=INVALID_SESSION_TIMEOUT, member_id=request.member_id)
        if await self._consumer_group_in_use(group_id):
            return await self._join_consumer_group(group_id, request)
        change = await self.update_group(
            group_id, lambda group, now: group.join(request, now, config))
        outcome = change.result
        if isinstance(outcome, JoinResult):
            if outcome.error_code == ErrorCode.member_id_required.value or (
                    outcome.error_code == NONE and outcome.member_id):
                await self._timers.arm(group_id, outcome.member_id, request.session_timeout_ms)
            return outcome
        if change.before is not None and change.after is not None:
            await self._timers.disarm(group_id, [m for m in change.before.members
                                                 if m not in change.after.members])
        await self._timers.arm(group_id, outcome.member_id, request.session_timeout_ms)
        return await self._await_join(group_id, outcome, request)

    async def _join_consumer_group(self, group_id: str, request: JoinRequest) -> JoinResult:
        try:
            error, member_id, generation, protocol = await self.consumer.classic_join(
                group_id, member_id=request.member_id,
                instance_id=request.group_instance_id, client_id=request.client_id,
                client_host=request.client_host, session_timeout_ms=request.session_timeout_ms,
                rebalance_timeout_ms=request.rebalance_timeout_ms,
                protocol_type=request.protocol_type, protocols=request.protocols,
                require_known_member_id=request.require_known_member_id)
        except GroupError as exc:
            return JoinResult(error_code=exc.code, member_id=request.member_id)
        if error:
            return JoinResult(error_code=error, member_id=member_id)
        return JoinResult(error_code=NONE, member_id=member_id, generation_id=generation,
                          protocol_type="consumer", protocol_name=protocol, leader="")

    async def _await_join(self, group_id: str, joined: JoinWait,
                          request: JoinRequest) -> JoinResult:
        config = self.config
        member_id = joined.member_id
        waited = joined.generation
        give_up = time.monotonic() + (request.rebalance_timeout_ms +
                                      config.initial_rebalance_delay_ms) / 1000 + 3
        floor = -1
        while True:
            if time.monotonic() > give_up:
                return JoinResult(error_code=REBALANCE_IN_PROGRESS, member_id=member_id)
            state, end = await self._runtime.read_at(group_id)
            group = state.group(group_id)
            if group is None and state.consumer_group(group_id) is not None:
                # The group became a consumer group: join it again, there.
                return JoinResult(error_code=REBALANCE_IN_PROGRESS, member_id=member_id)
            if group is None or member_id not in group.members:
                fenced = group is not None and group.is_static_member_fenced(
                    request.group_instance_id, member_id)
                return JoinResult(error_code=ErrorCode.fenced_instance_id.value if fenced
                                  else UNKNOWN_MEMBER_ID, member_id=member_id)
            if group.generation > waited and group.state in (
                    GroupState.COMPLETING_REBALANCE, GroupState.STABLE):
                await self._timers.arm_member(group, member_id)
                return group.join_answer(member_id)
            now = self._runtime.now()
            timeout_ms = POLL_INTERVAL_S * 1000
            if group.state is GroupState.PREPARING_REBALANCE:
                if not group.members[member_id].joined or now >= group.join_deadline_ms:
                    # A newer rebalance this member must join too, or a join phase whose
                    # deadline passed: act on it (whoever's write lands first wins).
                    change = await self.update_group(
                        group_id, lambda g, t: _rejoin_or_complete(g, member_id, t, config))
                    if isinstance(change.result, JoinWait):
                        waited = change.result.generation
                    continue
                timeout_ms = group.join_deadline_ms - now + DEADLINE_SLACK_MS
            timeout_ms = min(timeout_ms, (give_up - time.monotonic()) * 1000)
            floor = max(floor, await self._runtime.wait(group_id, max(end + 1, floor + 1),
                                                        timeout_ms))

    # -- SyncGroup ----------------------------------------------------------------------------

    async def sync(self, group_id: str, member_id: str, group_instance_id: str | None,
                   generation: int, protocol_type: str | None, protocol_name: str | None,
                   assignments: Mapping[str, bytes]) -> SyncResult:
        if not group_id:
            return SyncResult(error_code=INVALID_GROUP_ID)
        if await self._consumer_group_in_use(group_id):
            try:
                assignment, protocol = await self.consumer.classic_sync(
                    group_id, member_id=member_id, instance_id=group_instance_id,
                    generation=generation, protocol_type=protocol_type,
                    protocol_name=protocol_name)
            except GroupError as exc:
                return SyncResult(error_code=exc.code, assignment=b"")
            return SyncResult(error_code=NONE, assignment=assignment, protocol_type="consumer",
                              protocol_name=protocol)
        change = await self.update_group(
            group_id, lambda group, now: group.sync(
                member_id, group_instance_id, generation, protocol_type, protocol_name,
                dict(assignments), now))
        outcome = change.result
        if isinstance(outcome, SyncResult):
            if outcome.error_code == NONE and change.after is not None:
                await self._timers.arm_member(change.after, member_id)
            return outcome
        return await self._await_sync(group_id, member_id, group_instance_id, outcome,
                                      change.end)

    async def _await_sync(self, group_id: str, member_id: str, group_instance_id: str | None,
                          waiting: SyncWait, end: int) -> SyncResult:
        group = (await self._runtime.read(group_id)).group(group_id)
        limit = group.members[member_id].rebalance_timeout_ms if group is not None and \
            member_id in group.members else 0
        # Within the frontend's deadline for a SyncGroup: a follower still waiting by then
        # (the leader is slow or gone) is told to rejoin and asks again.
        give_up = time.monotonic() + min(max(limit, 1000), MAX_SYNC_WAIT_MS) / 1000
        threshold = end + 1
        floor = -1
        while True:
            remaining_ms = (give_up - time.monotonic()) * 1000
            if remaining_ms <= 0:
                return SyncResult(error_code=REBALANCE_IN_PROGRESS)
            floor = max(floor, await self._runtime.wait(group_id, max(threshold, floor + 1),
                                                        remaining_ms))
            state, end = await self._runtime.read_at(group_id)
            threshold = end + 1
            group = state.group(group_id)
            if group is None and state.consumer_group(group_id) is not None:
                return SyncResult(error_code=REBALANCE_IN_PROGRESS)
            if group is None:
                return SyncResult(error_code=UNKNOWN_MEMBER_ID)
            error = group.validate_member(member_id, group_instance_id)
            if error:
                return SyncResult(error_code=error)
            if group.generation != waiting.generation or group.state not in (
                    GroupState.COMPLETING_REBALANCE, GroupState.STABLE):
                return SyncResult(error_code=REBALANCE_IN_PROGRESS)
            if group.state is GroupState.STABLE:
                await self._timers.arm_member(group, member_id)
                return group.sync_answer(member_id)

    # -- Heartbeat, LeaveGroup ----------------------------------------------------------------

    async def heartbeat(self, group_id: str, member_id: str, group_instance_id: str | None,
                        generation: int) -> int:
        if not group_id:
            return INVALID_GROUP_ID
        if await self._consumer_group_in_use(group_id):
            try:
                return int(await self.consumer.classic_heartbeat(
                    group_id, member_id, group_instance_id, generation))
            except GroupError as exc:
                return exc.code
        group = (await self._runtime.read(group_id)).group(group_id) or Group(group_id=group_id)
        error = group.heartbeat(member_id, group_instance_id, generation)
        if error in (NONE, REBALANCE_IN_PROGRESS):
            await self._timers.arm_member(group, member_id)
        deadline = group.deadline_ms()
        if deadline >= 0 and self._runtime.now() >= deadline:
            # The join phase or the pending syncs are overdue and their timer has not acted
            # (e.g. no purgatory): act here, and answer as the group is now.
            after = (await self._act_on_deadline(group_id, "heartbeat")).after
            if error == NONE and after is not None and after.state is not group.state:
                error = UNKNOWN_MEMBER_ID if member_id not in after.members else \
                    REBALANCE_IN_PROGRESS
        return error

    async def leave(self, group_id: str,
                    members: Sequence[tuple[str, str | None]]) -> list[int]:
        """One error per leaving (member id, instance id)."""
        if not group_id:
            return [INVALID_GROUP_ID] * len(members)
        if await self._consumer_group_in_use(group_id):
            try:
                return list(await self.consumer.classic_leave(group_id, members))
            except GroupError as exc:
                return [exc.code] * len(members)
        change = await self.update_group(
            group_id, lambda group, now: group.leave(members, now, self.config))
        before, after = change.before, change.after
        if before is not None and after is not None:
            await self._timers.disarm(group_id, [
                m for m in (*before.members, *before.pending_members)
                if m not in after.members and m not in after.pending_members])
        return change.result

    # -- timers that ran out ------------------------------------------------------------------

    async def expire(self, key: str) -> None:
        """A timer ran out: act on a group's deadline, or remove a member (or pending member)
        whose session lapsed unless it is alive after all (armed again since, or kept alive by
        the group's state, in which case its timer is armed for as long as that lasts). Keys
        of other timers are ignored."""
        deadline_group = parse_deadline_key(key)
        if deadline_group is not None:
            await self._expire_deadline(deadline_group)
            return
        if self.consumer is not None and (await self.consumer.expire_revocation(key)
                                          or await self.consumer.expire_classic_deadline(key)):
            return
        parsed = parse_member_key(key)
        if parsed is None:
            return
        group_id, member_id = parsed
        if await self._runtime.rearmed(key):
            GROUP_SESSION_EXPIRIES.labels("rearmed").inc()
            return
        if self.consumer is not None:
            try:
                consumer_group = (await self._runtime.read(group_id)).consumer_group(group_id)
            except CoordinatorError as exc:
                log.warning("session expiry of %s in group %s: %s", member_id, group_id, exc)
                return
            if consumer_group is not None:
                await self.consumer.expire_session(group_id, member_id)
                return

        def change(group: Group, now: int) -> tuple[Expiry, int]:
            member = group.members.get(member_id)
            alive_ms = group.keep_alive_ms(member, now) if member is not None else 0
            return group.expire(member_id, now, self.config), alive_ms

        try:
            if group_id not in (await self._runtime.read(group_id)).groups:
                return
            expiry, alive_ms = (await self.update_group(group_id, change)).result
        except CoordinatorError as exc:
            log.warning("session expiry of %s in group %s: %s", member_id, group_id, exc)
            return
        GROUP_SESSION_EXPIRIES.labels(expiry.value).inc()
        if expiry is Expiry.KEEP_ALIVE:
            await self._runtime.arm({key: alive_ms})
        elif expiry is Expiry.REMOVED:
            log.info("member %s of group %s left: session timeout", member_id, group_id)

    async def _expire_deadline(self, group_id: str) -> None:
        """A group's deadline timer ran out: act on the deadline if it has passed (re-arm the
        timer if it moved later; nothing if the group has none any more)."""
        try:
            group = (await self._runtime.read(group_id)).group(group_id)
            deadline = group.deadline_ms() if group is not None else -1
            if deadline < 0:
                return
            now = self._runtime.now()
            if now < deadline:
                await self._timers.follow_deadline(group_id, None, group)
                return
            await self._act_on_deadline(group_id, "timer")
        except CoordinatorError as exc:
            log.warning("rebalance deadline of group %s: %s", group_id, exc)

    async def _act_on_deadline(self, group_id: str, why: str) -> GroupChange[list[str]]:
        change = await self.update_group(group_id,
                                         lambda g, now: g.on_deadline(now, self.config))
        removed = change.result
        if removed:
            await self._timers.disarm(group_id, removed)
            rejoin = change.before is not None and \
                change.before.state is GroupState.PREPARING_REBALANCE
            log.info("group %s: removed %s, no %s within the rebalance timeout (%s)", group_id,
                     ", ".join(removed), "JoinGroup" if rejoin else "SyncGroup", why)
        return change


def _rejoin_or_complete(group: Group, member_id: str, now: int,
                        config: GroupConfig) -> JoinWait | None:
    member = group.members.get(member_id)
    if group.state is GroupState.PREPARING_REBALANCE and member is not None and \
            not member.joined:
        return group.rejoin(member_id, now, config)
    group.maybe_complete_join(now, config)
    return None


def _matters_to_waiters(before: Group, after: Group) -> bool:
    """Whether parked JoinGroup/SyncGroup requests must look at the group again."""
    return (before.state is not after.state or before.generation != after.generation
            or any(member_id not in after.members for member_id in before.members))
