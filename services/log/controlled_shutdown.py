"""A log node's side of a controlled shutdown (Kafka's ``BrokerLifecycleManager``
``beginControlledShutdown`` and the wait for it in ``BrokerServer.shutdown``): a node asked to
stop (SIGTERM: a Kubernetes pod termination, the local launcher stopping or restarting it)
hands its leaderships over before it stops, so that clients lose nothing and wait for no
session timeout. The replicator's controller decides what moves where; the node only asks and
waits.

1. Hand-over: from the moment the stop begins, appends to the replicas this node leads beside
   other in-sync replicas are refused NOT_LEADER_OR_FOLLOWER (clients look the leader up again
   and retry); replicas that commit alone (a partition of one replica, the metadata log) serve
   on, as nobody can take them over.
2. Drain: it waits, at most :data:`DRAIN_TIMEOUT_S`, until each refused replica's high
   watermark reaches its log end, so every append it took is on the in-sync followers (the
   acks=all produces waiting on them complete) and parked before the leadership moves.
3. Ask: ``Replicator.ControlledShutdown`` takes the node out of every ISR and moves each
   partition it leads to an in-sync follower at the next leader epoch, answering with the
   partitions it still leads (those no other replica can lead). The node then waits until its
   own replicas have been told that they follow, asking again every ``retry_backoff``: each
   request also keeps the controlled shutdown in force at the controller.
4. It stops once every leadership that could move has moved; or when ``timeout`` has passed;
   or after ``max_retries`` failed requests in a row (no replicator reachable, or it could not
   save the change), as Kafka's ``controlled.shutdown.max.retries`` gives up. Then the node
   stops as before, and the controller fences it when its process is gone.

Nothing is handed over without a replicator address, with ``controlled.shutdown.enable`` off,
or when the log directory has failed (its replicas are offline and already led elsewhere).

Not thread-safe: one event loop.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from kbroker.log.v1.log_pb2 import ReplicaState
from kbroker.replicator.v1 import replicator_pb2, replicator_pb2_grpc
from services.common.channels import internal_channel
from services.common.errors import error_name
from services.common.tls import InternalTls

from .log_manager import LogManager
from .partition_log import PartitionLog
from .replica_state import LEADER

log = logging.getLogger(__name__)

# The longest wait for the followers to copy what the leader took before it hands over; past
# it the leadership moves anyway (waiting produces are then answered NOT_LEADER_OR_FOLLOWER
# and retried by their clients).
DRAIN_TIMEOUT_S = 2.0
# The longest a single request to the replicator may take.
CALL_TIMEOUT_S = 5.0
# How often the node looks at its own replicas while it waits for them to change.
POLL_S = 0.01

TopicPartition = tuple[str, int]


@dataclass(frozen=True, slots=True, kw_only=True)
class ShutdownSettings:
    """Kafka's ``controlled.shutdown.*`` settings."""

    enabled: bool = True
    timeout_s: float = 30.0
    max_retries: int = 3
    retry_backoff_s: float = 0.5


def hands_over(state: ReplicaState) -> bool:
    """Whether a replica in ``state`` leads beside other in-sync replicas, one of which can
    take over (a replica without a leader epoch is not replicated at all)."""
    return state.role == LEADER and state.leader_epoch >= 0 and not state.in_sync_alone


def leaderships(manager: LogManager) -> set[TopicPartition]:
    """The replicated partitions whose replica on this node leads."""
    return {(p.topic, p.partition) for p in manager.partitions()
            if p.state.role == LEADER and p.state.leader_epoch >= 0}


