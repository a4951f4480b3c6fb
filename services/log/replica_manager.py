"""The replication side of a log node (the replication half of Kafka's ``ReplicaManager``):
replica states from the replicator, the leader's view of its followers, follower fetches
served and made, ISR changes asked for.

- States (``UpdateReplicaStates``, Kafka's LeaderAndIsr, and the answers to ISR changes): a
  replica becomes leader or follower at a leader epoch (:meth:`PartitionLog.become`); at one
  epoch a state of an older partition epoch is stale and ignored. A leader gets a
  :class:`~services.log.leader_replicas.LeaderReplicas` (started over at a new epoch), a
  follower is fetched for from its leader's node (:mod:`services.log.replica_fetcher`).
- Serving fetches (:meth:`fetch`, a follower's ``ReplicaFetch``): each partition's fetch offset
  is the follower's position; the leader's high watermark moves to the smallest log end offset
  over its maximal ISR at once (and the purgatory hears of it through the partition log's
  listener, completing acks=all produces without any other process), and a follower that
  caught up is proposed for the ISR. Then the batches from the fetch offset to the log end,
  or a long poll until one of the partitions gets an append (or its state changes).
- ISR changes (Kafka's AlterPartition): a leader asks to add a caught-up follower, and every
  ``replica.lag.time.max.ms / 2`` to remove the followers not caught up for longer; one change
  per partition at a time, pending until the replicator answers it on the node's control
  stream (``AlterPartitions``, held open by the active replicator; pending changes are sent
  again to a new one). A leader alone in its ISR stops committing by itself (persisted)
  before it asks to add a follower, so nothing is committed that the follower lacks.
- Throttles: :mod:`services.log.replication_quota` on both sides.

Not thread-safe: one event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable

from kbroker.log.v1 import log_pb2
from services.common.errors import ErrorCode, KafkaError, error_name
from services.common.file_records import is_local, local_host_key
from services.common.tls import PLAINTEXT, InternalTls

from . import metrics
from .leader_replicas import LeaderReplicas
from .log_manager import LogManager
from .partition_log import LOG_END, NO_OFFSET, PartitionLog
from .replica_fetch_session import CachedPartition, ReplicaFetchSession
from .replica_fetcher import STREAM, ReplicaFetcherManager
from .replica_state import FOLLOWER, LEADER, UNKNOWN, copy
from .replication_quota import FOLLOWER as FOLLOWER_SIDE
from .replication_quota import LEADER as LEADER_SIDE
from .replication_quota import ReplicationQuota
from .replication_settings import ReplicationSettings
from .running_clock import RunningClock

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
# A follower fetch's answer: each partition's result (records left out) and its records.
FetchAnswer = list[tuple[log_pb2.ReplicaFetchResult, bytes]]
# An ISR change answered with a retriable error is asked for again after this long.
ISR_RETRY_S = 1.0
# A fetch session's quiet partitions are looked at again (their follower's position recorded
# anew) at least this often, and at least four times in replica.lag.time.max.ms.
QUIET_LOOK_S = 1.0


class IsrChangeSubscription:
    """One control stream's view of the ISR changes: those waiting to be sent on it."""

    def __init__(self, pending: Iterable[log_pb2.IsrChange],
                 on_close: Callable[[IsrChangeSubscription], None]) -> None:
        self.queue = list(pending)
        self.wake = asyncio.Event()
        self._on_close = on_close

        self.ended = False

    def put(self, change: log_pb2.IsrChange) -> None:
        self.queue.append(change)
        self.wake.set()

    def end(self) -> None:
        """The node stops: the stream ends."""
        self.ended = True
        self.wake.set()

    async def next(self) -> log_pb2.IsrChangeRequests | None:
        """The changes to send next (waits for one); None once ended."""
        while not self.queue:
            if self.ended:
                return None
            self.wake.clear()
            await self.wake.wait()
        changes, self.queue = self.queue, []
        return log_pb2.IsrChangeRequests(changes=changes)

    def close(self) -> None:
        self._on_close(self)


