"""The controller: owner of the cluster metadata (Kafka's QuorumController, reduced to what a
single active replicator needs). :class:`Controller` is the commit core (:mod:`.core`: the
image, the exclusive section, save-then-publish, deposed) with its control managers, each a
module of pure image changes and the operations that commit them:

- :mod:`.cluster`: log node liveness, fencing and controlled shutdowns
  (ClusterControlManager);
- :mod:`.topics`: creating and deleting topics, adding partitions, their replicas on the log
  nodes (the topic side of ReplicationControlManager);
- :mod:`.partitions`: leader elections on fencing and controlled shutdown, preferred
  leaders, ISR changes (its partition side);
- :mod:`.configs`: topic configs (ConfigurationControlManager);
- :mod:`.producer_ids`: producer id blocks (ProducerIdControlManager);
- :mod:`.acls`: ACL bindings (AclControlManager);
- :mod:`.scram`: SCRAM credentials (ScramControlManager);
- :mod:`.client_quotas`: client quotas (ClientQuotaControlManager).

A new kind of cluster metadata is a new manager module, registered
in :class:`Controller` and given its part of :class:`~services.replicator.metadata.MetadataImage`
(and of its JSON encoding); the servicer routes its RPCs to it.

Not thread-safe: one event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence

from services.common.acls import AclBinding
from services.common.errors import ErrorCode

from ..log_nodes import LogNodes
from ..metadata import LogNode, MetadataImage, NodeId, new_cluster_id
from ..metadata_store import MetadataStore
from .acls import AclControlManager, with_initial_acls
from .client_quotas import ClientQuotaControlManager
from .cluster import ClusterControlManager
from .config_resources import ConfigResourceControlManager
from .configs import ConfigControlManager
from .core import ControllerCore
from .partitions import PartitionControlManager
from .producer_ids import ProducerIdControlManager
from .reassignments import ReassignmentControlManager
from .scram import ScramControlManager
from .topics import TopicControlManager

log = logging.getLogger(__name__)


class Controller(ControllerCore):
    """Cluster metadata operations over a :class:`MetadataStore` and the log nodes."""

    def __init__(
        self,
        *,
        image: MetadataImage,
        store: MetadataStore,
        client: LogNodes,
        num_partitions: int = 1,
        default_replication_factor: int = 1,
        node_session_timeout_ms: int = 3000,
        unclean_leader_election: bool = False,
    ) -> None:
        super().__init__(image, store)
        self.cluster = ClusterControlManager(self, client, node_session_timeout_ms)
        self.topics = TopicControlManager(
            self, client, num_partitions=num_partitions,
            default_replication_factor=default_replication_factor)
        self.partitions = PartitionControlManager(self, unclean_leader_election)
        self.configs = ConfigControlManager(self, client)
        self.producer_ids = ProducerIdControlManager(self)
        self.acls = AclControlManager(self)
        self.scram = ScramControlManager(self)
        self.client_quotas = ClientQuotaControlManager(self)
        self.reassignments = ReassignmentControlManager(self)
        self.config_resources = ConfigResourceControlManager(self)
        self._checked_once = False
        self._tasks: list[asyncio.Task[None]] = []
        # Set when a log node exited: the next node check runs at once.
        self._check_now = asyncio.Event()

    @classmethod
    async def open(
        cls, *, store: MetadataStore, log_nodes: Sequence[LogNode], cluster_id: str = "",
        initial_acls: Sequence[AclBinding] = (), **settings: object,
    ) -> Controller:
        """Load the stored metadata (or start a new cluster, with ``initial_acls``), save it,
        and check every log node once, so the controller starts with real liveness. The
        controller owns ``store`` from here on (it is closed with the controller, or at once if
        opening fails). ``settings``: the other arguments of the constructor.

        Raises ValueError if the stored cluster id differs from a configured one, OSError if
        the store cannot be read or written."""
        try:
            image = await store.load()
            if image is None:
                image = with_initial_acls(
                    MetadataImage(cluster_id=cluster_id or new_cluster_id(), version=1),
                    initial_acls)
                if initial_acls:
                    log.info("a new cluster: %d initial ACLs stored", len(image.acls))
            elif cluster_id and image.cluster_id != cluster_id:
                raise ValueError(
                    f"the stored metadata belongs to cluster {image.cluster_id!r}, "
                    f"not the configured {cluster_id!r}"
                )
            image = image.replace(log_nodes=tuple(log_nodes))
            await store.save(image)
        except BaseException:
            await store.close()
            raise
        controller = cls(image=image, store=store, **settings)  # type: ignore[arg-type]
        await controller.check_nodes()
        return controller

    async def check_nodes(self) -> None:
        """Health-check every log node once and record who is alive; fence the nodes down for
        the session timeout; complete the reassignments that can; then (unless a topic operation
        is running) retry pending replica
        deletions and bring nodes that came back up to date with the configs."""
        revived, fenced = await self.cluster.check()
        await self.partitions.fence(fenced)
        await self.cluster.mark_fenced(fenced)
        await self.reassignments.complete()
        if self._checked_once:  # the first check finds the starting state
            self.configs.mark_stale(revived)
        self._checked_once = True
        await self.when_idle(self.topics.flush_deletions)
        await self.when_idle(self.configs.resync)

    async def controlled_shutdown(self, node_id: int) -> tuple[int, str, list[tuple[str, int]]]:
        """Log node ``node_id`` asks to stop (Kafka's broker heartbeat that wants to shut
        down): it is in controlled shutdown from now on, out of every ISR, its leaderships
        moved where they can go (:meth:`.partitions.PartitionControlManager.controlled_shutdown`).
        Returns (Kafka error code, message, the partitions it still leads):
        BROKER_ID_NOT_REGISTERED for a node that is not configured, REQUEST_TIMED_OUT when the
        change could not be saved (the node asks again)."""
        node = NodeId(node_id)
        if not self.cluster.knows(node):
            return (ErrorCode.broker_id_not_registered.value,
                    f"log node {node_id} is not one of this cluster's log nodes", [])
        self.cluster.asked_to_stop(node)
        try:
            staying = await self.partitions.controlled_shutdown(node)
        except OSError as exc:
            log.warning("could not save the controlled shutdown of log node %d: %s", node_id,
                        exc)
            return (ErrorCode.request_timed_out.value,
                    f"the controlled shutdown could not be saved: {exc}", [])
        return 0, "", staying

    def start(self, node_check_interval: float, rebalance_interval: float | None) -> None:
        """Check the log nodes every ``node_check_interval`` seconds, and at once when one
        exits, and, unless ``rebalance_interval`` is None, elect preferred leaders that often,
        until closed."""
        self._tasks.append(asyncio.create_task(
            _every(node_check_interval, self.check_nodes, "log node check",
                   wake=self._check_now), name="log-node-checks"))
        self._tasks.append(asyncio.create_task(
            self.cluster.watch_exits(self._check_now.set, node_check_interval),
            name="log-node-exits"))
        if rebalance_interval is not None:
            self._tasks.append(asyncio.create_task(
                _every(rebalance_interval, self.partitions.elect_preferred_leaders,
                       "preferred leader election"), name="leader-rebalance"))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await super().close()


async def _every(interval: float, work: Callable[[], Awaitable[object]], what: str,
                 wake: asyncio.Event | None = None) -> None:
    """``work`` every ``interval`` seconds, and at once whenever ``wake`` is set."""
    while True:
        if wake is None:
            await asyncio.sleep(interval)
        else:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    await wake.wait()
            wake.clear()
        try:
            await work()
        except Exception:  # the loop must survive any one bad round
            log.exception("%s failed", what)
