"""The group coordinator (Kafka's ``GroupCoordinator`` with its ``GroupMetadataManager``) run
by stateless handlers: every handler can serve every group, because everything a group is,
including a rebalance in progress, lives in ``__consumer_offsets`` on the log nodes.

Where a group lives: partition ``abs(java_hashcode(group_id)) % partitions`` of
``__consumer_offsets`` (Kafka's ``partitionFor``), created on first need with
``offsets.topic.num.partitions`` partitions, replication factor min(configured, live log
nodes) and ``cleanup.policy=compact``. Its coordinator, as clients see it, is that partition's
leader.

Reads and writes: each operation reads the partition up to its end (see :mod:`.store`),
computes the change with the pure state machine (:mod:`.group`) on copies, and appends the new
group record (and offset records) conditionally on the end it read; a conflict means another
handler changed the partition first, and the operation is computed again on fresh state. Two
handlers racing on one group therefore serialise exactly as Kafka's group lock would.

Waiting (the DelayedJoin of Kafka's rebalance purgatory): a JoinGroup that joined a rebalance
parks in the purgatory on the key ``group:<topic id>:<group>``, with the threshold "a change
past the log end I read"; every change a waiter cares about (a new state or generation, a
member gone) is reported on that key with the partition's new end. A woken or timed-out
waiter reads the group again and decides: answer (its generation is complete), join the newer
rebalance that started before it was answered, or end the join phase itself when its deadline
has passed (the DelayedJoin's expiry; whichever waiter's write lands first does it, the others
see it done). Followers' SyncGroup waits the same way for the leader's assignment.

Deadlines (the expiries of DelayedJoin and DelayedSync): a group has at most one deadline at a
time (:meth:`.group.Group.deadline_ms`: the end of its join phase, or of its pending
SyncGroups), and whoever writes a change of it arms a purgatory timer for it (key
``rebalance:<len>:<group>``). When it runs out, a handler ends the join phase without the
members that did not rejoin, or removes the members of the new generation that did not send
SyncGroup within the rebalance timeout and starts a rebalance without them; so a group
nobody is waiting on still moves on at its deadline, as Kafka's does. A heartbeat that finds
the deadline passed does the same (the fallback when the purgatory is unreachable).

Sessions (DelayedHeartbeat): JoinGroup, SyncGroup, Heartbeat and OffsetCommit arm the member's
timer in the purgatory (key ``member:<len>:<group><member>``, the session timeout); handlers
follow the purgatory's expiry stream and remove a member whose timer ran out, unless it is
waiting in a join phase (kept alive, as Kafka's ``shouldKeepAlive``). Every handler receives
every expiry; the removal is a conditional write, so exactly one of them makes it. Timers are
soft state: when the expiry stream (re)connects, and when a handler first loads a partition, it
arms the timers of the members it knows, so members that died while a purgatory was down
still expire.

Durability: as Kafka's coordinator writes with acks=all, an operation whose write the leader
holds waits until the partition's high watermark covers it (``commit_timeout_ms``) before it
answers. Readers see the leader's log to its end, as the conditional append needs.

Clocks: deadlines are wall-clock milliseconds in the records, so handlers' clocks are assumed
to agree to well within a session timeout.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from services.common.errors import ErrorCode
from services.common.progress_reports import epoch_key, partition_key

from ..collaborators import (
    CallError,
    Controller,
    NewTopic,
    Purgatory,
    SessionTimers,
    WaitKind,
)
from ..metadata_cache import (
    ClusterMetadata,
    MetadataCache,
    MetadataUnavailableError,
    TopicInfo,
)
from ..metrics import GROUP_REBALANCES, GROUP_SESSION_EXPIRIES, GROUP_WRITES, parked
from .group import (
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
from .state import CommittedOffset, PartitionState, TopicPartition, group_record, offset_record
from .store import Leader, LogClient, OffsetsPartition, PartitionUnavailableError

log = logging.getLogger(__name__)

T = TypeVar("T")

OFFSETS_TOPIC = "__consumer_offsets"
COORDINATOR_NOT_AVAILABLE = ErrorCode.coordinator_not_available.value
NOT_COORDINATOR = ErrorCode.not_coordinator.value
INVALID_GROUP_ID = ErrorCode.invalid_group_id.value
INVALID_SESSION_TIMEOUT = ErrorCode.invalid_session_timeout.value
ILLEGAL_GENERATION = ErrorCode.illegal_generation.value
GROUP_ID_NOT_FOUND = ErrorCode.group_id_not_found.value
NON_EMPTY_GROUP = ErrorCode.non_empty_group.value
GROUP_SUBSCRIBED_TO_TOPIC = ErrorCode.group_subscribed_to_topic.value
NOT_LEADER_OR_FOLLOWER = ErrorCode.not_leader_or_follower.value
TOPIC_ALREADY_EXISTS = ErrorCode.topic_already_exists.value

# A waiter wakes this long after a deadline, so the deadline has surely passed when it looks.
DEADLINE_SLACK_MS = 5
# Without a purgatory, waiters look again this often.
POLL_INTERVAL_S = 0.2
CREATE_TOPIC_TIMEOUT_S = 30.0
MAX_SYNC_WAIT_MS = 25_000
MAX_PARALLEL_EXPIRIES = 64


class CoordinatorError(Exception):
    """The group's partition cannot be served now; ``code`` is the Kafka error to answer."""

    def __init__(self, code: int, message: str = "") -> None:
        super().__init__(message or ErrorCode(code).name.upper())
        self.code = code


