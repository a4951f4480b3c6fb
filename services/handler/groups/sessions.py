"""Session and rebalance timers of groups in the purgatory (Kafka's DelayedHeartbeat, and the
expiries of DelayedJoin and DelayedSync), through the coordinator runtime's timers.

    member:<len(group)>:<group><member id>   a member's (or pending member id's) session, in
                                             classic and consumer groups alike
    join:<len(group)>:<group><member id>     a classic member of a consumer group told to
                                             rejoin: its JoinGroup deadline (its rebalance
                                             timeout), armed once until it joins
    sync:<len(group)>:<group><member id>     a classic member of a consumer group that
                                             joined: its SyncGroup deadline (the rebalance
                                             timeout of its JoinGroup)
    revoke:<len(group)>:<group><epoch>:<member id>
                                             a consumer group member's deadline to revoke
                                             partitions at that member epoch (its rebalance
                                             timeout)
    rebalance:<len(group)>:<group>           the group's one deadline: the end of its join
                                             phase, or of its pending SyncGroups

JoinGroup, SyncGroup, Heartbeat and OffsetCommit re-arm the member's session timer; whoever
writes a change of a group's deadline arms its timer for the new one (wakes
:data:`DEADLINE_SLACK_MS` after it, so it has surely passed). What an expiry does is
:mod:`.membership`'s. Timers are soft state: :func:`timers_of` names those a partition's
groups imply, which the runtime arms again after a purgatory restart or a first load.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..coordinator.runtime import CoordinatorRuntime
from .consumer_group import MemberState
from .group import Group
from .state import PartitionState

# A deadline timer wakes this long after the deadline, so it has surely passed by then.
DEADLINE_SLACK_MS = 5


def member_key(group_id: str, member_id: str) -> str:
    """The session timer key of a member (or pending member id) of a group."""
    return f"member:{len(group_id)}:{group_id}{member_id}"


def join_key(group_id: str, member_id: str) -> str:
    """The JoinGroup deadline of a classic member of a consumer group."""
    return f"join:{len(group_id)}:{group_id}{member_id}"


def sync_key(group_id: str, member_id: str) -> str:
    """The SyncGroup deadline of a classic member of a consumer group."""
    return f"sync:{len(group_id)}:{group_id}{member_id}"


def member_timer_keys(group_id: str, member_id: str) -> list[str]:
    """Every timer of a consumer group member but its revocation deadlines (which check the
    member's epoch when they expire)."""
    return [member_key(group_id, member_id), join_key(group_id, member_id),
            sync_key(group_id, member_id)]


def parse_classic_deadline_key(key: str) -> tuple[str, str, str] | None:
    """("join" or "sync", group id, member id) of a :func:`join_key` or :func:`sync_key`."""
    for kind in ("join", "sync"):
        parsed = _split(key, f"{kind}:")
        if parsed is not None:
            return kind, parsed[1][:parsed[0]], parsed[1][parsed[0]:]
    return None


def deadline_key(group_id: str) -> str:
    """The timer key of a group's rebalance deadline (join phase or pending SyncGroups)."""
    return f"rebalance:{len(group_id)}:{group_id}"


def _split(key: str, prefix: str) -> tuple[int, str] | None:
    if not key.startswith(prefix):
        return None
    length, sep, rest = key[len(prefix):].partition(":")
    if not sep or not length.isdigit() or int(length) > len(rest):
        return None
    return int(length), rest


def parse_member_key(key: str) -> tuple[str, str] | None:
    """(group id, member id) of a :func:`member_key`."""
    parsed = _split(key, "member:")
    return None if parsed is None else (parsed[1][:parsed[0]], parsed[1][parsed[0]:])


def parse_deadline_key(key: str) -> str | None:
    """The group id of a :func:`deadline_key`."""
    parsed = _split(key, "rebalance:")
    return parsed[1] if parsed is not None and parsed[0] == len(parsed[1]) else None


def revocation_key(group_id: str, member_id: str, epoch: int) -> str:
    """The timer key of a consumer group member's revocation deadline at ``epoch``."""
    return f"revoke:{len(group_id)}:{group_id}{epoch}:{member_id}"


def parse_revocation_key(key: str) -> tuple[str, str, int] | None:
    """(group id, member id, epoch) of a :func:`revocation_key`."""
    parsed = _split(key, "revoke:")
    if parsed is None:
        return None
    length, rest = parsed
    epoch, sep, member_id = rest[length:].partition(":")
    if not sep or not epoch.lstrip("-").isdigit():
        return None
    return rest[:length], member_id, int(epoch)


def deadline_timeout(deadline_ms: int, now: int) -> int:
    return max(deadline_ms - now, 0) + DEADLINE_SLACK_MS


def timers_of(state: PartitionState, now: int,
              consumer_session_timeout_ms: int = 45_000) -> dict[str, int]:
    """Every timer the groups of a partition imply: deadlines, sessions, pending members;
    for consumer groups, sessions (a classic member's own timeout, else
    ``consumer_session_timeout_ms``) and revocation deadlines."""
    timeouts = {}
    for cgroup in state.consumer_groups.values():
        for cmember in cgroup.members.values():
            timeouts[member_key(cgroup.group_id, cmember.member_id)] = (
                cmember.classic.session_timeout_ms if cmember.classic is not None
                else consumer_session_timeout_ms)
            if cmember.state is MemberState.UNREVOKED_PARTITIONS:
                timeouts[revocation_key(cgroup.group_id, cmember.member_id,
                                        cmember.member_epoch)] = max(
                    cmember.rebalance_timeout_ms, 0)
    for group in state.groups.values():
        deadline = group.deadline_ms()
        if deadline >= 0:
            timeouts[deadline_key(group.group_id)] = deadline_timeout(deadline, now)
        for member in group.members.values():
            timeouts[member_key(group.group_id, member.member_id)] = member.session_timeout_ms
        for member_id, expires in group.pending_members.items():
            timeouts[member_key(group.group_id, member_id)] = max(expires - now, 0)
    return timeouts


class GroupTimers:
    """The timers of groups, armed and disarmed through the runtime."""

    def __init__(self, runtime: CoordinatorRuntime[PartitionState]) -> None:
        self._runtime = runtime

    async def arm(self, group_id: str, member_id: str, session_timeout_ms: int) -> None:
        await self._runtime.arm({member_key(group_id, member_id): session_timeout_ms})

    async def arm_member(self, group: Group, member_id: str) -> None:
        """Re-arm a member's session timer (nothing if it is not a member)."""
        member = group.members.get(member_id)
        if member is not None:
            await self.arm(group.group_id, member_id, member.session_timeout_ms)

    async def disarm(self, group_id: str, member_ids: Sequence[str]) -> None:
        await self._runtime.disarm([member_key(group_id, m) for m in member_ids])

    async def follow_deadline(self, group_id: str, before: Group | None,
                              after: Group | None) -> None:
        """Arm the group's deadline timer for a new deadline, disarm it when there is none."""
        old = before.deadline_ms() if before is not None else -1
        new = after.deadline_ms() if after is not None else -1
        if new == old:
            return
        if new >= 0:
            await self._runtime.arm({deadline_key(group_id):
                                     deadline_timeout(new, self._runtime.now())})
        else:
            await self._runtime.disarm([deadline_key(group_id)])
