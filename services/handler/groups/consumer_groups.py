"""Consumer groups of the KIP-848 protocol over the coordinator runtime: ConsumerGroupHeartbeat,
the classic members of consumer groups (JoinGroup, SyncGroup, Heartbeat, LeaveGroup routed
here by :mod:`.membership` while a group is a non-empty consumer group), session and
revocation timers, and conversions between the protocols. Each operation computes its change
with the pure transitions (:mod:`.consumer_heartbeat`, :mod:`.classic_members`) on fresh state
and writes the records that differ (:func:`.consumer_group.records_between`) with one
conditional append, so any handler serves any heartbeat.

Timers (:mod:`.sessions`): every heartbeat re-arms its member's session timer
(``group.consumer.session.timeout.ms``; a classic member's own session timeout); a member asked
to revoke partitions gets a revocation deadline (its rebalance timeout) at that member epoch.
When either runs out (and the session timer was not armed again since), a handler fences the
member with a conditional write, as Kafka's timers do.

Topics come from the handler's metadata cache (:class:`~.consumer_heartbeat.TopicImage`): each
heartbeat sees the partition counts of the subscribed topics and the topics a regular
expression matches as they are now, and a change of either bumps the group epoch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from services.common.errors import ErrorCode

from ..coordinator.placement import CoordinatorError
from ..coordinator.runtime import CoordinatorRuntime
from ..metadata_cache import MetadataCache, MetadataUnavailableError
from ..metrics import GROUP_REBALANCES, GROUP_SESSION_EXPIRIES
from .classic_members import classic_heartbeat, classic_join, classic_leave, classic_sync
from .consumer_group import ConsumerGroup, SubscribedTopic, records_between
from .consumer_heartbeat import (
    Change,
    ConsumerGroupConfig,
    GroupError,
    HeartbeatRequest,
    HeartbeatResult,
    TopicImage,
    expire_revocation,
    fence,
    heartbeat,
)
from .group import Group, GroupConfig
from .sessions import (
    GroupTimers,
    join_key,
    member_key,
    member_timer_keys,
    parse_classic_deadline_key,
    parse_revocation_key,
    revocation_key,
    sync_key,
)
from .state import PartitionState, Record, group_record
from .topic_regex import TopicFilter

log = logging.getLogger(__name__)

COORDINATOR_NOT_AVAILABLE = ErrorCode.coordinator_not_available.value


@dataclass(frozen=True, slots=True, kw_only=True)
class Applied:
    change: Change | None
    error: GroupError | None
    before: ConsumerGroup | None
    classic_before: Group | None
    end: int


Transition = Callable[[ConsumerGroup | None, Group | None, TopicImage, int], Change]


class ConsumerGroups:
    """The consumer group protocol of one coordinator."""

    def __init__(self, runtime: CoordinatorRuntime[PartitionState], timers: GroupTimers,
                 cache: MetadataCache, config: ConsumerGroupConfig,
                 classic_config: GroupConfig) -> None:
        self._runtime = runtime
        self._timers = timers
        self._cache = cache
        self.config = config
        self.classic_config = classic_config

    async def image(self) -> TopicImage:
        try:
            metadata = await self._cache.current()
        except MetadataUnavailableError as exc:
            raise CoordinatorError(COORDINATOR_NOT_AVAILABLE, str(exc)) from None
        return TopicImage(topics={
            name: SubscribedTopic(topic_id=t.topic_id, partitions=len(t.partitions))
            for name, t in metadata.topics.items() if t.topic_id}, version=metadata.version)

    async def apply(self, group_id: str, transition: Transition) -> Applied:
        """Compute ``transition(consumer group, classic group, topics, now)`` on fresh state
        and write what it changed; then its timers, and the wake-ups of classic waiters when
        the group changed protocol."""
        image = await self.image()

        def compute(state: PartitionState, now: int) -> tuple[list[Record], Applied]:
            before = state.consumer_group(group_id)
            classic = state.group(group_id)
            try:
                change = transition(before, classic, image, now)
            except GroupError as exc:
                return [], Applied(change=None, error=exc, before=before,
                                   classic_before=classic, end=-1)
            records: list[Record] = []
            if change.delete_classic and classic is not None:
                records.append(group_record(group_id, None))
            if change.classic_after is not None:
                records += records_between(before, None)
                records.append(group_record(group_id, change.classic_after))  # type: ignore
            elif before is not None or change.after is not None:
                records += records_between(before, change.after)
            return records, Applied(change=change, error=None, before=before,
                                    classic_before=classic, end=-1)

        applied, end = await self._runtime.update(group_id, compute)
        change = applied.change
        if change is not None:
            await self._follow(group_id, applied, change, end)
        return Applied(change=change, error=applied.error, before=applied.before,
                       classic_before=applied.classic_before, end=end)

    async def _follow(self, group_id: str, applied: Applied, change: Change, end: int) -> None:
        before, after = applied.before, change.after
        if after is not None and (before is None or after.epoch > before.epoch):
            GROUP_REBALANCES.inc()
        timers = change.timers
        if timers.disarm:
            await self._runtime.disarm([key for m in timers.disarm
                                        for key in member_timer_keys(group_id, m)])
        arm = {member_key(group_id, m): ms for m, ms in timers.sessions.items()}
        arm.update({revocation_key(group_id, m, epoch): ms
                    for m, epoch, ms in timers.revocations})
        await self._runtime.arm(arm)
        if applied.classic_before is not None or change.classic_after is not None:
            # Classic waiters (a parked JoinGroup or SyncGroup) must look again.
            await self._runtime.signal(group_id, end)
        classic_after = change.classic_after
        if isinstance(classic_after, Group):
            await self._timers.follow_deadline(group_id, None, classic_after)
            await self._runtime.arm({member_key(group_id, m.member_id): m.session_timeout_ms
                                     for m in classic_after.members.values()})

    # -- ConsumerGroupHeartbeat ---------------------------------------------------------------

    async def heartbeat(self, request: HeartbeatRequest,
                        describable: TopicFilter = None) -> HeartbeatResult:
        """Raises GroupError (the answer's error) or CoordinatorError. ``describable``: the
        member's DESCRIBE permission on topics, when an authorizer is on."""
        config = self.config

        def transition(group: ConsumerGroup | None, classic: Group | None, image: TopicImage,
                       now: int) -> Change:
            return heartbeat(group, classic, request, image, config, now, describable)

        applied = await self.apply(request.group_id, transition)
        if applied.error is not None:
            raise applied.error
        assert applied.change is not None
        return applied.change.result  # type: ignore[return-value]

    # -- classic members of consumer groups ---------------------------------------------------

    async def classic_join(self, group_id: str, **request: object) -> tuple[int, str, int, str]:
        """(error, member id, generation, protocol name); raises GroupError."""
        config = self.config

        def transition(group: ConsumerGroup | None, classic: Group | None, image: TopicImage,
                       now: int) -> Change:
            if group is None or not group.members:
                raise GroupError(ErrorCode.rebalance_in_progress.value,
                                 "The group changed protocol.")
            return classic_join(group, image=image, config=config, now=now,
                                classic_config=self.classic_config,
                                **request)  # type: ignore[arg-type]

        applied = await self.apply(group_id, transition)
        if applied.error is not None:
            raise applied.error
        assert applied.change is not None
        error, member_id, generation, protocol = applied.change.result  # type: ignore[misc]
        if not error and applied.change.after is not None:
            # Joined: no JoinGroup deadline any more, a SyncGroup one instead (Kafka's sync
            # timeout, the rebalance timeout of this JoinGroup).
            await self._runtime.disarm([join_key(group_id, member_id)])
            await self._runtime.arm({sync_key(group_id, member_id):
                                     int(request["rebalance_timeout_ms"])})  # type: ignore
        return error, member_id, generation, protocol

    async def _rejoin_deadline(self, group_id: str, group: ConsumerGroup,
                               member_id: str) -> None:
        """A classic member told REBALANCE_IN_PROGRESS must rejoin within its rebalance
        timeout, counted from the first time it was told (Kafka's join timeout)."""
        member = group.members.get(member_id)
        if member is not None:
            await self._runtime.arm_if_absent({join_key(group_id, member_id):
                                               max(member.rebalance_timeout_ms, 0)})

    async def _current(self, group_id: str) -> ConsumerGroup:
        group = (await self._runtime.read(group_id)).consumer_group(group_id)
        if group is None:
            raise GroupError(ErrorCode.unknown_member_id.value, f"Group {group_id} has no "
                             "such member.")
        return group

    async def classic_sync(self, group_id: str, **request: object) -> tuple[bytes, str]:
        group = await self._current(group_id)
        member_id: str = request["member_id"]  # type: ignore[assignment]
        try:
            result = classic_sync(group, image=await self.image(), **request)  # type: ignore
        except GroupError as exc:
            if exc.code == ErrorCode.rebalance_in_progress.value:
                await self._rejoin_deadline(group_id, group, member_id)
            raise
        member = group.members.get(member_id)
        if member is not None and member.classic is not None:
            await self._runtime.disarm([sync_key(group_id, member_id)])
            await self._runtime.arm({member_key(group_id, member.member_id):
                                     member.classic.session_timeout_ms})
        return result

    async def classic_heartbeat(self, group_id: str, member_id: str, instance_id: str | None,
                                generation: int) -> int:
        group = await self._current(group_id)
        error = classic_heartbeat(group, member_id=member_id, instance_id=instance_id,
                                  generation=generation)
        member = group.members.get(member_id)
        if member is not None and member.classic is not None:
            await self._runtime.arm({member_key(group_id, member_id):
                                     member.classic.session_timeout_ms})
        if error == ErrorCode.rebalance_in_progress.value:
            await self._rejoin_deadline(group_id, group, member_id)
        return error

    async def classic_leave(self, group_id: str,
                            members: Sequence[tuple[str, str | None]]) -> list[int]:
        config, classic_config = self.config, self.classic_config
        errors: list[int] = []

        def transition(group: ConsumerGroup | None, classic: Group | None, image: TopicImage,
                       now: int) -> Change:
            if group is None:
                raise GroupError(ErrorCode.unknown_member_id.value, "no such group")
            change, found = classic_leave(group, members, config, image=image, now=now,
                                          classic_config=classic_config)
            errors[:] = found
            return change

        applied = await self.apply(group_id, transition)
        if applied.error is not None:
            raise applied.error
        return errors

    # -- timers -------------------------------------------------------------------------------

    def _fence_transition(self, member_id: str) -> Callable[..., Change]:
        """The change that fences ``member_id`` (none if it is no member any more)."""
        config, classic_config = self.config, self.classic_config

        def transition(group: ConsumerGroup | None, classic: Group | None, image: TopicImage,
                       now: int) -> Change:
            if group is None or member_id not in group.members:
                return Change(after=group)
            return fence(group, member_id, config, image=image, now=now,
                         classic_config=classic_config)

        return transition

    async def expire_session(self, group_id: str, member_id: str) -> None:
        """A consumer group member's session timer ran out: fence it."""
        try:
            applied = await self.apply(group_id, self._fence_transition(member_id))
        except CoordinatorError as exc:
            log.warning("session expiry of %s in group %s: %s", member_id, group_id, exc)
            return
        if applied.before is not None and member_id in applied.before.members:
            GROUP_SESSION_EXPIRIES.labels("removed").inc()
            log.info("member %s of consumer group %s fenced: session timeout", member_id,
                     group_id)

    async def expire_classic_deadline(self, key: str) -> bool:
        """A classic member's JoinGroup or SyncGroup deadline ran out (False: not such a
        key): the member is fenced, unless the deadline was armed again since."""
        parsed = parse_classic_deadline_key(key)
        if parsed is None:
            return False
        kind, group_id, member_id = parsed
        if await self._runtime.rearmed(key):
            return True
        try:
            applied = await self.apply(group_id, self._fence_transition(member_id))
        except CoordinatorError as exc:
            log.warning("%s deadline of %s in group %s: %s", kind, member_id, group_id, exc)
            return True
        if applied.before is not None and member_id in applied.before.members:
            log.info("member %s of consumer group %s fenced: no %s within its rebalance "
                     "timeout", member_id, group_id, "JoinGroup" if kind == "join" else
                     "SyncGroup")
        return True

    async def expire_revocation(self, key: str) -> bool:
        """A revocation deadline ran out (False: not such a key)."""
        parsed = parse_revocation_key(key)
        if parsed is None:
            return False
        group_id, member_id, epoch = parsed
        config, classic_config = self.config, self.classic_config

        def transition(group: ConsumerGroup | None, classic: Group | None, image: TopicImage,
                       now: int) -> Change:
            change = None if group is None else expire_revocation(
                group, member_id, epoch, config, image=image, now=now,
                classic_config=classic_config)
            return change or Change(after=group)

        try:
            applied = await self.apply(group_id, transition)
        except CoordinatorError as exc:
            log.warning("revocation deadline of %s in group %s: %s", member_id, group_id, exc)
            return True
        if applied.change is not None and applied.change.timers.disarm:
            log.info("member %s of consumer group %s fenced: partitions not revoked within "
                     "its rebalance timeout", member_id, group_id)
        return True
