"""Start and stop the replicator service: the controller, its log node monitor, the
replication role and the gRPC server; with a Lease, as one of several replicas of which only
the holder acts (:func:`start_leased`)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc
from grpc_health.v1 import health_pb2
from grpc_health.v1._async import HealthServicer

from kbroker.replicator.v1 import replicator_pb2, replicator_pb2_grpc
from services.common.kubernetes_api import current_namespace, default_api_client
from services.common.server import ServiceBinding, create_server
from services.common.tls import InternalTls

from . import metrics
from .config import ReplicatorConfig
from .controller import Controller
from .controller.acls import load_initial_acls
from .grpc_log_nodes import GrpcLogNodes
from .leadership import (
    ElectionSettings,
    KubernetesLeases,
    LeaseElector,
    default_identity,
)
from .log_nodes import parse_log_nodes
from .metadata import LogNode
from .metadata_log import MetadataLog
from .metadata_store import JsonFileMetadataStore, MetadataStore
from .replication.manager import ReplicationManager
from .replication.progress import ProgressReporter
from .replication.settings import ReplicaSettings
from .servicer import ReplicatorServicer

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

log = logging.getLogger(__name__)

SERVICE_NAME = replicator_pb2.DESCRIPTOR.services_by_name["Replicator"].full_name


@dataclass
class ReplicatorService:
    """A running replicator: gRPC server, bound port, controller and replication role."""

    server: grpc.aio.Server
    port: int
    health: HealthServicer
    controller: Controller
    log_nodes: GrpcLogNodes
    replication: ReplicationManager

    async def serve_until(self, stop: asyncio.Event) -> int:
        """Serve until ``stop`` is set (exit status 0) or this replicator is deposed from the
        cluster metadata by another (1)."""
        deposed = self.controller.deposed
        waits = [asyncio.create_task(event.wait()) for event in (deposed, stop)]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in waits:
                task.cancel()
            if deposed.is_set():
                log.error("this replicator was deposed from the cluster metadata by another "
                          "replicator: stopping")
            await self.stop()
        return 1 if deposed.is_set() else 0

    async def stop(self, grace: float = 1.0) -> None:
        metrics.ACTIVE.set(0)
        await self.replication.stop()
        # Ends the metadata streams, so watchers see a clean end instead of a cancellation.
        await self.controller.close()
        await self.server.stop(grace)
        await self.log_nodes.close()


async def _serve(config: ReplicatorConfig, servicer: replicator_pb2_grpc.ReplicatorServicer
                 ) -> tuple[grpc.aio.Server, int, HealthServicer]:
    return await create_server(
        "replicator",
        [ServiceBinding(SERVICE_NAME, replicator_pb2_grpc.add_ReplicatorServicer_to_server,
                        servicer)],
        config.grpc_address, instance=config.instance, tls=InternalTls.of(config))


def metadata_store(config: ReplicatorConfig, nodes: tuple[LogNode, ...]) -> MetadataStore:
    """The store ``--metadata-store`` names: the metadata log on the log nodes (default) or
    the JSON file in the data directory."""
    if config.metadata_store == "file":
        return JsonFileMetadataStore(config.data_dir)
    if config.metadata_store == "log":
        return MetadataLog(nodes, start_timeout=max(config.metadata_log_start_timeout_ms, 0) / 1000,
                           tls=InternalTls.of(config))
    raise ValueError(f"unknown --metadata-store {config.metadata_store!r} (log or file)")


async def start(config: ReplicatorConfig) -> ReplicatorService:
    interval = max(config.node_check_interval_ms, 1) / 1000.0
    nodes = parse_log_nodes(config.log_nodes)
    # A health check may take as long as the interval between checks, within reason.
    tls = InternalTls.of(config)
    log_nodes = GrpcLogNodes(nodes, health_timeout=min(max(interval, 0.5), 5.0), tls=tls)
    try:
        initial_acls = (load_initial_acls(config.initial_acls_file)
                        if config.initial_acls_file else [])
        controller = await Controller.open(
            store=metadata_store(config, nodes),
            client=log_nodes,
            log_nodes=nodes,
            cluster_id=config.cluster_id,
            initial_acls=initial_acls,
            num_partitions=config.num_partitions,
            default_replication_factor=config.default_replication_factor,
            node_session_timeout_ms=config.node_session_timeout_ms,
            unclean_leader_election=config.unclean_leader_election_enable,
        )
        server, port, health = await _serve(config, ReplicatorServicer(controller))
    except BaseException:
        await log_nodes.close()
        raise
    purgatory = (ProgressReporter(config.purgatory_address, tls=tls) if config.purgatory_address
                 else None)
    replication = ReplicationManager(
        controller=controller, nodes=log_nodes,
        settings=ReplicaSettings(lag_time_max_ms=config.replica_lag_time_max_ms,
                                 fetch_wait_max_ms=config.replica_fetch_wait_max_ms,
                                 fetch_max_bytes=config.replica_fetch_max_bytes,
                                 fetch_response_max_bytes=config.replica_fetch_response_max_bytes,
                                 fetch_backoff_ms=config.replica_fetch_backoff_ms),
        resync_interval_s=interval, purgatory=purgatory)
    replication.start()
    controller.start(interval, max(config.leader_imbalance_check_interval_ms, 1) / 1000
                     if config.auto_leader_rebalance_enable else None)
    metrics.ACTIVE.set(1)
    image = controller.image
    log.info("replicator serving on port %d: cluster %s, metadata version %d, %d/%d log nodes "
             "alive", port, image.cluster_id, image.version, len(image.live_node_ids),
             len(image.log_nodes))
    return ReplicatorService(server, port, health, controller, log_nodes, replication)


# Health name that is SERVING while the process serves gRPC, active or standby: the target
# of the liveness and startup probes. "" and the Replicator service are SERVING only on the
# active replica, which is what readiness (and so the Service's endpoints) follows.
PROCESS_HEALTH = "liveness"
_STEP_DOWN_TIMEOUT_S = 3.0


class _StandbyServicer(replicator_pb2_grpc.ReplicatorServicer):
    """Every Replicator call on a standby fails UNAVAILABLE: callers retry, through the
    Service, against the active replica."""


async def _refuse(self: object, request: object, context: grpc.aio.ServicerContext) -> None:
    await context.abort(grpc.StatusCode.UNAVAILABLE,
                        "standby replicator: it does not hold the leader election lease")


for _method in replicator_pb2.DESCRIPTOR.services_by_name["Replicator"].methods:
    setattr(_StandbyServicer, _method.name, _refuse)


class LeasedReplicator:
    """A replicator among replicas that acts only while it holds the Lease.

    Life cycle: a standby gRPC server (health, reflection, metrics; Replicator calls refused,
    health NOT_SERVING for "" and the Replicator service) serves at once while the elector
    campaigns. Once the Lease is held, the standby server makes way for :func:`start` on the
    same port (opening the controller from the stored metadata), whose health is SERVING,
    and the elector keeps renewing.

    Losing the Lease (or being deposed from the metadata log by another replicator) is
    crash-only: the replicator stops acting at once (health NOT_SERVING, replication loops
    and the gRPC server stopped, so no write is accepted) and :attr:`finished` completes,
    after which the process exits non-zero and Kubernetes starts it again as a fresh standby.
    A replica that lost the Lease may hold state that is no longer the truth (another replica
    has moved on); starting over from the stored metadata is the one path that is always
    right, and it is the same path as a crash.
    """

    def __init__(self, config: ReplicatorConfig, elector: LeaseElector,
                 standby: grpc.aio.Server, port: int, close_api: Callable[[], None]) -> None:
        self._config = config
        self.elector = elector
        self._standby: grpc.aio.Server | None = standby
        self.port = port
        self._close_api = close_api
        self.service: ReplicatorService | None = None
        self._renewals: asyncio.Task[None] | None = None
        # Completes when this replica stops leading on its own: the Lease was lost or the
        # active start failed. A graceful stop() cancels it instead.
        self.finished: asyncio.Task[None] = asyncio.create_task(
            self._lead(), name="replicator-leadership")

    async def _lead(self) -> None:
        await self.elector.acquire()
        self._renewals = asyncio.create_task(self.elector.hold(), name="lease-renewals")
        standby, self._standby = self._standby, None
        if standby is not None:
            await standby.stop(0)
        host = self._config.grpc_address.rsplit(":", 1)[0]
        starting = asyncio.create_task(start(dataclasses.replace(
            self._config, grpc_address=f"{host}:{self.port}")), name="replicator-start")
        try:
            await asyncio.wait({self._renewals, starting}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            # A start still under way when the Lease is lost is cancelled; a finished one is
            # kept (to be stopped), a failed one ends the leadership with its error.
            starting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                self.service = await starting
        if self.service is not None:
            await self.service.health.set(PROCESS_HEALTH, health_pb2.HealthCheckResponse.SERVING)
            log.info("replicator %s is active (lease %s/%s)", self.elector.settings.identity,
                     self.elector.settings.namespace, self.elector.settings.lease_name)
            deposed = asyncio.create_task(self.service.controller.deposed.wait())
            try:
                await asyncio.wait({self._renewals, deposed},
                                   return_when=asyncio.FIRST_COMPLETED)
            finally:
                deposed.cancel()
            if not self._renewals.done():
                # Another replicator writes the metadata log at a newer controller epoch: this
                # one must not act, whatever the Lease says. Stop, then let the Lease go.
                log.error("replicator %s was deposed from the cluster metadata: stepping down",
                          self.elector.settings.identity)
                await _cancel(self._renewals)
                await self._step_down()
                await self.elector.release()
                return
        await self._step_down()

    async def _step_down(self) -> None:
        service, self.service = self.service, None
        if service is None:
            return
        for name in ("", SERVICE_NAME, PROCESS_HEALTH):
            await service.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        try:
            async with asyncio.timeout(_STEP_DOWN_TIMEOUT_S):
                await service.stop(0)
        except TimeoutError:
            log.error("replicator did not stop within %.0f s after losing the lease",
                      _STEP_DOWN_TIMEOUT_S)

    async def stop(self, grace: float = 1.0) -> None:
        """Graceful stop (SIGTERM): stop acting, then release the Lease so a standby takes
        over at its next try."""
        await _cancel(self.finished)
        service, self.service = self.service, None
        if service is not None:
            await service.stop(grace)
        if self._renewals is not None:
            await _cancel(self._renewals)
        await self.elector.release()
        standby, self._standby = self._standby, None
        if standby is not None:
            await standby.stop(grace)
        self._close_api()

    async def serve_until(self, stop: asyncio.Event) -> int:
        """Run until ``stop`` is set (exit code 0) or leadership ends on its own (1)."""
        stopping = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait({stopping, self.finished}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
        ended = self.finished.done()
        if ended and not self.finished.cancelled() and self.finished.exception() is not None:
            log.error("replicator failed while leading", exc_info=self.finished.exception())
        elif ended:
            log.error("replicator lost the lease: exiting so that it restarts as a standby")
        await self.stop(0 if ended else 1.0)
        return 1 if ended else 0


async def _cancel(task: asyncio.Task[None]) -> None:
    """Cancel ``task`` (if still running) and wait until it ends; its error (already logged
    by whoever watched it) is not raised again."""
    task.cancel()
    with contextlib.suppress(Exception, asyncio.CancelledError):
        await task


async def start_leased(config: ReplicatorConfig,
                       api_client: ApiClient | None = None) -> LeasedReplicator:
    """Serve as a standby at once and campaign for ``config.leader_election_lease`` through
    ``api_client`` (default: the in-cluster service account, else the kubeconfig)."""
    settings = ElectionSettings(
        lease_name=config.leader_election_lease,
        namespace=config.leader_election_namespace or current_namespace(),
        identity=config.leader_election_identity or default_identity(),
        lease_duration=config.leader_election_lease_duration_ms / 1000,
        renew_deadline=config.leader_election_renew_deadline_ms / 1000,
        retry_period=config.leader_election_retry_period_ms / 1000,
    )
    own_client = api_client is None
    client = default_api_client() if api_client is None else api_client
    elector = LeaseElector(
        KubernetesLeases(client, settings.lease_name, settings.namespace,
                         settings.request_timeout), settings)
    server, port, health = await _serve(config, _StandbyServicer())
    for name in ("", SERVICE_NAME):
        await health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    await health.set(PROCESS_HEALTH, health_pb2.HealthCheckResponse.SERVING)
    log.info("replicator %s on port %d: standby, waiting for lease %s/%s", settings.identity,
             port, settings.namespace, settings.lease_name)
    return LeasedReplicator(config, elector, server, port,
                            client.close if own_client else lambda: None)