def _answers(result: log_pb2.ReplicaFetchResult, records: bytes) -> bool:
    """Whether a fetch result is worth answering at once: batches (carried or named in a
    file) or an error."""
    return bool(records or result.error_code or result.HasField("file_records"))


class ReplicaManager:
    def __init__(self, manager: LogManager, node_id: int, *, tls: InternalTls = PLAINTEXT,
                 transport: str = STREAM, local_files: bool = True,
                 on_epoch_ended: Callable[[str, int, int, int, str], None] | None = None,
                 ) -> None:
        self.manager = manager
        self.node_id = node_id
        # Told (topic, partition, leader epoch, high watermark) when this node stops leading.
        self._on_epoch_ended = on_epoch_ended
        self.settings = ReplicationSettings()
        self.leader_quota = ReplicationQuota(LEADER_SIDE, node_id)
        self.follower_quota = ReplicationQuota(FOLLOWER_SIDE, node_id)
        self.fetchers = ReplicaFetcherManager(
            node_id=node_id, manager=manager, settings=lambda: self.settings,
            quota=self.follower_quota, tls=tls, transport=transport,
            local_reader=local_host_key() if local_files else "")
        self.leaders: dict[TopicPartition, LeaderReplicas] = {}
        # ISR changes asked for and not yet answered.
        self._pending: dict[TopicPartition, log_pb2.IsrChange] = {}
        self._subscribers: list[IsrChangeSubscription] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._retries: set[asyncio.TimerHandle] = set()
        self._check_isr = asyncio.Event()
        # Followers' lag is measured in the time this node ran: a leader that was stopped
        # does not blame its followers for the fetches it could not serve.
        self.clock = RunningClock()
        self.stopping = False

    # -- life cycle ------------------------------------------------------------------------

    def start(self) -> None:
        """Resume the replicas loaded from disk (a leader alone in its ISR leads at once)
        and start the ISR checks."""
        for partition_log in self.manager.partitions():
            state = partition_log.state
            if state.role == LEADER and state.replicas:
                self.leaders[(partition_log.topic, partition_log.partition)] = (
                    self._new_leader(partition_log, state))
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self.clock.run(), name="running-clock"))
        self._tasks.append(loop.create_task(self._shrink_forever(), name="isr-shrinks"))

    def begin_stop(self) -> None:
        """The node stops serving: fetch sessions and control streams end after their current
        answer, so the server's stop does not wait for them."""
        self.stopping = True
        for subscription in list(self._subscribers):
            subscription.end()

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for handle in self._retries:
            handle.cancel()
        await self.fetchers.stop()

    # -- settings and states ---------------------------------------------------------------

    def apply_settings(self, message: log_pb2.ReplicationSettings) -> None:
        before = self.settings
        self.settings = ReplicationSettings.of(message)
        self.leader_quota.set_rate(self.settings.leader_throttled_rate)
        self.follower_quota.set_rate(self.settings.follower_throttled_rate)
        if self.settings != before:
            self.fetchers.wake()
            self._check_isr.set()

    async def apply_state(self, partition_log: PartitionLog,
                          state: log_pb2.ReplicaState) -> bool:
        """Take ``state`` for ``partition_log`` (see the module docstring); returns whether
        anything changed. Raises FENCED_LEADER_EPOCH for an older leader epoch,
        INVALID_REQUEST for a state that neither leads nor follows."""
        current = partition_log.state
        if state.role not in (LEADER, FOLLOWER):
            raise KafkaError(ErrorCode.invalid_request, "a replica state must lead or follow")
        if state.leader_epoch < current.leader_epoch:
            raise KafkaError(
                ErrorCode.fenced_leader_epoch,
                f"{partition_log.topic}-{partition_log.partition} is at leader epoch "
                f"{current.leader_epoch}, newer than {state.leader_epoch}")
        if (state.leader_epoch == current.leader_epoch and current.role != UNKNOWN
                and state.partition_epoch < current.partition_epoch):
            return False  # stale: a newer state of this epoch is here already
        key = (partition_log.topic, partition_log.partition)
        if (current.role == LEADER and current.leader_epoch >= 0
                and state.leader_epoch > current.leader_epoch
                and self._on_epoch_ended is not None):
            self._on_epoch_ended(key[0], key[1], current.leader_epoch,
                                 partition_log.high_watermark, partition_log.topic_id)
        if state.role == FOLLOWER:
            self._forget_leader(key)
            changed = await partition_log.become(state)
            if state.leader >= 0:
                self.fetchers.follow(key, state.leader, state.leader_epoch)
            return changed
        self.fetchers.unfollow(key)
        replicas = self.leaders.get(key)
        if not state.replicas:
            # Not replicated through the replicator: it leads alone as told.
            self._forget_leader(key)
            return await partition_log.become(state)
        if replicas is None or replicas.leader_epoch != state.leader_epoch:
            self._forget_leader(key)
            replicas = self._new_leader(partition_log, state)
        else:
            replicas.update(state.replicas, state.isr, state.partition_epoch,
                            self.clock.now_ms())
        self.leaders[key] = replicas
        changed = await partition_log.become(copy(state, in_sync_alone=replicas.alone))
        self._advance_high_watermark(partition_log, replicas)
        self._check_isr.set()
        return changed

    def _new_leader(self, partition_log: PartitionLog,
                    state: log_pb2.ReplicaState) -> LeaderReplicas:
        return LeaderReplicas(
            node_id=self.node_id, leader_epoch=state.leader_epoch, replicas=state.replicas,
            isr=state.isr, partition_epoch=state.partition_epoch,
            epoch_start_offset=partition_log.log_end_offset, now_ms=self.clock.now_ms())

    def _forget_leader(self, key: TopicPartition) -> None:
        if self.leaders.pop(key, None) is not None:
            self._pending.pop(key, None)

    def forget(self, key: TopicPartition) -> None:
        """The replica was deleted."""
        self._forget_leader(key)
        self.fetchers.unfollow(key)

    # -- serving follower fetches ----------------------------------------------------------

    async def fetch(self, request: log_pb2.ReplicaFetchRequest,
                    session: ReplicaFetchSession | None = None) -> FetchAnswer:
        """Serve one follower fetch (see the module docstring): each partition's result
        (without its records) and its records. ``session``: the fetch session of the
        follower's stream (:mod:`services.log.replica_fetch_session`); without one the request
        is served on its own."""
        metrics.FOLLOWER_FETCHES.inc()
        started = self.clock.now_ms()
        if session is None:
            session = ReplicaFetchSession()
        fetches = session.update(request)
        logs: list[PartitionLog | None] = []
        replica_id = request.replica_id
        now = time.monotonic()
        look_at_quiet = now >= session.look_again_at
        if look_at_quiet:
            session.look_again_at = now + min(QUIET_LOOK_S, self.settings.lag_time_max_ms / 4000)
        for cached in fetches:
            quiet = cached.quiet_log
            if quiet is not None:
                if not look_at_quiet and quiet.changes == cached.changes:
                    logs.append(quiet)  # nothing happened to it: nothing to do
                    continue
                cached.quiet_log = None
            partition_log, replicas = self._record_position(replica_id, cached, started)
            if replicas is not None:
                await self._position_moved(partition_log, replicas, replica_id, started)
            logs.append(partition_log)
        response = self._read(request, fetches, logs)
        if (request.max_wait_ms <= 0 or not fetches
                or any(_answers(r, records) for r, records in response)):
            session.answered(r for r, _ in response)
            return response
        deadline = time.monotonic() + request.max_wait_ms / 1000
        waiting = [p for p in logs if p is not None]
        while True:
            left = deadline - time.monotonic()
            if not waiting or left <= 0:
                session.answered(r for r, _ in response)
                return response
            woken: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            for partition_log in waiting:
                partition_log.wake_on_change(woken)
            try:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(left):
                        await woken
            finally:
                for partition_log in waiting:
                    partition_log.forget_waiter(woken)
            response = self._read(request, fetches, logs)
            # Throttled partitions count as having nothing: wait on unless time is up.
            if any(_answers(r, records) for r, records in response):
                session.answered(r for r, _ in response)
                return response

    def _record_position(self, replica_id: int, cached: CachedPartition, now: int
                         ) -> tuple[PartitionLog | None, LeaderReplicas | None]:
        """Check one partition of a fetch and record the follower's position: the log to read
        (None when the partition's result is an error, found again by the read), and its
        replicas when the position moved or the follower is out of the ISR (else None: the
        high watermark moves only with a member's position, and a member does not join; what
        a fetch session's quiet partitions come to on every round)."""
        key = cached.key
        partition_log = self.manager.find(*key)
        replicas = self.leaders.get(key)
        if (partition_log is None or replicas is None or partition_log.state.role != LEADER
                or cached.leader_epoch != partition_log.state.leader_epoch):
            return None, None
        follower = replicas.followers.get(replica_id)
        if follower is None:
            return None, None
        offset = cached.fetch_offset
        moved = follower.log_end_offset != offset
        replicas.record_fetch(replica_id, offset, partition_log.log_end_offset, now)
        if not moved and replica_id in replicas.isr:
            return partition_log, None
        return partition_log, replicas

    async def _position_moved(self, partition_log: PartitionLog, replicas: LeaderReplicas,
                              replica_id: int, now: int) -> None:
        """Move the high watermark after a follower's position, and ask for the follower to
        join the ISR when it may."""
        self._advance_high_watermark(partition_log, replicas)
        joining = replicas.expansion(partition_log.high_watermark, now, replica_id)
        if joining is not None:
            await self._propose(partition_log, replicas, joining)

    def _read(self, request: log_pb2.ReplicaFetchRequest, fetches: list[CachedPartition],
              logs: list[PartitionLog | None]) -> FetchAnswer:
        """The results of ``fetches``, leaving out those with nothing new for the follower
        when the request is incremental."""
        response: FetchAnswer = []
        budget = request.max_bytes if request.max_bytes > 0 else None
        min_one = True
        incremental = request.incremental
        # A follower on this host reads the batches from the segment files itself.
        in_files = is_local(request.local_reader)
        for cached, partition_log in zip(fetches, logs, strict=True):
            quiet = cached.quiet_log
            if quiet is not None and quiet.changes == cached.changes:
                continue
            if (incremental and partition_log is not None and cached.answered
                    and cached.fetch_offset == partition_log.log_end_offset
                    and cached.high_watermark == partition_log.high_watermark
                    and cached.log_start_offset == partition_log.log_start_offset):
                # Caught up, and told all there is: quiet until its log changes.
                cached.quiet_log, cached.changes = partition_log, partition_log.changes
                continue
            item = cached.fetch
            result = log_pb2.ReplicaFetchResult(topic=item.topic, partition=item.partition)
            try:
                partition_log = self._check_fetch(request.replica_id, item, partition_log)
                replicas = self.leaders[(item.topic, item.partition)]
                throttled = (request.replica_id not in replicas.isr
                             and self.leader_quota.is_throttled(partition_log.topic_configs,
                                                                item.partition))
                records, size = b"", 0
                if not (throttled and self.leader_quota.exceeded()):
                    max_bytes = item.max_bytes if budget is None else min(item.max_bytes,
                                                                          budget)
                    where = partition_log.locate(item.fetch_offset, max(max_bytes, 0),
                                                 LOG_END, min_one)
                    size = where.size
                    if not (in_files and where.name_in(result.file_records)):
                        records = where.read()
            except KafkaError as exc:
                result.error_code, result.error_message = exc.errno, exc.message or ""
                metrics.ERRORS.labels("ReplicaFetch", error_name(exc.errno)).inc()
                records, size, throttled = b"", 0, False
            except OSError as exc:
                self.manager.storage_failed(exc, f"reading {item.topic}-{item.partition}")
                result.error_code = ErrorCode.kafka_storage_error.value
                result.error_message = str(exc)
                records, size, throttled = b"", 0, False
            found = self.manager.find(item.topic, item.partition)
            if found is None:
                result.high_watermark = result.log_start_offset = NO_OFFSET
                result.log_end_offset = NO_OFFSET
            else:
                result.high_watermark = found.high_watermark
                result.log_start_offset = found.log_start_offset
                result.log_end_offset = found.log_end_offset
            if incremental and not cached.has_news(result, records):
                continue
            response.append((result, records))
            if size:
                metrics.REPLICATION_BYTES_OUT.inc(size)
                if throttled:
                    self.leader_quota.record(size)
                min_one = False
                if budget is not None:
                    budget = max(budget - size, 0)
        return response

    def _check_fetch(self, replica_id: int, item: log_pb2.ReplicaFetchPartition,
                     partition_log: PartitionLog | None) -> PartitionLog:
        """The log a fetch of ``item`` reads, or the Kafka error why it may not."""
        found = self.manager.get(item.topic, item.partition)
        current = found.state
        if current.role != LEADER or (item.topic, item.partition) not in self.leaders:
            raise KafkaError(ErrorCode.not_leader_or_follower,
                             f"this replica of {item.topic}-{item.partition} does not lead")
        if item.leader_epoch < current.leader_epoch:
            raise KafkaError(ErrorCode.fenced_leader_epoch,
                             f"leader epoch {item.leader_epoch} is older than "
                             f"{current.leader_epoch}")
        if item.leader_epoch > current.leader_epoch:
            raise KafkaError(ErrorCode.unknown_leader_epoch,
                             f"leader epoch {item.leader_epoch} is newer than "
                             f"{current.leader_epoch}")
        if replica_id not in self.leaders[(item.topic, item.partition)].followers:
            raise KafkaError(ErrorCode.not_leader_or_follower,
                             f"node {replica_id} holds no replica of {item.topic}-"
                             f"{item.partition}")
        return partition_log or found

    @staticmethod
    def _advance_high_watermark(partition_log: PartitionLog, replicas: LeaderReplicas) -> None:
        candidate = replicas.high_watermark_candidate(partition_log.log_end_offset)
        if candidate > partition_log.high_watermark:
            partition_log.advance_high_watermark(candidate)

    # -- ISR changes -----------------------------------------------------------------------

    async def _propose(self, partition_log: PartitionLog, replicas: LeaderReplicas,
                       isr: Iterable[int]) -> None:
        """Ask the controller for ``isr`` (pending until answered). A leader alone in its
        ISR first stops committing by itself, and stores that."""
        was_alone = replicas.alone
        proposal = replicas.propose(isr)
        state = partition_log.state
        if was_alone and not replicas.alone:
            await partition_log.become(copy(state, in_sync_alone=False))
        key = (partition_log.topic, partition_log.partition)
        if self.leaders.get(key) is not replicas or replicas.pending is not proposal:
            return  # the state moved on meanwhile
        kind = "expand" if proposal.adding else "shrink"
        metrics.ISR_CHANGE_REQUESTS.labels(kind).inc()
        log.info("%s-%d: asking for ISR %s (now %s)", key[0], key[1], list(proposal.proposed),
                 list(proposal.current))
        self._send(log_pb2.IsrChange(
            topic=key[0], partition=key[1], leader=self.node_id,
            leader_epoch=replicas.leader_epoch, partition_epoch=replicas.partition_epoch,
            current_isr=proposal.current, new_isr=proposal.proposed))

    def _send(self, change: log_pb2.IsrChange) -> None:
        self._pending[(change.topic, change.partition)] = change
        if self._subscribers:
            self._subscribers[-1].put(change)

    def subscribe_isr_changes(self) -> IsrChangeSubscription:
        """The ISR changes to send on a new control stream: every one still pending, then
        each new one (the newest stream gets them); close it when the stream ends."""
        subscription = IsrChangeSubscription(self._pending.values(), self._subscribers.remove)
        self._subscribers.append(subscription)
        return subscription

    async def apply_answers(self, answers: log_pb2.IsrChangeAnswers) -> None:
        """The replicator's answers to ISR changes: a decided one ends the change and its
        state is taken; a retriable one is asked again after a while."""
        for answer in answers.answers:
            key = (answer.topic, answer.partition)
            change = self._pending.get(key)
            if change is None:
                continue
            if answer.error_code and not answer.HasField("state"):
                self._retry(key, change)
                continue
            del self._pending[key]
            decided = answer.HasField("state")
            replicas = self.leaders.get(key)
            if replicas is not None and replicas.leader_epoch == change.leader_epoch:
                replicas.answered(answer.state.isr if decided else None, self.clock.now_ms(),
                                  int(ISR_RETRY_S * 1000))
            partition_log = self.manager.find(*key)
            if partition_log is not None and decided:
                try:
                    await self.apply_state(partition_log, answer.state)
                except KafkaError as exc:
                    log.info("%s-%d: the answer to its ISR change no longer applies: %s", *key,
                             exc)
                except OSError as exc:
                    self.manager.storage_failed(exc, f"storing the state of {key[0]}-{key[1]}")
            self._check_isr.set()

    def _retry(self, key: TopicPartition, change: log_pb2.IsrChange) -> None:
        def again() -> None:
            self._retries.discard(handle)
            if self._pending.get(key) is change:
                self._send(change)

        handle = asyncio.get_running_loop().call_later(ISR_RETRY_S, again)
        self._retries.add(handle)

    async def _shrink_forever(self) -> None:
        while True:
            interval = min(max(self.settings.lag_time_max_ms / 2, 10), 5000) / 1000
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    await self._check_isr.wait()
            self._check_isr.clear()
            try:
                await self.check_isr()
            except Exception:
                log.exception("ISR check failed")

    async def check_isr(self) -> None:
        """Ask to remove the followers not caught up for ``replica.lag.time.max.ms`` (Kafka's
        maybeShrinkIsr; followers join on their fetches only, so one that stopped fetching
        is never added on an old position)."""
        now = self.clock.now_ms()
        for key, replicas in list(self.leaders.items()):
            partition_log = self.manager.find(*key)
            if partition_log is None or partition_log.state.role != LEADER:
                continue
            self._advance_high_watermark(partition_log, replicas)
            isr = replicas.shrink(now, self.settings.lag_time_max_ms)
            if isr is not None:
                for node in set(replicas.isr) - set(isr):
                    log.info("%s-%d: follower %d fell behind for over %d ms", key[0], key[1],
                             node, self.settings.lag_time_max_ms)
                await self._propose(partition_log, replicas, isr)

    # -- metrics ---------------------------------------------------------------------------

    def follower_lags(self) -> Iterable[tuple[str, int, int, int, float]]:
        """(topic, partition, follower, messages behind, seconds since caught up) for every
        follower of a partition this node leads."""
        now = self.clock.now_ms()
        for (topic, partition), replicas in self.leaders.items():
            partition_log = self.manager.find(topic, partition)
            if partition_log is None:
                continue
            for follower in replicas.followers:
                yield (topic, partition, follower,
                       *replicas.follower_lag(follower, partition_log.log_end_offset, now))