@dataclass(frozen=True, slots=True, kw_only=True)
class CoordinatorConfig:
    num_partitions: int = 50
    replication_factor: int = 3
    segment_bytes: int = 104_857_600
    offset_metadata_max_bytes: int = 4096
    group: GroupConfig = field(default_factory=GroupConfig)
    # Conditional writes lost to other handlers before an operation gives up (retriable).
    max_update_attempts: int = 200
    # How long a write may wait to be replicated to the ISR (Kafka's offsets.commit.timeout.ms)
    # before the request fails with COORDINATOR_NOT_AVAILABLE.
    commit_timeout_ms: int = 5000


class Clock(Protocol):
    def __call__(self) -> int: ...


def wall_clock_ms() -> int:
    return int(time.time() * 1000)


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode``: over UTF-16 code units, 32-bit wrapping."""
    data = text.encode("utf-16-be")
    h = 0
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for(group_id: str, partitions: int) -> int:
    """Kafka's ``Utils.abs(groupId.hashCode) % partitions`` (abs of MIN_VALUE is 0)."""
    h = java_string_hash(group_id)
    return (0 if h == -(1 << 31) else abs(h)) % partitions


def member_key(group_id: str, member_id: str) -> str:
    """The session timer key of a member (or pending member id) of a group."""
    return f"member:{len(group_id)}:{group_id}{member_id}"


def parse_member_key(key: str) -> tuple[str, str] | None:
    if not key.startswith("member:"):
        return None
    length, sep, rest = key[len("member:"):].partition(":")
    if not sep or not length.isdigit() or int(length) > len(rest):
        return None
    size = int(length)
    return rest[:size], rest[size:]


def deadline_key(group_id: str) -> str:
    """The timer key of a group's rebalance deadline (join phase or pending SyncGroups)."""
    return f"rebalance:{len(group_id)}:{group_id}"


def parse_deadline_key(key: str) -> str | None:
    if not key.startswith("rebalance:"):
        return None
    length, sep, rest = key[len("rebalance:"):].partition(":")
    if not sep or not length.isdigit() or int(length) != len(rest):
        return None
    return rest


def group_key(topic_id: str | None, group_id: str) -> str:
    """The purgatory key JoinGroup and SyncGroup waiters of a group park on."""
    return f"group:{(topic_id or '')[:8]}:{group_id}"


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupChange:
    """The outcome of a group update: the change function's result, the group before and
    after (None: absent), and the partition's end after the update."""

    result: object
    before: Group | None
    after: Group | None
    end: int


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupListing:
    group_id: str
    protocol_type: str
    state: GroupState