class ControlledShutdown:
    """One node's controlled shutdown: :meth:`refuses` is the append path's check, :meth:`run`
    the shutdown itself."""

    def __init__(self, node_id: int, manager: LogManager, replicator_address: str,
                 tls: InternalTls, settings: ShutdownSettings) -> None:
        self.node_id = node_id
        self._manager = manager
        self._address = replicator_address
        self._tls = tls
        self.settings = settings
        # Set when the stop begins: appends to replicas that hand over are refused from then.
        self.handing_over = False
        self._outcome: bool | None = None

    def refuses(self, replica: PartitionLog) -> bool:
        """Whether an append to ``replica`` is refused: it is being handed over."""
        return self.handing_over and hands_over(replica.state)

    async def run(self) -> bool:
        """Hand over and return whether every leadership that could move has moved (False:
        the node stops without, for the reason logged). Runs once; later calls return the
        first one's outcome."""
        if self._outcome is None:
            self._outcome = await self._run()
        return self._outcome

    async def _run(self) -> bool:
        settings = self.settings
        if not settings.enabled or not self._address:
            return False
        failure = self._manager.log_dir.failure
        if failure is not None:
            log.info("controlled shutdown skipped: the log dir has failed (%s); its replicas "
                     "are already led elsewhere", failure)
            return False
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = started + settings.timeout_s
        self.handing_over = True
        led = leaderships(self._manager)
        log.info("controlled shutdown: handing over %d leadership(s)", len(led))
        drained = await self._wait(self._drained, min(DRAIN_TIMEOUT_S, settings.timeout_s))
        if not drained:
            log.warning("controlled shutdown: followers did not copy everything within %.1f s;"
                        " handing over anyway", DRAIN_TIMEOUT_S)
        channel = internal_channel(self._address, self._tls, "replicator")
        try:
            kept = await self._ask(replicator_pb2_grpc.ReplicatorStub(channel), deadline)
        finally:
            await channel.close()
        if kept is not None:
            log.info("controlled shutdown done in %.2f s: %d leadership(s) moved, %d kept "
                     "(no other replica can lead them)", loop.time() - started,
                     len(led - kept), len(kept))
        return kept is not None

    async def _ask(self, stub: replicator_pb2_grpc.ReplicatorStub, deadline: float
                   ) -> set[TopicPartition] | None:
        """Ask until the controller has moved what it can and this node follows there; the
        partitions it still leads, or None when it gave up."""
        loop = asyncio.get_running_loop()
        settings = self.settings
        request = replicator_pb2.ControlledShutdownRequest(node_id=self.node_id)
        failures = 0
        while (left := deadline - loop.time()) > 0:
            try:
                answer = await stub.ControlledShutdown(request,
                                                       timeout=min(left, CALL_TIMEOUT_S))
                code, why = answer.error_code, answer.error_message or error_name(
                    answer.error_code)
            except grpc.aio.AioRpcError as exc:
                code, why = -1, f"{exc.code().name}: {exc.details()}"
            if code:
                failures += 1
                if failures > settings.max_retries:
                    log.warning("controlled shutdown failed %d time(s) (%s); stopping without "
                                "handing over", failures, why)
                    return None
                log.info("controlled shutdown request failed (%s); retrying", why)
                await asyncio.sleep(max(0.0, min(settings.retry_backoff_s,
                                                 deadline - loop.time())))
                continue
            failures = 0
            staying = {(p.topic, p.partition) for p in answer.remaining_leaderships}
            if await self._wait(functools.partial(self._followed, staying),
                                min(settings.retry_backoff_s, deadline - loop.time())):
                return staying
        log.warning("controlled shutdown timed out after %.1f s; still leading %s",
                    settings.timeout_s, sorted(leaderships(self._manager)))
        return None

    def _followed(self, staying: set[TopicPartition]) -> bool:
        """Whether this node leads nothing but ``staying`` any more."""
        return not leaderships(self._manager) - staying

    def _drained(self) -> bool:
        return all(p.high_watermark >= p.log_end_offset for p in self._manager.partitions()
                   if hands_over(p.state) and self._manager.log_dir.failure is None)

    @staticmethod
    async def _wait(done: Callable[[], bool], seconds: float) -> bool:
        """Whether ``done()`` became true within ``seconds`` (looked at every POLL_S)."""
        loop = asyncio.get_running_loop()
        until = loop.time() + max(seconds, 0.0)
        while not done():
            if loop.time() >= until:
                return False
            await asyncio.sleep(POLL_S)
        return True
