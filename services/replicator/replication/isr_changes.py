"""The control streams of the active replicator: one ``AlterPartitions`` stream held open to
every live log node, on which the node's leaders ask for ISR changes (Kafka's AlterPartition,
sent by the leader to the controller; here the controller holds the stream, so log nodes need
no controller address, and whichever replicator is active hears them). Each batch of changes
is handed to ``decide`` (which commits what still applies through the controller) and its
answers are written back on the stream.

A stream that fails is opened again after a pause (doubling up to :data:`MAX_BACKOFF_S`); the
node then sends every change it has not had answered again. Not thread-safe: one event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Sequence

from kbroker.log.v1 import log_pb2

from ..log_nodes import LogNodeError, LogNodes
from ..metadata import NodeId

log = logging.getLogger(__name__)

MAX_BACKOFF_S = 1.0
_FAILURE_LOG_INTERVAL_S = 30.0

Decide = Callable[[NodeId, Sequence[log_pb2.IsrChange]], Awaitable[log_pb2.IsrChangeAnswers]]


class IsrChangeStreams:
    def __init__(self, nodes: LogNodes, decide: Decide, backoff_s: float) -> None:
        self._nodes = nodes
        self._decide = decide
        self._backoff_s = max(backoff_s, 0.01)
        self._tasks: dict[NodeId, asyncio.Task[None]] = {}
        self._last_failure_log: dict[NodeId, float] = {}

    def follow(self, alive: Collection[NodeId]) -> None:
        """Hold a stream open to exactly the nodes ``alive``."""
        for node in [n for n in self._tasks if n not in alive]:
            self._tasks.pop(node).cancel()
        for node in alive:
            if node not in self._tasks:
                self._tasks[node] = asyncio.get_running_loop().create_task(
                    self._serve(node), name=f"isr-changes-{node}")

    async def stop(self) -> None:
        tasks, self._tasks = list(self._tasks.values()), {}
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _serve(self, node: NodeId) -> None:
        failures = 0
        while True:
            try:
                stream = self._nodes.alter_partitions(node)
            except LogNodeError as exc:
                self._log_failure(node, exc.message)
            else:
                try:
                    while True:
                        requests = await stream.read()
                        if requests is None:
                            break
                        failures = 0
                        answers = await self._decide(node, requests.changes)
                        await stream.write(answers)
                except LogNodeError as exc:
                    self._log_failure(node, exc.message)
                except Exception:  # the stream must survive anything one answer does
                    log.exception("ISR changes of log node %d failed", node)
                finally:
                    stream.cancel()
            failures += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.sleep(min(self._backoff_s * 2 ** min(failures - 1, 6),
                                        MAX_BACKOFF_S))

    def _log_failure(self, node: NodeId, message: str) -> None:
        now = time.monotonic()
        if now - self._last_failure_log.get(node, 0.0) >= _FAILURE_LOG_INTERVAL_S:
            self._last_failure_log[node] = now
            log.debug("%s", message)