class GroupCoordinator:
    """Group and offset operations over the offsets topic, the purgatory and the metadata."""

    def __init__(
        self,
        cache: MetadataCache,
        log_nodes: LogClient,
        controller: Controller,
        purgatory: Purgatory,
        timers: SessionTimers,
        config: CoordinatorConfig | None = None,
        clock: Clock = wall_clock_ms,
    ) -> None:
        self._cache = cache
        self._log_nodes = log_nodes
        self._controller = controller
        self._purgatory = purgatory
        self._timers = timers
        self.config = config or CoordinatorConfig()
        self._clock = clock
        self._partitions: dict[tuple[str | None, int], OffsetsPartition] = {}
        self._creation: asyncio.Task[TopicInfo | None] | None = None
        self._background: set[asyncio.Task[None]] = set()
        self._expiries = asyncio.Semaphore(MAX_PARALLEL_EXPIRIES)

    @property
    def group_config(self) -> GroupConfig:
        return self.config.group

    def now(self) -> int:
        """The coordinator's clock (wall-clock milliseconds)."""
        return self._clock()

    # -- the offsets topic ----------------------------------------------------------------

    async def _metadata(self) -> ClusterMetadata:
        try:
            return await self._cache.current()
        except MetadataUnavailableError as exc:
            raise CoordinatorError(COORDINATOR_NOT_AVAILABLE, str(exc)) from exc

    async def offsets_topic(self, create: bool) -> tuple[ClusterMetadata, TopicInfo | None]:
        """The offsets topic as metadata shows it (looked up afresh when missing), created
        first when ``create`` and it does not exist."""
        metadata = await self._metadata()
        topic = metadata.topic(OFFSETS_TOPIC)
        if topic is None:
            metadata = await self._cache.refresh()
            topic = metadata.topic(OFFSETS_TOPIC)
        if topic is None and create:
            if self._creation is None or self._creation.done():
                self._creation = asyncio.ensure_future(self._create_offsets_topic())
            await asyncio.shield(self._creation)
            metadata = await self._metadata()
            topic = metadata.topic(OFFSETS_TOPIC)
        return metadata, topic

    async def _create_offsets_topic(self) -> TopicInfo | None:
        metadata = await self._metadata()
        live = len(metadata.live_nodes())
        if live == 0:
            return None
        config = self.config
        topic = NewTopic(
            name=OFFSETS_TOPIC, num_partitions=config.num_partitions,
            replication_factor=min(config.replication_factor, live),
            configs={"cleanup.policy": "compact", "segment.bytes": str(config.segment_bytes),
                     "compression.type": "producer"})
        try:
            results = await self._controller.create_topics([topic], validate_only=False,
                                                           time_limit=CREATE_TOPIC_TIMEOUT_S)
        except CallError as exc:
            log.warning("creating %s failed: %s", OFFSETS_TOPIC, exc)
            return None
        for result in results:
            if result.error_code and result.error_code != TOPIC_ALREADY_EXISTS:
                log.warning("creating %s failed: error %d %s", OFFSETS_TOPIC,
                            result.error_code, result.error_message or "")
            else:
                log.info("created %s with %d partitions", OFFSETS_TOPIC, config.num_partitions)
        return (await self._cache.refresh()).topic(OFFSETS_TOPIC)

    async def find_coordinator(self, group_id: str) -> tuple[int, int]:
        """(error, node id) of the coordinator of ``group_id``, creating the offsets topic on
        first need (COORDINATOR_NOT_AVAILABLE while it cannot be had)."""
        try:
            metadata, topic = await self.offsets_topic(create=True)
        except CoordinatorError as exc:
            return exc.code, -1
        if topic is None or not topic.partitions:
            return COORDINATOR_NOT_AVAILABLE, -1
        info = topic.partitions.get(partition_for(group_id, len(topic.partitions)))
        if info is None or metadata.live_node(info.leader) is None:
            return COORDINATOR_NOT_AVAILABLE, -1
        return NONE, info.leader

    async def coordinator_error(self, group_id: str, broker_id: int | None) -> int:
        """NOT_COORDINATOR when the client sent a group's request to a live broker (log node)
        that does not lead the group's partition (Kafka's check); 0 when it does, or when the
        broker is not known (a direct call). Any handler could serve the request, but clients
        must keep talking to the coordinator they found, as Kafka's do.

        A request that reached the port of a broker that is not alive is served: the
        frontend keeps serving every broker's port, so a client's connection to a dead
        broker stays up, and clients that cache a group's coordinator for as long as its
        connection is up (librdkafka's admin API: a NOT_COORDINATOR inside a response does
        not evict its cache) would otherwise be told NOT_COORDINATOR until they restart.
        Serving is safe: the group lives in its partition, whose leader every handler
        writes to. Clients that look the coordinator up again are sent to the new one."""
        if broker_id is None:
            return NONE
        metadata, topic = await self.offsets_topic(create=False)
        if metadata.live_node(broker_id) is None:
            return NONE
        if topic is None or not topic.partitions:
            return NOT_COORDINATOR
        info = topic.partitions.get(partition_for(group_id, len(topic.partitions)))
        if info is None or info.leader != broker_id:
            return NOT_COORDINATOR
        return NONE

    async def not_coordinator(self, group_id: str, broker_id: int | None) -> int:
        """:meth:`coordinator_error`, with the reason the coordinator is unknown as the error
        when it is; an empty group id is left to the API's own check (INVALID_GROUP_ID where
        Kafka gives it)."""
        if not group_id:
            return NONE
        try:
            return await self.coordinator_error(group_id, broker_id)
        except CoordinatorError as exc:
            return exc.code

    def leads(self, metadata: ClusterMetadata, topic: TopicInfo, partition: int,
              broker_id: int | None) -> bool:
        """Whether ``broker_id`` leads an offsets partition (any broker when unknown)."""
        if broker_id is None:
            return True
        info = topic.partitions.get(partition)
        return info is not None and info.leader == broker_id

    async def _locate(self, group_id: str) -> tuple[OffsetsPartition, Leader, str]:
        """The store and leader of the group's partition, and the key its waiters park on."""
        metadata, topic = await self.offsets_topic(create=False)
        if topic is None or not topic.partitions:
            raise CoordinatorError(COORDINATOR_NOT_AVAILABLE, f"{OFFSETS_TOPIC} does not exist")
        partition = partition_for(group_id, len(topic.partitions))
        store, leader = self._partition(metadata, topic, partition)
        return store, leader, group_key(topic.topic_id, group_id)

    def _partition(self, metadata: ClusterMetadata, topic: TopicInfo,
                   partition: int) -> tuple[OffsetsPartition, Leader]:
        info = topic.partitions.get(partition)
        node = metadata.live_node(info.leader) if info is not None else None
        if info is None or node is None:
            raise CoordinatorError(COORDINATOR_NOT_AVAILABLE,
                                   f"{OFFSETS_TOPIC}-{partition} has no live leader")
        key = (topic.topic_id, partition)
        store = self._partitions.get(key)
        if store is None:
            store = self._partitions[key] = OffsetsPartition(OFFSETS_TOPIC, partition,
                                                             self._log_nodes)
        return store, Leader(node=node, epoch=info.leader_epoch)

    async def _refresh(self, store: OffsetsPartition, leader: Leader) -> PartitionState:
        first = not store.loaded
        try:
            state = await store.refresh(leader)
        except PartitionUnavailableError as exc:
            raise CoordinatorError(_unavailable_code(exc), str(exc)) from exc
        if first:
            self._spawn(self._arm_all(state))
        return state

    # -- reading and updating -------------------------------------------------------------

    async def read(self, group_id: str) -> PartitionState:
        """The fresh state of the partition holding ``group_id`` (read-only)."""
        store, leader, _ = await self._locate(group_id)
        async with store.lock:
            return await self._refresh(store, leader)

    async def update(
        self, group_id: str,
        change: Callable[[PartitionState, int], tuple[Sequence[tuple[bytes, bytes | None]], T]],
    ) -> tuple[T, int]:
        """Apply ``change(fresh state, now) -> (records, result)`` to the partition of
        ``group_id``: the records are appended only if nothing else was appended since the
        state was read, else the change is computed again. Returns (result, end after)."""
        for attempt in range(self.config.max_update_attempts):
            store, leader, _ = await self._locate(group_id)
            async with store.lock:
                state = await self._refresh(store, leader)
                now = self._clock()
                records, result = change(state, now)
                if not records:
                    return result, state.end
                try:
                    appended = await store.append(leader, records, now)
                except PartitionUnavailableError as exc:
                    raise CoordinatorError(_unavailable_code(exc), str(exc)) from exc
                end = store.state.end
            if appended is not None:
                GROUP_WRITES.labels("appended").inc()
                if appended.high_watermark < appended.log_end_offset:
                    await self._await_replicated(store.partition, appended.log_end_offset,
                                                 appended.leader_epoch)
                return result, end
            GROUP_WRITES.labels("conflict").inc()
            # Lost to another handler: back off a little (more with each loss) and retry.
            await asyncio.sleep(random.uniform(0, min(0.001 * (attempt + 1), 0.05)))
        raise CoordinatorError(COORDINATOR_NOT_AVAILABLE,
                               f"group {group_id}: too many concurrent updates")

    async def update_group(self, group_id: str,
                           change: Callable[[Group, int], T]) -> GroupChange:
        """Apply ``change(group, now)`` to a copy of the group (a new Empty group when it does
        not exist) and write it if it changed; wake the group's waiters when the change
        matters to them."""

        def compute(state: PartitionState, now: int):
            before = state.group(group_id)
            work = before.copy() if before is not None else Group(group_id=group_id)
            result = change(work, now)
            unchanged = work == before if before is not None else work == Group(
                group_id=group_id)
            records = [] if unchanged else [group_record(group_id, work)]
            return records, (result, before, None if unchanged and before is None else work)

        (result, before, after), end = await self.update(group_id, compute)
        if after is not None and before is not None and after.generation > before.generation:
            GROUP_REBALANCES.inc()
        if after is not None and _matters_to_waiters(before or Group(group_id=group_id), after):
            await self._signal(group_id, end)
        await self._follow_deadline(group_id, before, after)
        return GroupChange(result=result, before=before, after=after, end=end)

    async def _follow_deadline(self, group_id: str, before: Group | None,
                               after: Group | None) -> None:
        """Arm the group's deadline timer for a new deadline, disarm it when there is none."""
        old = before.deadline_ms() if before is not None else -1
        new = after.deadline_ms() if after is not None else -1
        if new == old:
            return
        if new >= 0:
            await self.arm({deadline_key(group_id):
                            max(new - self._clock(), 0) + DEADLINE_SLACK_MS})
        else:
            await self.disarm([deadline_key(group_id)])

    async def _await_replicated(self, partition: int, end: int, leader_epoch: int) -> None:
        """Wait until the partition's high watermark reaches ``end`` (Kafka's coordinator
        writes with acks=all), on the key of the leader epoch that stored the write, as an
        acks=all produce does: a later leader, whose log may lack the write, never completes
        it. Without a purgatory the write stands as the leader has it."""
        key = (epoch_key(OFFSETS_TOPIC, partition, leader_epoch) if leader_epoch >= 0
               else partition_key(OFFSETS_TOPIC, partition))
        try:
            with parked():
                outcome = await self._purgatory.wait(WaitKind.PRODUCE, {key: end}, True,
                                                     self.config.commit_timeout_ms)
        except CallError as exc:
            log.debug("cannot wait for %s to be replicated: %s", key, exc)
            return
        state = outcome.keys.get(key)
        if state is not None and state.error_code:
            raise CoordinatorError(NOT_COORDINATOR if state.error_code ==
                                   NOT_LEADER_OR_FOLLOWER else COORDINATOR_NOT_AVAILABLE,
                                   f"{key}: error {state.error_code} while replicating")
        if not outcome.completed:
            raise CoordinatorError(COORDINATOR_NOT_AVAILABLE,
                                   f"{key}: not replicated within "
                                   f"{self.config.commit_timeout_ms} ms")

    async def _signal(self, group_id: str, end: int) -> None:
        """Wake the group's parked JoinGroup/SyncGroup requests: the group changed at ``end``."""
        try:
            _, _, key = await self._locate(group_id)
            await self._timers.complete({key: end})
        except (CoordinatorError, CallError) as exc:
            log.debug("could not wake waiters of group %s: %s", group_id, exc)

    async def _wait(self, group_id: str, threshold: int, timeout_ms: float) -> int:
        """Park until the group's key reaches ``threshold`` or ``timeout_ms`` passes; returns
        the last position reported for the key (-1 if unknown)."""
        timeout_ms = max(int(timeout_ms), 1)
        _, _, key = await self._locate(group_id)
        try:
            with parked():
                result = await self._purgatory.wait(WaitKind.JOIN, {key: threshold}, False,
                                                    timeout_ms)
        except CallError:
            await asyncio.sleep(min(timeout_ms / 1000, POLL_INTERVAL_S))
            return -1
        state = result.keys.get(key)
        return state.position if state is not None else -1

    # -- sessions -------------------------------------------------------------------------

    async def arm(self, deadlines: Mapping[str, int]) -> None:
        if not deadlines:
            return
        try:
            await self._timers.schedule(deadlines)
        except CallError as exc:
            log.debug("could not arm session timers: %s", exc)

    async def disarm(self, keys: Sequence[str]) -> None:
        if not keys:
            return
        try:
            await self._timers.unschedule(keys)
        except CallError as exc:
            log.debug("could not disarm session timers: %s", exc)

    async def _arm_member(self, group: Group, member_id: str) -> None:
        member = group.members.get(member_id)
        if member is not None:
            await self.arm({member_key(group.group_id, member_id): member.session_timeout_ms})

    def _deadlines_of(self, state: PartitionState) -> dict[str, int]:
        now = self._clock()
        deadlines = {}
        for group in state.groups.values():
            deadline = group.deadline_ms()
            if deadline >= 0:
                deadlines[deadline_key(group.group_id)] = \
                    max(deadline - now, 0) + DEADLINE_SLACK_MS
            for member in group.members.values():
                deadlines[member_key(group.group_id, member.member_id)] = \
                    member.session_timeout_ms
            for member_id, expires in group.pending_members.items():
                deadlines[member_key(group.group_id, member_id)] = max(expires - now, 0)
        return deadlines

    async def _arm_all(self, state: PartitionState) -> None:
        await self.arm(self._deadlines_of(state))

    async def rearm_known_members(self) -> None:
        """Arm the timers of every member of every partition this handler has loaded (the
        purgatory may have restarted and forgotten them)."""
        deadlines: dict[str, int] = {}
        for store in list(self._partitions.values()):
            if store.loaded:
                deadlines.update(self._deadlines_of(store.state))
        await self.arm(deadlines)

    async def expire(self, key: str) -> None:
        """A session timer ran out: remove its member (or pending member) unless it is alive
        after all (armed again since, or kept alive by the group's state, in which case its
        timer is armed for as long as that lasts)."""
        deadline_group = parse_deadline_key(key)
        if deadline_group is not None:
            await self._expire_deadline(deadline_group)
            return
        parsed = parse_member_key(key)
        if parsed is None:
            return
        group_id, member_id = parsed
        config = self.group_config

        def change(group: Group, now: int) -> tuple[Expiry, int]:
            member = group.members.get(member_id)
            alive_ms = group.keep_alive_ms(member, now) if member is not None else 0
            return group.expire(member_id, now, config), alive_ms

        try:
            # An expiry is news from the past: if the member showed a sign of life since (its
            # timer is armed again), it stays. Unreachable: the expiry is all there is to go by.
            if key in await self._timers.armed([key]):
                GROUP_SESSION_EXPIRIES.labels("rearmed").inc()
                return
        except CallError as exc:
            log.debug("could not check the session timer %s: %s", key, exc)
        try:
            state = await self.read(group_id)
            if group_id not in state.groups:
                return
            outcome = await self.update_group(group_id, change)
        except CoordinatorError as exc:
            log.warning("session expiry of %s in group %s: %s", member_id, group_id, exc)
            return
        expiry, timeout = outcome.result  # type: ignore[misc]
        GROUP_SESSION_EXPIRIES.labels(expiry.value).inc()
        if expiry is Expiry.KEEP_ALIVE:
            await self.arm({key: timeout})
        elif expiry is Expiry.REMOVED:
            log.info("member %s of group %s left: session timeout", member_id, group_id)

    async def _expire_deadline(self, group_id: str) -> None:
        """A group's deadline timer ran out: act on the deadline if it has passed (re-arm the
        timer if it moved later; nothing if the group has none any more)."""
        try:
            state = await self.read(group_id)
            group = state.group(group_id)
            if group is None:
                return
            deadline = group.deadline_ms()
            now = self._clock()
            if deadline < 0:
                return
            if now < deadline:
                await self.arm({deadline_key(group_id): deadline - now + DEADLINE_SLACK_MS})
                return
            await self._act_on_deadline(group_id, "timer")
        except CoordinatorError as exc:
            log.warning("rebalance deadline of group %s: %s", group_id, exc)

    async def _act_on_deadline(self, group_id: str, why: str) -> GroupChange:
        config = self.group_config
        change = await self.update_group(group_id,
                                         lambda g, now: g.on_deadline(now, config))
        removed: list[str] = change.result  # type: ignore[assignment]
        if not removed:
            return change
        await self.disarm([member_key(group_id, m) for m in removed])
        before = change.before
        phase = "rejoin" if before is not None and \
            before.state is GroupState.PREPARING_REBALANCE else "sync"
        log.info("group %s: removed %s, no %s within the rebalance timeout (%s)", group_id,
                 ", ".join(removed), "JoinGroup" if phase == "rejoin" else "SyncGroup", why)
        return change

    async def follow_expirations(self, backoff_initial: float = 0.1,
                                 backoff_max: float = 2.0) -> None:
        """Remove members whose sessions expire, for the handler's whole life: follows the
        purgatory's expiry stream, reconnecting with a backoff; each (re)subscription arms the
        timers of the members this handler knows."""
        delay = backoff_initial
        while True:
            try:
                stream: AsyncIterator[list[str]] = self._timers.watch_expirations()
                async for keys in stream:
                    if not keys:
                        delay = backoff_initial
                        self._spawn(self.rearm_known_members())
                        continue
                    for key in keys:
                        self._spawn(self._expire_bounded(key))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the stream is reopened whatever broke it
                log.debug("session expiry stream broke (%s); reconnecting", exc)
            await asyncio.sleep(delay)
            delay = min(delay * 2, backoff_max)

    async def _expire_bounded(self, key: str) -> None:
        async with self._expiries:
            await self.expire(key)

    def _spawn(self, coroutine: object) -> None:
        task = asyncio.ensure_future(coroutine)  # type: ignore[arg-type]
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def close(self) -> None:
        tasks = list(self._background)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    # -- JoinGroup ------------------------------------------------------------------------

    def _check_session_timeout(self, session_timeout_ms: int) -> bool:
        config = self.group_config
        return config.min_session_timeout_ms <= session_timeout_ms <= \
            config.max_session_timeout_ms

    async def join(self, group_id: str, request: JoinRequest) -> JoinResult:
        """Kafka's JoinGroup: answers at once (errors, MEMBER_ID_REQUIRED, the current
        generation for a member with nothing new), or once the rebalance it joined is over."""
        if not group_id:
            return JoinResult(error=INVALID_GROUP_ID, member_id=request.member_id)
        if not self._check_session_timeout(request.session_timeout_ms):
            return JoinResult(error=INVALID_SESSION_TIMEOUT, member_id=request.member_id)
        config = self.group_config
        change = await self.update_group(
            group_id, lambda group, now: group.join(request, now, config))
        outcome = change.result
        if isinstance(outcome, JoinResult):
            if outcome.error == ErrorCode.member_id_required.value or (
                    outcome.error == NONE and outcome.member_id):
                await self.arm({member_key(group_id, outcome.member_id):
                                request.session_timeout_ms})
            return outcome
        assert isinstance(outcome, JoinWait)
        if change.before is not None and change.after is not None:
            replaced = [m for m in change.before.members if m not in change.after.members]
            await self.disarm([member_key(group_id, m) for m in replaced])
        await self.arm({member_key(group_id, outcome.member_id): request.session_timeout_ms})
        return await self._await_join(group_id, outcome, request, change.end)

    async def _await_join(self, group_id: str, joined: JoinWait, request: JoinRequest,
                          end: int) -> JoinResult:
        config = self.group_config
        member_id = joined.member_id
        waited = joined.generation
        give_up = time.monotonic() + (request.rebalance_timeout_ms +
                                      config.initial_rebalance_delay_ms) / 1000 + 3
        floor = -1
        while True:
            if time.monotonic() > give_up:
                return JoinResult(error=REBALANCE_IN_PROGRESS, member_id=member_id)
            state = await self.read(group_id)
            group = state.group(group_id)
            if group is None or member_id not in group.members:
                fenced = group is not None and group.is_static_member_fenced(
                    request.group_instance_id, member_id)
                return JoinResult(error=ErrorCode.fenced_instance_id.value if fenced
                                  else UNKNOWN_MEMBER_ID, member_id=member_id)
            if group.generation > waited and group.state in (
                    GroupState.COMPLETING_REBALANCE, GroupState.STABLE):
                await self._arm_member(group, member_id)
                return group.join_answer(member_id)
            now = self._clock()
            timeout_ms = POLL_INTERVAL_S * 1000
            if group.state is GroupState.PREPARING_REBALANCE:
                member = group.members[member_id]
                if not member.joined or now >= group.join_deadline_ms:
                    # A newer rebalance this member must join too, or a join phase whose
                    # deadline passed: act on it (whoever's write lands first wins).
                    change = await self.update_group(
                        group_id, lambda g, t: _rejoin_or_complete(g, member_id, t, config))
                    if isinstance(change.result, JoinWait):
                        waited = change.result.generation
                    continue
                timeout_ms = group.join_deadline_ms - now + DEADLINE_SLACK_MS
            timeout_ms = min(timeout_ms, (give_up - time.monotonic()) * 1000)
            position = await self._wait(group_id, max(state.end + 1, floor + 1), timeout_ms)
            floor = max(floor, position)

    # -- SyncGroup ------------------------------------------------------------------------

    async def sync(self, group_id: str, member_id: str, group_instance_id: str | None,
                   generation: int, protocol_type: str | None, protocol_name: str | None,
                   assignments: Mapping[str, bytes]) -> SyncResult:
        if not group_id:
            return SyncResult(error=INVALID_GROUP_ID)
        change = await self.update_group(
            group_id, lambda group, now: group.sync(
                member_id, group_instance_id, generation, protocol_type, protocol_name,
                dict(assignments), now))
        outcome = change.result
        if isinstance(outcome, SyncResult):
            if outcome.error == NONE and change.after is not None:
                await self._arm_member(change.after, member_id)
            return outcome
        assert isinstance(outcome, SyncWait)
        return await self._await_sync(group_id, member_id, group_instance_id, outcome,
                                      change.end)

    async def _await_sync(self, group_id: str, member_id: str, group_instance_id: str | None,
                          waiting: SyncWait, end: int) -> SyncResult:
        state = await self.read(group_id)
        group = state.group(group_id)
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
                return SyncResult(error=REBALANCE_IN_PROGRESS)
            position = await self._wait(group_id, max(threshold, floor + 1), remaining_ms)
            floor = max(floor, position)
            state = await self.read(group_id)
            threshold = state.end + 1
            group = state.group(group_id)
            if group is None:
                return SyncResult(error=UNKNOWN_MEMBER_ID)
            error = group.validate_member(member_id, group_instance_id)
            if error:
                return SyncResult(error=error)
            if group.generation != waiting.generation or \
                    group.state is not GroupState.COMPLETING_REBALANCE and \
                    group.state is not GroupState.STABLE:
                return SyncResult(error=REBALANCE_IN_PROGRESS)
            if group.state is GroupState.STABLE:
                await self._arm_member(group, member_id)
                return group.sync_answer(member_id)

    # -- Heartbeat, LeaveGroup ------------------------------------------------------------

    async def heartbeat(self, group_id: str, member_id: str, group_instance_id: str | None,
                        generation: int) -> int:
        if not group_id:
            return INVALID_GROUP_ID
        state = await self.read(group_id)
        group = state.group(group_id) or Group(group_id=group_id)
        error = group.heartbeat(member_id, group_instance_id, generation)
        if error in (NONE, REBALANCE_IN_PROGRESS):
            await self._arm_member(group, member_id)
        deadline = group.deadline_ms()
        if deadline >= 0 and self._clock() >= deadline:
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
        config = self.group_config
        change = await self.update_group(group_id,
                                         lambda group, now: group.leave(members, now, config))
        if change.before is not None and change.after is not None:
            gone = [m for m in (*change.before.members, *change.before.pending_members)
                    if m not in change.after.members and m not in change.after.pending_members]
            await self.disarm([member_key(group_id, m) for m in gone])
        return change.result  # type: ignore[return-value]

    # -- offsets --------------------------------------------------------------------------

    async def commit_offsets(
        self, group_id: str, member_id: str, group_instance_id: str | None, generation: int,
        offsets: Mapping[TopicPartition, CommittedOffset],
    ) -> int:
        """Store offsets for a group's member (or, with no generation, for a group outside
        group management); returns the error for every partition of the commit."""
        if not group_id:
            return INVALID_GROUP_ID

        def change(state: PartitionState, now: int) -> tuple[list, tuple[int, Group | None]]:
            group = state.group(group_id)
            if group is None:
                if generation >= 0 and not state.exists(group_id):
                    return [], (ILLEGAL_GENERATION, None)
                group = Group(group_id=group_id)
            error = group.validate_offset_commit(member_id, group_instance_id, generation)
            if error or not offsets:
                return [], (error, group)
            records = [offset_record(group_id, tp, offset) for tp, offset in offsets.items()]
            return records, (NONE, group)

        (error, group), _ = await self.update(group_id, change)
        if group is not None and member_id and error in (NONE, REBALANCE_IN_PROGRESS):
            await self._arm_member(group, member_id)
        return error

    async def fetch_offsets(
        self, group_id: str, partitions: Sequence[TopicPartition] | None,
    ) -> dict[TopicPartition, CommittedOffset | None]:
        """Committed offsets of the named partitions (None: not committed), or of all."""
        state = await self.read(group_id)
        committed = state.group_offsets(group_id)
        if partitions is None:
            return dict(committed)
        return {tp: committed.get(tp) for tp in partitions}

    async def delete_offsets(
        self, group_id: str, partitions: Sequence[TopicPartition],
    ) -> tuple[int, dict[TopicPartition, int]]:
        """Kafka's OffsetDelete: (group error, error per partition)."""

        def change(state: PartitionState, now: int):
            group = state.group(group_id)
            if group is None and not state.exists(group_id):
                return [], (GROUP_ID_NOT_FOUND, {})
            group = group or Group(group_id=group_id)
            errors: dict[TopicPartition, int] = {}
            if group.state is not GroupState.EMPTY:
                if group.protocol_type != "consumer":
                    return [], (NON_EMPTY_GROUP, {})
                subscribed = group.subscribed_topics() or set()
                for tp in partitions:
                    if tp[0] in subscribed:
                        errors[tp] = GROUP_SUBSCRIBED_TO_TOPIC
            committed = state.group_offsets(group_id)
            records = []
            for tp in partitions:
                if tp in errors:
                    continue
                errors[tp] = NONE
                if tp in committed:
                    records.append(offset_record(group_id, tp, None))
            return records, (NONE, errors)

        result, _ = await self.update(group_id, change)
        return result

    # -- groups as a whole ----------------------------------------------------------------

    async def describe(self, group_id: str) -> Group | None:
        """The group (an Empty one if it only has offsets), or None if it does not exist."""
        state = await self.read(group_id)
        group = state.group(group_id)
        if group is None and state.exists(group_id):
            group = Group(group_id=group_id)
        return group

    async def delete_group(self, group_id: str) -> int:
        """Kafka's DeleteGroups for one group: its record and offsets go (tombstones)."""
        if not group_id:
            return INVALID_GROUP_ID

        def change(state: PartitionState, now: int) -> tuple[list, int]:
            group = state.group(group_id)
            if group is None and not state.exists(group_id):
                return [], GROUP_ID_NOT_FOUND
            if group is not None and group.state is not GroupState.EMPTY:
                return [], NON_EMPTY_GROUP
            records = [offset_record(group_id, tp, None)
                       for tp in state.group_offsets(group_id)]
            if group is not None:
                records.append(group_record(group_id, None))
            return records, NONE

        result, _ = await self.update(group_id, change)
        return result

    async def list_groups(self, broker_id: int | None = None) -> list[GroupListing]:
        """Every group of the offsets partitions ``broker_id`` leads (all when None)."""
        metadata, topic = await self.offsets_topic(create=False)
        if topic is None:
            return []

        async def groups_of(partition: int) -> list[GroupListing]:
            store, leader = self._partition(metadata, topic, partition)
            async with store.lock:
                state = await self._refresh(store, leader)
            listings = []
            for group_id in sorted(state.group_ids()):
                group = state.group(group_id)
                if group is None:
                    listings.append(GroupListing(group_id=group_id, protocol_type="",
                                                 state=GroupState.EMPTY))
                else:
                    listings.append(GroupListing(group_id=group_id,
                                                 protocol_type=group.protocol_type or "",
                                                 state=group.state))
            return listings

        found = await asyncio.gather(*(groups_of(p) for p in sorted(topic.partitions)
                                       if self.leads(metadata, topic, p, broker_id)))
        return [listing for listings in found for listing in listings]


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


def _unavailable_code(exc: PartitionUnavailableError) -> int:
    return NOT_COORDINATOR if exc.code == NOT_LEADER_OR_FOLLOWER else COORDINATOR_NOT_AVAILABLE
