"""The replication role: keeps every replicated partition's followers copying from its leader,
the high watermark moving, the ISR true and each replica in the state the metadata gives it
(Kafka's ReplicaFetcherManager, the leader's ISR maintenance and the controller's
LeaderAndIsr propagation, in one process).

- Metadata: every image the controller publishes is reconciled as it is published: a
  partition with two or more replicas gets a :class:`PartitionReplication` (kept while its
  leader and epoch stay, started over otherwise), and its followers on live nodes are served
  by the fetcher of its leader's node (:mod:`.fetcher`).
- Replica states: each live node is sent the state of every replica it holds (leader or
  follower, the epoch, whether a leader is alone in the ISR) until it confirmed that state; a
  replica the node lacks (it was down when the replica was created) is created there. A
  node that comes back to life, or refuses a call as if it did not know its state (it
  restarted), is sent its states again; a leader that gets its state also gets the high
  watermark, which a restart forgot.
- Throttles: copies of throttled replicas are held to the replication throttle rates
  (:mod:`.throttle`).
- High watermark: whenever a follower's progress moves the minimum log end offset over the
  ISR, the new high watermark goes to the leader (:mod:`.high_watermarks`) and, when a
  purgatory is configured, straight to the purgatory too (:mod:`.progress`), completing the
  acks=all produces waiting there; followers learn it with their next copy.
- ISR: every ``lag/2`` (at most 5 s) each partition's followers are checked, and at once
  when a follower out of the ISR caught up: an ISR follower not caught up for longer than
  ``replica.lag.time.max.ms`` leaves the ISR, a caught-up follower holding the high watermark
  joins it (as Kafka's leader expands the ISR on the follower's fetch). Partitions whose
  leader does not answer are left alone: their followers cannot catch up, and the leader's
  fencing elects one of them instead. Changes are committed through the controller
  (:mod:`~services.replicator.controller.partitions`), so
  handlers learn them with the metadata (for min.insync.replicas) and they survive a restart;
  the leader is told whether it is now alone in the ISR.

Not thread-safe: one event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from typing import Any

from kbroker.log.v1 import log_pb2
from services.common.errors import ErrorCode, error_name

from .. import metrics
from ..controller import Controller
from ..log_nodes import LogNodeError, LogNodes, TopicPartition, failure_message, replica_state
from ..metadata import MetadataImage, NodeId, TopicName
from .fetcher import FetchSettings, LeaderFetcher, now_ms
from .high_watermarks import HighWatermarkPusher
from .partition_state import PartitionReplication
from .progress import ProgressReporter
from .throttle import ReplicationThrottle

log = logging.getLogger(__name__)

# Every this many state rounds, the nodes' replica states are checked (see verify_states).
VERIFY_EVERY = 5
# Shortest time between two ISR checks: a follower that caught up is checked at once, but the
# checks of many partitions catching up together are merged.
ISR_CHECK_SPACING_S = 0.1


class ReplicationManager:
    def __init__(
        self,
        *,
        controller: Controller,
        nodes: LogNodes,
        lag_time_max_ms: int,
        fetch: FetchSettings | None = None,
        resync_interval_s: float = 1.0,
        purgatory: ProgressReporter | None = None,
    ) -> None:
        self._controller = controller
        self._nodes = nodes
        self._lag_ms = lag_time_max_ms
        self._fetch = fetch or FetchSettings()
        self._resync_interval_s = resync_interval_s
        self._purgatory = purgatory
        self._states: dict[TopicPartition, PartitionReplication] = {}
        self._throttle = ReplicationThrottle()
        self._fetchers: dict[NodeId, LeaderFetcher] = {}
        self._pushers: dict[NodeId, HighWatermarkPusher] = {}
        # Per node: the states it confirmed.
        self._confirmed: dict[NodeId, dict[TopicPartition, log_pb2.ReplicaState]] = {}
        self._alive: set[NodeId] = set()
        self._sync_needed = asyncio.Event()
        self._isr_check_soon = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping: set[asyncio.Task[None]] = set()
        self._stopped = False

    # -- life cycle ------------------------------------------------------------------------

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.reconcile(self._controller.image)
        self._controller.publisher.subscribe(self.reconcile)
        self._tasks = [
            loop.create_task(self._sync_states_forever(), name="replication-states"),
            loop.create_task(self._check_isr_forever(), name="replication-isr"),
        ]

    async def stop(self) -> None:
        self._stopped = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, *(f.stop() for f in self._fetchers.values()),
                             *(p.close() for p in self._pushers.values()), *self._stopping,
                             return_exceptions=True)
        if self._purgatory is not None:
            await self._purgatory.close()
        self._fetchers.clear()
        self._pushers.clear()

    # -- metadata --------------------------------------------------------------------------

    def reconcile(self, image: MetadataImage) -> None:
        """Bring partitions, fetchers and wanted replica states in line with ``image``."""
        if self._stopped:
            return
        self._throttle.update(image)
        now = now_ms()
        alive = set(image.live_node_ids)
        for node in alive - self._alive:
            self._confirmed.pop(node, None)  # it may have restarted: tell it everything
        self._alive = alive
        states: dict[TopicPartition, PartitionReplication] = {}
        for topic in image.topics.values():
            for p in topic.partitions:
                if len(p.replicas) < 2:
                    continue
                key = (topic.name, p.partition)
                current = self._states.get(key)
                if (current is not None and current.leader == p.leader
                        and current.leader_epoch == p.leader_epoch
                        and current.replicas == tuple(p.replicas)):
                    if current.isr != tuple(p.isr):
                        current.update_isr(p.isr, now)
                        self._progress(current)
                    states[key] = current
                    continue
                if (current is not None and current.leader_epoch < p.leader_epoch
                        and self._purgatory is not None):
                    self._purgatory.leader_changed(current.topic, current.partition,
                                                   current.leader_epoch,
                                                   current.high_watermark)
                states[key] = PartitionReplication(
                    topic=topic.name, partition=p.partition, leader=p.leader,
                    leader_epoch=p.leader_epoch, replicas=p.replicas, isr=p.isr, now_ms=now)
        for key, gone in self._states.items():
            if states.get(key) is not gone:
                for follower in gone.followers:
                    metrics.forget_follower(gone.topic, gone.partition, follower)
        self._states = states
        self._assign_fetchers()
        for node in [n for n in self._pushers if n not in alive]:
            # What it had not taken is moot: it gets its high watermarks again when it is
            # back and takes its states (see _resume).
            self._retire(self._pushers.pop(node).close())
        self._sync_needed.set()

    def _retire(self, closing: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(closing)
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    def _assign_fetchers(self) -> None:
        wanted: dict[NodeId, dict[TopicPartition, PartitionReplication]] = {}
        for key, state in self._states.items():
            if state.leader in self._alive and any(f in self._alive for f in state.followers):
                wanted.setdefault(state.leader, {})[key] = state
        for leader in list(self._fetchers):
            if leader not in wanted:
                self._retire(self._fetchers.pop(leader).stop())
        for leader, partitions in wanted.items():
            fetcher = self._fetchers.get(leader)
            if fetcher is None:
                fetcher = self._fetchers[leader] = LeaderFetcher(
                    leader=leader, nodes=self._nodes, settings=self._fetch,
                    on_progress=self._progress, on_stale_state=self._stale_state,
                    throttle=self._throttle)
                fetcher.set_partitions(partitions, self._alive)
                fetcher.start()
            else:
                fetcher.set_partitions(partitions, self._alive)

    # -- high watermarks -------------------------------------------------------------------

    def _progress(self, state: PartitionReplication) -> None:
        if self._states.get(state.key) is not state:
            return
        if len(state.isr) <= len(state.followers) and state.caught_up_out_of_sync(
                now_ms(), self._lag_ms):
            self._isr_check_soon.set()  # a follower may join: as soon as it caught up
        if not state.advance_high_watermark():
            return
        self._pusher(state.leader).push(state.topic, state.partition, state.leader_epoch,
                                        state.high_watermark)
        if self._purgatory is not None:
            self._purgatory.report_high_watermark(
                state.topic, state.partition, state.leader_epoch, state.high_watermark)
        metrics.HIGH_WATERMARK_MOVES.inc()

    def _pusher(self, node: NodeId) -> HighWatermarkPusher:
        pusher = self._pushers.get(node)
        if pusher is None:
            pusher = self._pushers[node] = HighWatermarkPusher(
                node, self._nodes, backoff_s=self._fetch.backoff_ms / 1000,
                on_refused=self._refused)
        return pusher

    def _refused(self, node: NodeId, failure: log_pb2.PartitionError) -> None:
        log.info("log node %d refused %s-%d: %s", node, failure.topic, failure.partition,
                 error_name(failure.error_code))
        self._stale_state(node, (failure.topic, failure.partition))

    # -- replica states --------------------------------------------------------------------

    def _stale_state(self, node: NodeId, key: TopicPartition) -> None:
        """``node`` answered as if it did not have its state of ``key``: send it again."""
        confirmed = self._confirmed.get(node)
        if confirmed is not None and confirmed.pop(key, None) is not None:
            self._sync_needed.set()

    def wanted_states(self, node: NodeId) -> dict[TopicPartition, log_pb2.ReplicaState]:
        """The state of every replicated replica ``node`` holds, as the metadata has it."""
        image = self._controller.image
        wanted: dict[TopicPartition, log_pb2.ReplicaState] = {}
        for key, state in self._states.items():
            if node not in state.replicas:
                continue
            topic = image.topics.get(TopicName(state.topic))
            if topic is None or state.partition >= len(topic.partitions):
                continue
            wanted[key] = replica_state(state.topic, topic.partitions[state.partition], node)
            if state.expanding and node == state.leader:
                wanted[key].in_sync_alone = False
        return wanted

    async def _sync_states_forever(self) -> None:
        rounds = 0
        while True:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a cancellation
            # that arrives as the event is set, and stop() would wait forever.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._resync_interval_s):
                    await self._sync_needed.wait()
            self._sync_needed.clear()
            rounds += 1
            try:
                if rounds % VERIFY_EVERY == 0:
                    await self.verify_states()
                await self.sync_states()
            except Exception:
                log.exception("sending replica states failed")

    async def verify_states(self) -> None:
        """Ask every live node for the states of its replicated replicas and forget the
        confirmations they contradict: a node restarted between two health checks comes back
        with every replicated replica waiting for its state."""

        async def verify(node: NodeId) -> None:
            confirmed = self._confirmed.get(node)
            if not confirmed:
                return
            try:
                described = await self._nodes.describe(node, list(confirmed))
            except LogNodeError:
                return
            for d in described:
                key = (d.topic, d.partition)
                state = confirmed.get(key)
                if state is not None and (d.error_code or d.role != state.role
                                          or d.leader_epoch != state.leader_epoch):
                    log.info("log node %d lost its state of %s-%d; sending it again", node,
                             d.topic, d.partition)
                    del confirmed[key]

        await asyncio.gather(*(verify(node) for node in sorted(self._alive)))

    async def sync_states(self) -> None:
        """Send every live node the states it has not confirmed, one call per node."""
        await asyncio.gather(*(self._sync_node(node) for node in sorted(self._alive)))

    async def _sync_node(self, node: NodeId) -> None:
        confirmed = self._confirmed.setdefault(node, {})
        wanted = self.wanted_states(node)
        for key in [k for k in confirmed if k not in wanted]:
            del confirmed[key]
        todo = [s for key, s in wanted.items() if confirmed.get(key) != s]
        if not todo:
            return
        try:
            refused = await self._nodes.update_replica_states(node, todo)
        except LogNodeError as exc:
            metrics.REPLICA_STATE_UPDATES.labels("failed").inc(len(todo))
            log.debug("log node %d: replica states not sent: %s", node, exc.message)
            return
        failed = {(f.topic, f.partition): f for f in refused}
        missing = []
        for state in todo:
            key = (state.topic, state.partition)
            failure = failed.get(key)
            if failure is None:
                metrics.REPLICA_STATE_UPDATES.labels("taken").inc()
                confirmed[key] = state
                self._resume(node, key, state)
            elif failure.error_code == ErrorCode.unknown_topic_or_partition.value:
                missing.append(state)
            else:
                metrics.REPLICA_STATE_UPDATES.labels("refused").inc()
                log.warning("log node %d refused its state of %s-%d: %s", node, state.topic,
                            state.partition, failure_message(failure))
        if missing:
            await self._create_missing(node, missing, confirmed)

    async def _create_missing(self, node: NodeId, states: list[log_pb2.ReplicaState],
                              confirmed: dict[TopicPartition, log_pb2.ReplicaState]) -> None:
        """Create replicas the metadata places on ``node`` but the node lacks (it was down
        when they were created), with their state; they then catch up like any follower."""
        image = self._controller.image
        states = [s for s in states if TopicName(s.topic) in image.topics]
        specs = [log_pb2.PartitionSpec(
            topic=s.topic, partition=s.partition, state=s,
            topic_id=image.topics[TopicName(s.topic)].topic_id,
            configs=image.topics[TopicName(s.topic)].configs) for s in states]
        if not specs:
            return
        try:
            failures = await self._nodes.create_partitions(node, specs)
        except LogNodeError as exc:
            log.debug("log node %d: missing replicas not created: %s", node, exc.message)
            return
        failed = {(f.topic, f.partition) for f in failures}
        for f in failures:
            log.warning("log node %d could not create its replica of %s-%d: %s", node,
                        f.topic, f.partition, failure_message(f))
        for state in states:
            key = (state.topic, state.partition)
            if key not in failed:
                log.info("log node %d: created its missing replica of %s-%d", node, *key)
                metrics.REPLICA_STATE_UPDATES.labels("taken").inc()
                confirmed[key] = state
                self._resume(node, key, state)

    def _resume(self, node: NodeId, key: TopicPartition, state: log_pb2.ReplicaState) -> None:
        """A replica took its state: fetch for it at once, and give a leader its high
        watermark (it forgets it on a restart)."""
        partition = self._states.get(key)
        if partition is None:
            return
        for fetcher in self._fetchers.values():
            if key in fetcher.partitions:
                fetcher.retry_now(key)
        if state.role == log_pb2.REPLICA_ROLE_LEADER and partition.high_watermark >= 0:
            self._pusher(node).push(state.topic, state.partition, state.leader_epoch,
                                    partition.high_watermark)

    # -- ISR -------------------------------------------------------------------------------

    async def _check_isr_forever(self) -> None:
        interval = min(max(self._lag_ms / 2, 10), 5000) / 1000
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._isr_check_soon.wait(), interval)
            self._isr_check_soon.clear()
            try:
                await self.check_isr()
            except Exception:
                log.exception("ISR check failed")
            await asyncio.sleep(ISR_CHECK_SPACING_S)
            if any(s.expanding for s in self._states.values()):
                self._isr_check_soon.set()  # the leader's confirmation is on its way

    async def check_isr(self) -> None:
        """Shrink and expand ISRs per the lag rules, and refresh the lag metrics."""
        now = now_ms()
        changes: dict[TopicPartition, tuple[NodeId, int, tuple[NodeId, ...]]] = {}
        # A node in controlled shutdown joins no ISR (the controller would refuse it).
        active = set(self._controller.image.active_node_ids)
        for key, state in self._states.items():
            for follower in state.followers:
                metrics.observe_follower(state.topic, state.partition, follower,
                                         *state.follower_lag(follower, now))
            if state.leader not in self._alive:
                # Nobody can catch up with a leader that does not answer: that is for fencing
                # to settle (a new leader), not for the ISR to lose its followers.
                continue
            leaving = set(state.lagging_in_sync(now, self._lag_ms))
            joining = {n for n in state.caught_up_out_of_sync(now, self._lag_ms)
                       if n in active}
            if state.expanding - joining:
                state.expanding &= joining  # fell behind again: the leader may go on alone
                self._sync_needed.set()
            if joining and state.isr == (state.leader,):
                joining = self._join_alone_leader(key, state, joining)
            if not leaving and not joining:
                continue
            isr = tuple(r for r in state.replicas
                        if (r in state.isr and r not in leaving) or r in joining)
            changes[key] = (state.leader, state.leader_epoch, isr)
            for node in leaving:
                log.info("%s-%d: follower %d fell behind for over %d ms; leaving the ISR",
                         state.topic, state.partition, node, self._lag_ms)
            for node in joining:
                log.info("%s-%d: follower %d caught up; joining the ISR", state.topic,
                         state.partition, node)
        if not changes:
            return
        try:
            applied = await self._controller.partitions.change_isr(changes)
        except OSError:
            log.exception("could not save ISR changes; retrying at the next check")
            return
        for key, isr in applied.items():
            state = self._states.get(key)
            if state is not None:
                state.update_isr(isr, now)
                self._progress(state)
        self._sync_needed.set()

    def _join_alone_leader(self, key: TopicPartition, state: PartitionReplication,
                           joining: set[NodeId]) -> set[NodeId]:
        """Followers may join a leader alone in the ISR only once the leader has stopped
        committing by itself: mark them expanding (the leader is then told it is not alone)
        and let them join when it confirmed. Returns those that may join now."""
        if joining - state.expanding:
            state.expanding |= joining
            self._sync_needed.set()
            return set()
        confirmed = self._confirmed.get(state.leader, {}).get(key)
        if (confirmed is None or confirmed.role != log_pb2.REPLICA_ROLE_LEADER
                or confirmed.in_sync_alone
                or confirmed.leader_epoch != state.leader_epoch):
            return set()
        return joining

