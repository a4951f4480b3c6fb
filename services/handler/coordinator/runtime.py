"""The coordinator runtime: a coordinator whose state is records in an internal compacted
topic, run by stateless handlers (the idea of Kafka's ``CoordinatorRuntime``). It knows keys,
partitions, records and timers, never what a coordinator coordinates.

- Placement and state: a key lives in one partition of the internal topic (:mod:`.placement`),
  whose state is replayed from its records and read to the log end before every use
  (:mod:`.partition`).
- Changes (:meth:`CoordinatorRuntime.update`): compute the change on the fresh state (records
  to append and a result), append the records only if the log end is still the one read, else
  read and compute again (another handler won: handlers are serialised as one process's lock
  would), then wait until the high watermark covers the write (acks=all) before answering.
  The leader holds its answer for that, up to ``leader_wait_ms``, as it does for an acks=all
  produce, so that a write replicated meanwhile needs no wait in the purgatory; the partition's
  lock stays held meanwhile. A write not replicated in that time waits in the purgatory (the
  lock released), and the partition's next writes for :data:`HOLD_PAUSE_S` do not ask the
  leader to hold, so that a stalled follower does not queue every write of the partition
  behind the hold of the one before.
- Waits (:meth:`~CoordinatorRuntime.wait`, :meth:`~CoordinatorRuntime.signal`): an operation
  parks in the purgatory on its key's waiter key (``<kind>:<topic id>:<key>``) until a writer
  signals a change there with the partition's new end, or its timeout passes, then reads again
  and decides. Without a purgatory waiters look again every :data:`POLL_INTERVAL_S`.
- Timers (:meth:`~CoordinatorRuntime.arm`, :meth:`~CoordinatorRuntime.follow_expirations`):
  the purgatory's timers by key. Every handler hears every expiry and acts on it with a
  conditional write, so exactly one of them does. Timers are soft state: those a state implies
  (``timers_of``) are armed again when a handler first loads a partition and whenever the
  expiry stream (re)connects, so a purgatory restart loses none.

Coordinators plug in with only their own parts (the group coordinator on
``__consumer_offsets`` and the transaction coordinator on ``__transaction_state`` do): an
internal topic (a ``NewTopic`` for a :class:`~.placement.Placement`; keys placed by the Java
string hash); a state type constructed without arguments whose ``replay(key, value)`` applies
one record, decoded with its record types from the schema table (``coordinator_records``), and
which may also take part in transactions (:class:`~.partition.TransactionalCoordinatorState`:
records with their producer, and COMMIT/ABORT markers); its operations as change functions
``(state, now) -> (records, result)`` given to :meth:`~CoordinatorRuntime.update`, records
encoded with the same table (or a :class:`~.partition.TransactionalRecords` to write them in a
producer's transaction); ``timers_of(state, now)`` naming the timers its state implies, and a
handler of expired keys given to :meth:`~CoordinatorRuntime.follow_expirations` (it ignores
keys that are not its own). Parked requests use :meth:`~CoordinatorRuntime.wait` and
:meth:`~CoordinatorRuntime.signal` on its keys; :meth:`~CoordinatorRuntime.leader_epoch` is a
key's coordinator epoch.

Clocks: ``now`` is wall-clock milliseconds; deadlines stored in records mean the same on
every handler only if their clocks agree to well within the coordinator's timeouts.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Generic, TypeVar

from kbroker.purgatory.v1 import purgatory_pb2
from services.common.errors import ErrorCode, NotEnoughReplicasError

from ..collaborators import CallError, LogNodes, Purgatory
from ..metadata_cache import Backoff, ClusterMetadata, TopicInfo
from ..metrics import parked
from ..routing import replication_key
from .partition import CoordinatorPartition, Leader, Records, S, TransactionalRecords
from .placement import COORDINATOR_NOT_AVAILABLE, CoordinatorError, Placement, leader_error

log = logging.getLogger(__name__)

T = TypeVar("T")

# Without a purgatory, waiters look again this often.
POLL_INTERVAL_S = 0.2
MAX_PARALLEL_EXPIRIES = 64
# Conditional writes lost to other handlers before an operation gives up (retriable).
MAX_UPDATE_ATTEMPTS = 200
# How long a write may wait to be replicated to the ISR (Kafka's offsets.commit.timeout.ms)
# before the operation fails with COORDINATOR_NOT_AVAILABLE.
COMMIT_TIMEOUT_MS = 5000
# How long after a write the leader did not see replicated within its hold the partition's
# writes wait in the purgatory instead.
HOLD_PAUSE_S = 1.0


def wall_clock_ms() -> int:
    return int(time.time() * 1000)


def _check_isr(store: CoordinatorPartition[Any], isr: Sequence[int], required: int) -> None:
    """A write replicated to ``isr`` (empty: not known) stands only if that is at least
    ``required`` replicas (min.insync.replicas), else COORDINATOR_NOT_AVAILABLE."""
    if isr and len(isr) < required:
        raise CoordinatorError(COORDINATOR_NOT_AVAILABLE, NotEnoughReplicasError(
            isr, required, store.topic, store.partition,
            ErrorCode.not_enough_replicas_after_append).message)


async def _best_effort(call: Awaitable[T], what: str, otherwise: T) -> T:
    """What ``call`` gives, or ``otherwise`` when it fails (a purgatory that is down)."""
    try:
        return await call
    except CallError as exc:
        log.debug("could not %s: %s", what, exc)
        return otherwise


class CoordinatorRuntime(Generic[S]):
    """Reads, changes, waits and timers of one coordinator's internal topic.

    ``new_state`` makes the empty state of a partition; ``kind`` names the coordinator in its
    waiter keys; ``timers_of(state, now)`` gives the timers (key -> timeout ms) a partition's
    state implies; ``writes`` (a counter labelled by outcome) counts appends and conflicts;
    ``leader_wait_ms``: how long a leader may hold the answer to a write for its replication
    (0: the purgatory waits for every write)."""

    def __init__(
        self,
        placement: Placement,
        log_nodes: LogNodes,
        purgatory: Purgatory,
        new_state: Callable[[], S],
        *,
        kind: str,
        timers_of: Callable[[S, int], Mapping[str, int]] | None = None,
        writes: Any = None,
        leader_wait_ms: int = 0,
    ) -> None:
        self.placement = placement
        self._log_nodes = log_nodes
        self._purgatory = purgatory
        self._new_state = new_state
        self._kind = kind
        self._timers_of = timers_of
        self._writes = writes
        self._leader_wait_ms = min(leader_wait_ms, COMMIT_TIMEOUT_MS)
        self.now = wall_clock_ms
        self._partitions: dict[tuple[str | None, int], CoordinatorPartition[S]] = {}
        self._background: set[asyncio.Task[None]] = set()
        self._expiries = asyncio.Semaphore(MAX_PARALLEL_EXPIRIES)

    # -- partitions ---------------------------------------------------------------------------

    async def _locate(self, key: str) -> tuple[CoordinatorPartition[S], Leader, str]:
        """The partition of ``key``, its leader, and the key its waiters park on."""
        metadata, topic = await self.placement.topic(create=False)
        if topic is None or not topic.partitions:
            raise CoordinatorError(COORDINATOR_NOT_AVAILABLE,
                                   f"{self.placement.spec.name} does not exist")
        store, leader = self._partition(metadata, topic, self.placement.partition_of(topic, key))
        return store, leader, f"{self._kind}:{(topic.topic_id or '')[:8]}:{key}"

    def _partition(self, metadata: ClusterMetadata, topic: TopicInfo,
                   partition: int) -> tuple[CoordinatorPartition[S], Leader]:
        info, node = self.placement.leader(metadata, topic, partition)
        store = self._partitions.get((topic.topic_id, partition))
        if store is None:
            store = self._partitions[(topic.topic_id, partition)] = CoordinatorPartition(
                topic.name, partition, self._log_nodes, self._new_state)
        store.min_insync_replicas = topic.min_insync_replicas  # as the topic has it now
        return store, Leader(node=node, epoch=info.leader_epoch)

    async def _refresh(self, store: CoordinatorPartition[S], leader: Leader) -> S:
        first = not store.loaded
        state = await store.refresh(leader)
        if first:
            self._spawn(self.arm(self._implied_timers([state])))
        return state

    async def read(self, key: str) -> S:
        """The fresh state of the partition holding ``key`` (read-only). Raises
        CoordinatorError."""
        return (await self.read_at(key))[0]

    async def read_at(self, key: str) -> tuple[S, int]:
        """:meth:`read`, with the partition's end that state corresponds to."""
        store, leader, _ = await self._locate(key)
        async with store.lock:
            return await self._refresh(store, leader), store.end

    async def leader_epoch(self, key: str) -> int:
        """The leader epoch of the partition holding ``key``, as this handler's metadata has
        it (the coordinator epoch, for a coordinator that must fence its predecessors' writes
        elsewhere). Raises CoordinatorError."""
        return (await self._locate(key))[1].epoch

    async def states_led_by(self, broker_id: int | None) -> list[S]:
        """The fresh states of every partition ``broker_id`` leads (all when None)."""
        metadata, topic = await self.placement.topic(create=False)
        if topic is None:
            return []

        async def fresh(partition: int) -> S:
            store, leader = self._partition(metadata, topic, partition)
            async with store.lock:
                return await self._refresh(store, leader)

        return list(await asyncio.gather(*(
            fresh(p) for p in sorted(topic.partitions)
            if self.placement.leads(topic, p, broker_id))))

    # -- changes ------------------------------------------------------------------------------

    async def update(self, key: str,
                     change: Callable[[S, int], tuple[Records | TransactionalRecords, T]],
                     ) -> tuple[T, int]:
        """Apply ``change(fresh state, now) -> (records, result)`` to the partition of ``key``:
        the records (written as one batch, transactional for :class:`TransactionalRecords`)
        are appended only if nothing else was appended since the state was read, else the
        change is computed again; an append is answered once replicated. Returns (result, the
        partition's end after the change). Raises CoordinatorError.

        The state this handler cached is tried first, without reading the partition (the
        frontends send a partition's requests to one handler, so it is usually current): the
        conditional append proves it was, and a refused one is computed again on the state
        read then. A change that writes nothing is answered only from a state read now."""
        read_first = False
        for attempt in range(MAX_UPDATE_ATTEMPTS):
            store, leader, _ = await self._locate(key)
            async with store.lock:
                cached = not read_first and store.current(leader)
                state = store.state if cached else await self._refresh(store, leader)
                now = self.now()
                records, result = change(state, now)
                entries = records.records if isinstance(records, TransactionalRecords) \
                    else records
                if not entries:
                    if cached:
                        end = store.end
                        await self._refresh(store, leader)
                        if store.end != end:  # the answer was of a state that had moved on
                            read_first = True
                            continue
                    return result, store.end
                required = store.min_insync_replicas  # what the append was checked against
                hold_ms = self._leader_wait_ms if (
                    time.monotonic() >= store.hold_commits_after) else 0
                appended = await store.append(leader, records, now, hold_ms)
                end = store.end
            if appended is not None:
                self._count("appended")
                if appended.high_watermark < appended.log_end_offset:
                    if hold_ms:
                        store.hold_commits_after = time.monotonic() + HOLD_PAUSE_S
                    await self._await_replicated(store, appended.log_end_offset,
                                                 appended.leader_epoch, appended.topic_id,
                                                 required)
                else:  # committed at once, or within the leader's hold
                    _check_isr(store, appended.commit_isr, required)
                return result, end
            read_first = True
            if cached:
                # Another handler wrote since this one last did: read, and compute again.
                self._count("stale")
                continue
            self._count("conflict")
            # Lost to another handler: back off a little (more with each loss) and retry.
            await asyncio.sleep(random.uniform(0, min(0.001 * (attempt + 1), 0.05)))
        raise CoordinatorError(COORDINATOR_NOT_AVAILABLE, f"{key}: too many concurrent updates")

    def _count(self, outcome: str) -> None:
        if self._writes is not None:
            self._writes.labels(outcome).inc()

    async def _await_replicated(self, store: CoordinatorPartition[S], end: int,
                                leader_epoch: int, topic_id: str, required: int) -> None:
        """Wait until the partition's high watermark reaches ``end``, as an acks=all produce
        does (:func:`~..routing.replication_key`), with the leader's ISR then at least
        ``required`` (min.insync.replicas; Kafka's coordinators answer a write that fell short
        COORDINATOR_NOT_AVAILABLE, as one not replicated in time). Without a purgatory the write
        stands as the leader has it."""
        key = replication_key(store.topic, store.partition, leader_epoch, topic_id)
        timeout_ms = COMMIT_TIMEOUT_MS
        try:
            with parked():
                outcome = await self._purgatory.wait(purgatory_pb2.OPERATION_KIND_PRODUCE,
                                                     {key: end}, True, timeout_ms)
        except CallError as exc:
            log.debug("cannot wait for %s to be replicated: %s", key, exc)
            return
        for state in outcome.keys:
            if state.key == key and state.error_code:
                raise leader_error(state.error_code,
                                   f"{key}: error {state.error_code} while replicating")
        if outcome.outcome != purgatory_pb2.OUTCOME_COMPLETED:
            raise CoordinatorError(COORDINATOR_NOT_AVAILABLE,
                                   f"{key}: not replicated within {timeout_ms} ms")
        for state in outcome.keys:
            if state.key == key:
                _check_isr(store, state.isr, required)

    # -- waits --------------------------------------------------------------------------------

    async def signal(self, key: str, end: int) -> None:
        """Wake the operations parked on ``key``: it changed at ``end``. Best effort."""
        try:
            _, _, waiters = await self._locate(key)
            await self._purgatory.complete({waiters: end})
        except (CoordinatorError, CallError) as exc:
            log.debug("could not wake the waiters of %s: %s", key, exc)

    async def wait(self, key: str, threshold: int, timeout_ms: float) -> int:
        """Park until ``key`` is signalled at ``threshold`` or later, or ``timeout_ms``
        passes; returns the last position signalled for it (-1 if unknown)."""
        timeout_ms = max(int(timeout_ms), 1)
        _, _, waiters = await self._locate(key)
        try:
            with parked():
                result = await self._purgatory.wait(purgatory_pb2.OPERATION_KIND_JOIN,
                                                    {waiters: threshold}, False, timeout_ms)
        except CallError:
            await asyncio.sleep(min(timeout_ms / 1000, POLL_INTERVAL_S))
            return -1
        return next((s.position for s in result.keys if s.key == waiters), -1)

    # -- timers -------------------------------------------------------------------------------

    async def arm(self, timeouts: Mapping[str, int]) -> None:
        """Arm or re-arm a timer per key (timeouts in ms). Best effort."""
        if timeouts:
            await _best_effort(self._purgatory.schedule(timeouts), "arm timers", None)

    async def arm_if_absent(self, timeouts: Mapping[str, int]) -> None:
        """Arm a timer per key that has none running (Kafka's ``scheduleIfAbsent``): a
        deadline that repeated requests must not push back. Best effort."""
        if not timeouts:
            return
        running = await _best_effort(self._purgatory.armed(list(timeouts)),
                                     "check timers", None)
        if running is not None:
            await self.arm({k: ms for k, ms in timeouts.items() if k not in running})

    async def disarm(self, keys: Sequence[str]) -> None:
        """Best effort."""
        if keys:
            await _best_effort(self._purgatory.unschedule(keys), "disarm timers", None)

    async def rearmed(self, key: str) -> bool:
        """Whether a timer that ran out has been armed again since (False when unknown): an
        expiry is news from the past, and a sign of life since outweighs it."""
        return key in await _best_effort(self._purgatory.armed([key]), f"check {key}", set())

    def _implied_timers(self, states: Sequence[S]) -> dict[str, int]:
        timeouts: dict[str, int] = {}
        if self._timers_of is not None:
            now = self.now()
            for state in states:
                timeouts.update(self._timers_of(state, now))
        return timeouts

    async def rearm_all(self) -> None:
        """Arm the timers of every partition this handler has loaded (the purgatory may have
        restarted and forgotten them)."""
        loaded = [store.state for store in list(self._partitions.values()) if store.loaded]
        await self.arm(self._implied_timers(loaded))

    async def follow_expirations(self, on_expiry: Callable[[str], Awaitable[None]]) -> None:
        """Hand every timer that runs out to ``on_expiry`` (keys of other coordinators too),
        for the handler's whole life: follows the purgatory's expiry stream, reconnecting with
        a backoff; each (re)subscription re-arms the timers of the loaded partitions."""
        backoff = Backoff()

        async def bounded(key: str) -> None:
            async with self._expiries:
                await on_expiry(key)

        while True:
            try:
                async for keys in self._purgatory.watch_expirations():
                    if not keys:
                        backoff.reset()
                        self._spawn(self.rearm_all())
                    for key in keys:
                        self._spawn(bounded(key))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the stream is reopened whatever broke it
                log.debug("expiry stream broke (%s); reconnecting", exc)
            await asyncio.sleep(backoff.next_delay())

    def _spawn(self, coroutine: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def close(self) -> None:
        tasks = list(self._background)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

