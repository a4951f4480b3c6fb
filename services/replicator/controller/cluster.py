"""Cluster membership (Kafka's ClusterControlManager and BrokerHeartbeatManager, for log nodes
that are configured rather than registered): which log nodes are alive, and which are fenced.

- Liveness: a node is alive while its latest health check answered SERVING. Only live nodes
  receive new replicas and count toward the replication factor limit. A liveness change bumps
  the version (clients see live nodes as brokers).
- Fencing: a node whose health checks have failed for ``node_session_timeout_ms`` is fenced
  (marked so in the image: until then it still leads its partitions, as a Kafka broker does
  until its session expires, and coordinators are still found there); what fencing does to
  its partitions is :mod:`.partitions`'.
- Failed log directory: a node that answers its health check with its log service NOT_SERVING
  has lost its log directory (Kafka's offline log dir, reported in a broker heartbeat): every
  replica on it is offline, so it is fenced at once, without waiting for the session timeout;
  it is not alive, so it gets no new replicas. Restarted with space, it answers SERVING and
  comes back as any restarted node does.
- Exits: a node whose process certainly exited (the stream held open to it broke and its port
  refuses connections, :meth:`LogNodes.wait_exit`) is fenced at the next check, without
  waiting for the session timeout, as a Kafka controller fences a broker at once on its
  controlled shutdown. A node that is only silent (stopped, overloaded) keeps the timeout.
- Controlled shutdown (Kafka's broker in controlled shutdown, held by its heartbeats): a log
  node asked to stop (SIGTERM) asks the controller, again and again until it has handed its
  leaderships over (:mod:`.partitions` moves them); it is marked so in the image and is no
  longer *active*: no election, ISR expansion or placement picks it. The mark ends with the
  node: when it stops answering its health checks (its stop begins), when its process exits,
  or when it has not asked for the session timeout (a node that gave up, or restarted without
  its exit being seen). Its stop shows as a log service NOT_SERVING, as a failed log dir does;
  for a node in controlled shutdown that is the expected end, not a failure.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from collections.abc import Callable, Collection, Mapping

from .. import metrics
from ..log_nodes import LogNodes, NodeHealth
from ..metadata import LogNode, MetadataImage, NodeId
from .core import ControllerCore

log = logging.getLogger(__name__)


def with_liveness(
    image: MetadataImage, alive: Mapping[NodeId, bool], ended: Collection[NodeId] = ()
) -> tuple[MetadataImage, list[LogNode]]:
    """The image with each node's liveness from ``alive`` (a live node is not fenced; a node
    that is not alive, or is in ``ended``, is no longer in controlled shutdown), and the nodes
    whose liveness or controlled shutdown changed."""
    nodes = tuple(dataclasses.replace(
        n, alive=(live := alive.get(n.node_id, n.alive)), fenced=n.fenced and not live,
        in_controlled_shutdown=n.in_controlled_shutdown and live and n.node_id not in ended)
        for n in image.log_nodes)
    changed = [after for before, after in zip(image.log_nodes, nodes, strict=True)
               if (before.alive, before.in_controlled_shutdown)
               != (after.alive, after.in_controlled_shutdown)]
    return (image if nodes == image.log_nodes else image.replace(log_nodes=nodes)), changed


def with_controlled_shutdown(image: MetadataImage, node_id: NodeId) -> MetadataImage:
    """The image with ``node_id`` in controlled shutdown."""
    nodes = tuple(dataclasses.replace(n, in_controlled_shutdown=True)
                  if n.node_id == node_id else n for n in image.log_nodes)
    return image if nodes == image.log_nodes else image.replace(log_nodes=nodes)


def with_fenced(image: MetadataImage, fenced: Collection[NodeId]) -> tuple[MetadataImage, None]:
    """The image with the ``fenced`` nodes that are not alive marked fenced."""
    nodes = tuple(dataclasses.replace(n, fenced=True) if n.node_id in fenced and not n.alive
                  else n for n in image.log_nodes)
    return (image if nodes == image.log_nodes else image.replace(log_nodes=nodes)), None


class ClusterControlManager:
    def __init__(self, core: ControllerCore, client: LogNodes,
                 session_timeout_ms: int) -> None:
        self._core = core
        self._client = client
        self._session_timeout_s = session_timeout_ms / 1000
        # Nodes failing their health checks, since when (monotonic seconds).
        self._down_since: dict[NodeId, float] = {}
        # Nodes reporting a failed log directory.
        self._failed_log_dirs: set[NodeId] = set()
        # Nodes whose process exited, since when: fenced unless a later check finds them back.
        self._exited: dict[NodeId, float] = {}
        # Nodes in controlled shutdown: when each last asked to stop.
        self._shutdown_asked: dict[NodeId, float] = {}

    def knows(self, node_id: NodeId) -> bool:
        return any(n.node_id == node_id for n in self._core.image.log_nodes)

    def asked_to_stop(self, node_id: NodeId) -> None:
        """``node_id`` asked for (or, asking again, holds on to) its controlled shutdown."""
        if node_id not in self._shutdown_asked:
            log.info("log node %d asks to stop: controlled shutdown", node_id)
            metrics.CONTROLLED_SHUTDOWNS.inc()
        self._shutdown_asked[node_id] = time.monotonic()

    async def check(self) -> tuple[set[NodeId], set[NodeId]]:
        """Health-check every log node once and commit who is alive. Returns the nodes that
        came alive, and the fenced nodes (down for the session timeout, or exited)."""
        nodes = self._core.image.log_nodes
        started = time.monotonic()
        health = dict(zip((n.node_id for n in nodes), await asyncio.gather(
            *(self._client.health(n.node_id) for n in nodes)), strict=True))
        alive = {node_id: h is NodeHealth.SERVING for node_id, h in health.items()}
        failed_dirs = {node_id for node_id, h in health.items()
                       if h is NodeHealth.LOG_DIR_FAILED}
        stopping = {n.node_id for n in self._core.image.log_nodes if n.in_controlled_shutdown}
        for node_id in sorted(failed_dirs - self._failed_log_dirs):
            if node_id in stopping:
                log.info("log node %d ends its controlled shutdown: it is stopping", node_id)
            else:
                log.error("log node %d reports a failed log dir: its replicas are offline; it "
                          "is fenced now, its partitions move to in-sync followers", node_id)
        self._failed_log_dirs = failed_dirs
        now = time.monotonic()
        # A controlled shutdown ends with the process, or when the node stops asking.
        ended = {n for n in stopping if n in self._exited or not alive.get(n)
                 or now - self._shutdown_asked.get(n, -math.inf) >= self._session_timeout_s}
        for node_id in ended:
            self._shutdown_asked.pop(node_id, None)
        for node_id, ok in alive.items():
            if ok:
                self._down_since.pop(node_id, None)
                # An exit seen while this check ran may have come after the node answered.
                if self._exited.get(node_id, now) < started:
                    del self._exited[node_id]
            else:
                self._down_since.setdefault(node_id, now)
        fenced = {n for n, since in self._down_since.items()
                  if now - since >= self._session_timeout_s or n in self._exited} | failed_dirs
        before = {n.node_id: n for n in self._core.image.log_nodes}
        try:
            changed = await self._core.commit(lambda image: with_liveness(image, alive, ended))
        except OSError:
            log.exception("could not save log node liveness; will retry at the next check")
            changed = []
        revived = set()
        for node in changed:
            was = before[node.node_id]
            if was.alive != node.alive:
                if node.alive:
                    revived.add(node.node_id)
                if node.node_id not in failed_dirs:  # logged above
                    log.info("log node %d (%s) is %s", node.node_id, node.address,
                             "alive" if node.alive else "not responding")
            elif node.alive and was.in_controlled_shutdown:
                log.warning("log node %d stopped asking for its controlled shutdown; it is "
                            "active again", node.node_id)
        return revived, fenced

    async def watch_exits(self, exited: Callable[[], None], pause_s: float) -> None:
        """Watch every log node for the exit of its process (until cancelled): note each exit
        and call ``exited``, so the controller checks the nodes at once. ``pause_s``: the wait
        before watching a node again after its exit (it refuses until it restarts)."""

        async def watch(node: LogNode) -> None:
            while True:
                await self._client.wait_exit(node.node_id)
                if node.node_id not in self._exited:
                    log.warning("log node %d (%s) exited: its port refuses connections",
                                node.node_id, node.address)
                    self._exited[node.node_id] = time.monotonic()
                    exited()
                await asyncio.sleep(pause_s)

        await asyncio.gather(*(watch(n) for n in self._core.image.log_nodes))

    async def mark_fenced(self, fenced: Collection[NodeId]) -> None:
        """Mark the ``fenced`` nodes so in the image, once their partitions have moved: clients
        stop being told about them as brokers."""
        if fenced:
            await self._core.commit(lambda image: with_fenced(image, fenced))
