"""Start and stop a log node: reload the replicas from disk, then serve LogService (with the
health, reflection and metrics services every port has). A stop first hands the node's
leaderships over (:mod:`.controlled_shutdown`), then stops serving, then flushes and closes.

Health: the whole server ("") is SERVING while the process serves; LogService is SERVING until
the log directory fails (then NOT_SERVING until a restart: the replicator moves the node's
partitions away, while the process stays up for operators to see why)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2
from grpc_health.v1._async import HealthServicer

from kbroker.log.v1 import log_pb2
from services.common.errors import ErrorCode
from services.common.progress_reports import (
    UNKNOWN_POSITION,
    PositionSource,
    Progress,
    parse_key,
)
from services.common.server import ServiceBinding, create_server
from services.common.tls import InternalTls

from . import metrics
from .config import LogConfig
from .controlled_shutdown import ControlledShutdown
from .log_manager import LogManager
from .purgatory_notifier import PurgatoryNotifier
from .replica_manager import ReplicaManager
from .replica_state import LEADER
from .servicer import LogServicer, add_log_service_to_server

log = logging.getLogger(__name__)

SERVICE_NAME = log_pb2.DESCRIPTOR.services_by_name["LogService"].full_name


@dataclass(slots=True)
class LogService:
    """A running log node."""

    config: LogConfig
    manager: LogManager
    server: grpc.aio.Server
    port: int
    health: HealthServicer
    notifier: PurgatoryNotifier | None
    replicas: ReplicaManager
    shutdown: ControlledShutdown

    async def stop(self, grace: float = 1.0) -> None:
        """Hand the leaderships over (a controlled shutdown, when configured), finish in-flight
        calls (up to ``grace`` seconds), then flush and close the logs."""
        await self.shutdown.run()
        await self.health.enter_graceful_shutdown()
        self.replicas.begin_stop()
        stopping = asyncio.ensure_future(self.server.stop(grace))
        await asyncio.sleep(0)  # new calls are refused from here
        for replica in self.manager.partitions():
            replica.wake_readers()  # long-poll reads answer now rather than at their end
        await stopping
        await self.replicas.stop()
        metrics.FOLLOWER_LAGS.sources.discard(self.replicas.follower_lags)
        await self.manager.stop_background()
        if self.notifier is not None:
            await self.notifier.close()
        self.manager.close()
        metrics.PARTITIONS.set(0)
        metrics.PARTITION_LOGS.sources.discard(self.manager.partitions)
        metrics.LOG_DIRS.sources.discard(self.manager)


async def start(config: LogConfig) -> LogService:
    """Load the node's replicas from ``config.data_dir`` and start serving."""
    tls = InternalTls.of(config)
    notifier = (PurgatoryNotifier(config.purgatory_address, tls) if config.purgatory_address
                else None)
    manager = LogManager(
        Path(config.data_dir),
        config.topic_defaults(),
        notifier.on_high_watermark if notifier is not None else None,
        config.schedule(),
        config.free_space_floor(),
    )
    replicas = ReplicaManager(
        manager, config.node_id, tls=tls, transport=config.replica_fetch_transport,
        local_files=config.local_files,
        on_epoch_ended=notifier.on_epoch_ended if notifier is not None else None)
    shutdown = ControlledShutdown(config.node_id, manager, config.replicator_address, tls,
                                  config.controlled_shutdown())
    servicer = LogServicer(manager, replicas, local_files=config.local_files)
    servicer.refuses_append = shutdown.refuses
    try:
        manager.load()
        if notifier is not None:
            notifier.position_of = leader_high_watermarks(manager)
        metrics.PARTITIONS.set(len(manager))
        metrics.PARTITION_LOGS.sources.add(manager.partitions)
        metrics.LOG_DIRS.sources.add(manager)
        metrics.TRUNCATED_BYTES.inc(sum(p.truncated_at_open for p in manager.partitions()))
        replicas.start()
        server, port, health = await create_server(
            "log",
            [ServiceBinding(SERVICE_NAME, add_log_service_to_server, servicer)],
            config.grpc_address,
            instance=config.instance or f"log-{config.node_id}",
            tls=tls,
        )
        manager.log_dir.on_failure = out_of_service(health, asyncio.get_running_loop())
        manager.start_background()
        metrics.FOLLOWER_LAGS.sources.add(replicas.follower_lags)
    except BaseException:
        metrics.PARTITION_LOGS.sources.discard(manager.partitions)
        metrics.LOG_DIRS.sources.discard(manager)
        await replicas.stop()
        manager.close()
        if notifier is not None:
            await notifier.close()
        raise
    log.info(
        "log node %d serving on port %d with %d replica(s) in %s",
        config.node_id, port, len(manager), config.data_dir,
    )
    return LogService(config, manager, server, port, health, notifier, replicas, shutdown)


def out_of_service(health: HealthServicer, loop: asyncio.AbstractEventLoop
                   ) -> Callable[[str], None]:
    """What a failed log directory does to the node's health: LogService NOT_SERVING (from
    any thread)."""

    def failed(_: str) -> None:
        asyncio.run_coroutine_threadsafe(
            health.set(SERVICE_NAME, health_pb2.HealthCheckResponse.NOT_SERVING), loop)

    return failed


def leader_high_watermarks(manager: LogManager) -> PositionSource:
    """What this node reports for a purgatory key: the high watermark of a partition it leads
    (at the key's leader epoch and with its ISR, for an epoch key); for an epoch key of an
    epoch older than its replica's, that the epoch is over (NOT_LEADER_OR_FOLLOWER, at an
    unknown position: its last high watermark is the purgatory's to keep). An acks=all
    produce whose leader held its answer may park after its epoch ended, when the end's report
    found nobody watching. None for anything else."""

    def position_of(key: str) -> Progress | None:
        parsed = parse_key(key)
        if parsed is None:
            return None
        replica = manager.find(parsed.topic, parsed.partition)
        if replica is None:
            return None
        if parsed.leader_epoch is None:
            return Progress(replica.high_watermark) if replica.state.role == LEADER else None
        if parsed.topic_id != replica.topic_id:
            return None
        if parsed.leader_epoch < replica.state.leader_epoch:
            return Progress(UNKNOWN_POSITION, error_code=ErrorCode.not_leader_or_follower.value)
        if parsed.leader_epoch != replica.state.leader_epoch or replica.state.role != LEADER:
            return None
        return Progress(replica.high_watermark, tuple(replica.state.isr))

    return position_of
