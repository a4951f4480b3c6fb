"""Tells the purgatory when a partition's high watermark moves, so that parked operations
watching ``<topic>-<partition>`` (DelayedProduce, DelayedFetch) complete without waiting for
their timeout.

An append must never wait for, or fail because of, the purgatory: :meth:`notify` only records
the key's latest position in memory; one background task writes the pending keys as one
message on a long-lived ``ReportProgress`` stream (far cheaper than a call per append), so
positions reported while a write is in flight coalesce (the latest position per key wins). When
the stream breaks the positions in hand are dropped - a parked operation still completes by
timeout - and the next report opens a new stream; the channel reconnects on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import grpc

from kbroker.purgatory.v1 import purgatory_pb2, purgatory_pb2_grpc
from services.common.channels import insecure_channel

from .metrics import PURGATORY_NOTIFICATIONS

log = logging.getLogger(__name__)

CALL_TIMEOUT_SECONDS = 5.0
# Repeated failures (a purgatory that is down) are logged at most this often.
_FAILURE_LOG_INTERVAL_SECONDS = 30.0


def partition_key(topic: str, partition: int) -> str:
    """The purgatory key of a partition, as Kafka's ``TopicPartitionOperationKey``."""
    return f"{topic}-{partition}"


def epoch_key(key: str, leader_epoch: int) -> str:
    """The purgatory key of a partition's appends at one leader epoch."""
    return f"{key}@{leader_epoch}"


class PurgatoryNotifier:
    """Coalescing, fire-and-forget CheckAndComplete sender; create inside the event loop."""

    def __init__(self, address: str) -> None:
        self.address = address
        self._channel = insecure_channel(address)
        self._stub = purgatory_pb2_grpc.PurgatoryStub(self._channel)
        self._pending: dict[str, int] = {}
        self._stream: grpc.aio.StreamUnaryCall | None = None
        self._wake = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="purgatory-notify")
        self._last_failure_log = 0.0

    def notify(self, key: str, position: int) -> None:
        """Report ``key``'s new position; returns at once."""
        self._pending[key] = position
        self._wake.set()

    def on_high_watermark(self, topic: str, partition: int, high_watermark: int,
                          leader_epoch: int = -1) -> None:
        """A partition log's high watermark listener. Besides the partition's key, a leader at
        an epoch reports ``<topic>-<partition>@<epoch>``: acks=all produces wait on that key,
        so a later leader's high watermark never completes what an earlier one appended."""
        key = partition_key(topic, partition)
        self.notify(key, high_watermark)
        if leader_epoch >= 0:
            self.notify(epoch_key(key, leader_epoch), high_watermark)

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            pending, self._pending = self._pending, {}
            if pending:
                await self._send(pending)

    async def _send(self, positions: dict[str, int]) -> None:
        request = purgatory_pb2.CheckAndCompleteRequest(
            keys=[purgatory_pb2.KeyState(key=key, position=position)
                  for key, position in positions.items()]
        )
        try:
            if self._stream is None or self._stream.done():
                self._stream = self._stub.ReportProgress()
            await asyncio.wait_for(self._stream.write(request), CALL_TIMEOUT_SECONDS)
        except (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError,
                TimeoutError) as exc:
            self._drop_stream()
            PURGATORY_NOTIFICATIONS.labels("failed").inc()
            now = time.monotonic()
            if now - self._last_failure_log >= _FAILURE_LOG_INTERVAL_SECONDS:
                self._last_failure_log = now
                log.warning("purgatory %s: progress report failed (%s); %d key(s) dropped",
                            self.address, _describe(exc), len(positions))
        except Exception:
            self._drop_stream()
            PURGATORY_NOTIFICATIONS.labels("failed").inc()
            log.exception("purgatory %s: progress report failed", self.address)
        else:
            PURGATORY_NOTIFICATIONS.labels("sent").inc()

    def _drop_stream(self) -> None:
        if self._stream is not None:
            self._stream.cancel()
            self._stream = None

    async def close(self) -> None:
        """Stop sending (pending positions are dropped) and close the channel."""
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._drop_stream()
        await self._channel.close()


def _describe(exc: BaseException) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    return type(exc).__name__
