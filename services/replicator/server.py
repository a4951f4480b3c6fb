"""Start and stop the replicator service: the controller, its log node monitor, the
replication role and the gRPC server."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import grpc

from kbroker.replicator.v1 import replicator_pb2, replicator_pb2_grpc
from services.common.server import ServiceBinding, create_server

from .config import ReplicatorConfig
from .controller import Controller
from .log_nodes import GrpcLogNodes, parse_log_nodes
from .metadata_store import JsonFileMetadataStore
from .replication.fetcher import FetchSettings
from .replication.manager import ReplicationManager
from .replication.progress import ProgressReporter
from .servicer import ReplicatorServicer

log = logging.getLogger(__name__)

SERVICE_NAME = replicator_pb2.DESCRIPTOR.services_by_name["Replicator"].full_name


class ReplicatorService:
    """A running replicator: gRPC server, bound port, controller and node monitor."""

    def __init__(
        self,
        server: grpc.aio.Server,
        port: int,
        controller: Controller,
        monitor: asyncio.Task[None],
        log_nodes: GrpcLogNodes,
        replication: ReplicationManager,
        rebalance: asyncio.Task[None] | None = None,
    ) -> None:
        self._server = server
        self.port = port
        self.controller = controller
        self._monitor = monitor
        self._log_nodes = log_nodes
        self.replication = replication
        self._rebalance = rebalance

    async def stop(self, grace: float = 1.0) -> None:
        for task in (self._monitor, self._rebalance):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self.replication.stop()
        # Ends the metadata streams, so watchers see a clean end instead of a cancellation.
        await self.controller.close()
        await self._server.stop(grace)
        await self._log_nodes.close()


async def start(config: ReplicatorConfig) -> ReplicatorService:
    interval = max(config.node_check_interval_ms, 1) / 1000.0
    nodes = parse_log_nodes(config.log_nodes)
    # A health check may take as long as the interval between checks, within reason.
    log_nodes = GrpcLogNodes(nodes, health_timeout=min(max(interval, 0.5), 5.0))
    try:
        controller = await Controller.open(
            store=JsonFileMetadataStore(config.data_dir),
            client=log_nodes,
            log_nodes=nodes,
            cluster_id=config.cluster_id,
            num_partitions=config.num_partitions,
            default_replication_factor=config.default_replication_factor,
            node_session_timeout_ms=config.node_session_timeout_ms,
            unclean_leader_election=config.unclean_leader_election_enable,
        )
        server, port, _health = await create_server(
            "replicator",
            [ServiceBinding(SERVICE_NAME, replicator_pb2_grpc.add_ReplicatorServicer_to_server,
                            ReplicatorServicer(controller))],
            config.grpc_address,
            instance=config.grpc_address,
        )
    except BaseException:
        await log_nodes.close()
        raise
    monitor = asyncio.create_task(controller.run_node_checks(interval), name="log-node-checks")
    purgatory = ProgressReporter(config.purgatory_address) if config.purgatory_address else None
    replication = ReplicationManager(
        controller=controller, nodes=log_nodes, lag_time_max_ms=config.replica_lag_time_max_ms,
        fetch=FetchSettings(wait_ms=config.replica_fetch_wait_max_ms,
                            max_bytes=config.replica_fetch_max_bytes,
                            response_max_bytes=config.replica_fetch_response_max_bytes,
                            backoff_ms=config.replica_fetch_backoff_ms),
        resync_interval_s=interval, purgatory=purgatory)
    replication.start()
    rebalance = None
    if config.auto_leader_rebalance_enable:
        rebalance = asyncio.create_task(controller.run_leader_rebalance(
            max(config.leader_imbalance_check_interval_ms, 1) / 1000), name="leader-rebalance")
    image = controller.image
    log.info("replicator serving on port %d: cluster %s, metadata version %d, %d/%d log nodes "
             "alive", port, image.cluster_id, image.version, len(image.live_node_ids),
             len(image.log_nodes))
    return ReplicatorService(server, port, controller, monitor, log_nodes, replication,
                             rebalance)
