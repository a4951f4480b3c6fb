"""The replication control role: every replica in the state the metadata gives it, every log
node with its replication settings, and the ISR changes leaders ask for committed (Kafka's
LeaderAndIsr propagation and AlterPartition handling, in the controller's process). The data
path is not here: followers' log nodes fetch from their leaders, and leaders move their own
high watermarks and report them to the purgatory, so acks=all produces complete while no
replicator is active.

- Metadata: every image the controller publishes is reconciled as it is published: each
  partition is followed with its partition epoch, the metadata version in which its leader,
  epoch, replicas or ISR last changed (Kafka's partition epoch: a log node ignores a state
  older than the one it has at the same leader epoch). A partition with one replica is too:
  one reassigned down to a single new replica must hear that it leads there.
- Replica states: each live node is sent the state of every replica it holds (leader or
  follower, the epochs, the leader, replicas and ISR) until it confirmed that state; a replica
  the node lacks (it was down when the replica was created) is created there. A node that
  comes back to life, or whose replicas say otherwise when checked (it restarted between two
  health checks), is sent its states again.
- Settings: each live node is sent its replication settings (:mod:`.settings`) whenever they
  change and when it comes back.
- ISR changes: one control stream per live node (:mod:`.isr_changes`); each change a leader
  asks for is committed through the controller
  (:mod:`~services.replicator.controller.partitions`) if the partition still has that leader,
  epoch and ISR, and answered with the partition's state then, so handlers learn the ISR with
  the metadata (for min.insync.replicas) and it survives a restart.
- Leader changes: when a partition gets a new leader epoch, the acks=all waits of its old
  epoch fail at once (:mod:`.progress`).

Not thread-safe: one event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import NamedTuple

from kbroker.log.v1 import log_pb2
from services.common.errors import ErrorCode

from .. import metrics
from ..controller import Controller
from ..log_nodes import LogNodeError, LogNodes, TopicPartition, failure_message, replica_state
from ..metadata import MetadataImage, NodeId, TopicName
from .isr_changes import IsrChangeStreams
from .progress import ProgressReporter
from .settings import ReplicaSettings, node_settings

log = logging.getLogger(__name__)

# Every this many state rounds, the nodes' replica states are checked (see verify_states).
VERIFY_EVERY = 5


class PartitionRecord(NamedTuple):
    """A replicated partition as last reconciled, with its partition epoch."""

    leader: NodeId
    leader_epoch: int
    replicas: tuple[NodeId, ...]
    isr: tuple[NodeId, ...]
    partition_epoch: int


class ReplicationManager:
    def __init__(
        self,
        *,
        controller: Controller,
        nodes: LogNodes,
        settings: ReplicaSettings | None = None,
        resync_interval_s: float = 1.0,
        purgatory: ProgressReporter | None = None,
    ) -> None:
        self._controller = controller
        self._nodes = nodes
        self._settings = settings or ReplicaSettings()
        self._resync_interval_s = resync_interval_s
        self._purgatory = purgatory
        self._partitions: dict[TopicPartition, PartitionRecord] = {}
        # Per node: the states it confirmed, and the settings it took.
        self._confirmed: dict[NodeId, dict[TopicPartition, log_pb2.ReplicaState]] = {}
        self._confirmed_settings: dict[NodeId, log_pb2.ReplicationSettings] = {}
        self._alive: set[NodeId] = set()
        self._sync_needed = asyncio.Event()
        self._streams = IsrChangeStreams(nodes, self.decide_isr_changes,
                                         backoff_s=self._settings.fetch_backoff_ms / 1000)
        self._tasks: list[asyncio.Task[None]] = []
        self._stopped = False

    # -- life cycle ------------------------------------------------------------------------

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.reconcile(self._controller.image)
        self._controller.publisher.subscribe(self.reconcile)
        self._tasks = [loop.create_task(self._sync_forever(), name="replication-states")]

    async def stop(self) -> None:
        self._stopped = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, self._streams.stop(), return_exceptions=True)
        if self._purgatory is not None:
            await self._purgatory.close()

    # -- metadata --------------------------------------------------------------------------

    def reconcile(self, image: MetadataImage) -> None:
        """Bring partition records, control streams and wanted states in line with
        ``image``."""
        if self._stopped:
            return
        alive = set(image.live_node_ids)
        for node in alive - self._alive:
            # It may have restarted: tell it everything.
            self._confirmed.pop(node, None)
            self._confirmed_settings.pop(node, None)
        self._alive = alive
        partitions: dict[TopicPartition, PartitionRecord] = {}
        for topic in image.topics.values():
            for p in topic.partitions:
                key = (topic.name, p.partition)
                current = self._partitions.get(key)
                record = PartitionRecord(p.leader, p.leader_epoch, tuple(p.replicas),
                                         tuple(p.isr), image.version)
                if current is not None and current[:4] == record[:4]:
                    partitions[key] = current
                    continue
                partitions[key] = record
                if (current is not None and current.leader_epoch < p.leader_epoch
                        and self._purgatory is not None):
                    self._purgatory.leader_changed(topic.name, p.partition,
                                                   current.leader_epoch, topic.topic_id)
        self._partitions = partitions
        self._streams.follow(alive)
        self._sync_needed.set()

    def state_of(self, node: NodeId, key: TopicPartition) -> log_pb2.ReplicaState | None:
        """The state ``node``'s replica of ``key`` should have, None if it holds none."""
        record = self._partitions.get(key)
        if record is None or node not in record.replicas:
            return None
        topic = self._controller.image.topics.get(TopicName(key[0]))
        if topic is None or key[1] >= len(topic.partitions):
            return None
        return replica_state(key[0], topic.partitions[key[1]], node, record.partition_epoch)

    def wanted_states(self, node: NodeId) -> dict[TopicPartition, log_pb2.ReplicaState]:
        """The state of every replica ``node`` holds, as the metadata has it."""
        wanted = {}
        for key, record in self._partitions.items():
            if node in record.replicas:
                state = self.state_of(node, key)
                if state is not None:
                    wanted[key] = state
        return wanted

    # -- ISR changes -----------------------------------------------------------------------

    async def decide_isr_changes(self, node: NodeId, changes: Sequence[log_pb2.IsrChange]
                                 ) -> log_pb2.IsrChangeAnswers:
        """Commit the ISR changes ``node``'s leaders asked for that still apply (same leader,
        epochs and ISR), then answer each with the partition's state; REQUEST_TIMED_OUT
        (retriable) when the change could not be saved."""
        wanted = {(c.topic, c.partition): (NodeId(c.leader), c.leader_epoch,
                                           tuple(NodeId(n) for n in c.new_isr))
                  for c in changes}
        expected = {(c.topic, c.partition): tuple(NodeId(n) for n in c.current_isr)
                    for c in changes}
        answers = log_pb2.IsrChangeAnswers()
        try:
            await self._controller.partitions.change_isr(wanted, expected=expected)
        except OSError:
            log.warning("could not save the ISR changes of log node %d; it will ask again",
                        node)
            for c in changes:
                answers.answers.add(topic=c.topic, partition=c.partition,
                                    error_code=ErrorCode.request_timed_out.value)
            return answers
        for c in changes:
            state = self.state_of(node, (c.topic, c.partition))
            if state is None:
                answers.answers.add(topic=c.topic, partition=c.partition,
                                    error_code=ErrorCode.unknown_topic_or_partition.value)
            else:
                answers.answers.add(topic=c.topic, partition=c.partition, state=state)
        self._sync_needed.set()
        return answers

    # -- replica states and settings -------------------------------------------------------

    async def _sync_forever(self) -> None:
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
                                          or d.leader_epoch != state.leader_epoch
                                          or d.partition_epoch < state.partition_epoch):
                    log.info("log node %d lost its state of %s-%d; sending it again", node,
                             d.topic, d.partition)
                    del confirmed[key]

        await asyncio.gather(*(verify(node) for node in sorted(self._alive)))

    async def sync_states(self) -> None:
        """Send every live node its settings and the states it has not confirmed, one call
        each per node."""
        await asyncio.gather(*(self._sync_node(node) for node in sorted(self._alive)))

    async def _sync_node(self, node: NodeId) -> None:
        settings = node_settings(self._controller.image, node, self._settings)
        if self._confirmed_settings.get(node) != settings:
            try:
                await self._nodes.update_replication_settings(node, settings)
            except LogNodeError as exc:
                log.debug("log node %d: replication settings not sent: %s", node, exc.message)
                return
            self._confirmed_settings[node] = settings
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
