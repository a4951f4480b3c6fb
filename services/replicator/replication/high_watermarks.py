"""Pushing high watermarks to a leader log node: the last step of an acks=all produce, so it
must be quick and never queue behind itself.

:meth:`HighWatermarkPusher.push` only records the partition's newest high watermark; one task
per node sends everything recorded in one ``UpdateHighWatermarks`` call, and what is recorded
while a call is in flight goes in the next one (the newest value per partition wins). A call
that fails as a whole keeps its values for a retry after a short backoff (unless newer ones
came meanwhile); a partition the node refuses (another epoch, or gone) is dropped and reported
to ``on_refused``, which sends the replica its state again. Not thread-safe (one event loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from kbroker.log.v1 import log_pb2

from .. import metrics
from ..log_nodes import LogNodeError, LogNodes, TopicPartition
from ..metadata import NodeId

log = logging.getLogger(__name__)

_FAILURE_LOG_INTERVAL_S = 30.0


class HighWatermarkPusher:
    def __init__(
        self,
        node_id: NodeId,
        nodes: LogNodes,
        *,
        backoff_s: float,
        on_refused: Callable[[NodeId, log_pb2.PartitionError], None],
    ) -> None:
        self.node_id = node_id
        self._nodes = nodes
        self._backoff_s = backoff_s
        self._on_refused = on_refused
        self._pending: dict[TopicPartition, log_pb2.PartitionHighWatermark] = {}
        self._wake = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name=f"high-watermarks-{node_id}")
        self._last_failure_log = 0.0

    def push(self, topic: str, partition: int, leader_epoch: int, high_watermark: int) -> None:
        """Send ``high_watermark`` soon; returns at once."""
        self._pending[(topic, partition)] = log_pb2.PartitionHighWatermark(
            topic=topic, partition=partition, leader_epoch=leader_epoch,
            high_watermark=high_watermark)
        self._wake.set()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            pending, self._pending = self._pending, {}
            if not pending:
                continue
            try:
                refused = await self._nodes.update_high_watermarks(
                    self.node_id, list(pending.values()))
            except LogNodeError as exc:
                metrics.HIGH_WATERMARK_PUSHES.labels("failed").inc()
                now = time.monotonic()
                if now - self._last_failure_log >= _FAILURE_LOG_INTERVAL_S:
                    self._last_failure_log = now
                    log.warning("log node %d: high watermark update failed: %s", self.node_id,
                                exc.message)
                for key, update in pending.items():
                    self._pending.setdefault(key, update)
                await asyncio.sleep(self._backoff_s)
                self._wake.set()
                continue
            metrics.HIGH_WATERMARK_PUSHES.labels("sent").inc()
            for failure in refused:
                self._on_refused(self.node_id, failure)

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
