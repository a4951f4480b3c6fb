"""Telling the purgatory that a partition's high watermark moved, straight from the replicator
(as well as through the leader, whose log node reports its own high watermark): the acks=all
produces waiting on it complete one process hop sooner.

Each move is reported on the partition's key (``<topic>-<partition>``, which long-poll fetches
wait on) and on its key at the leader epoch (``<topic>-<partition>@<epoch>``, which acks=all
produces wait on, so that a later leader never completes what an earlier one appended); when a
partition gets a new leader, the old epoch's key is failed with NOT_LEADER_OR_FOLLOWER, so its
waiting produces answer at once and the clients retry with the new leader. The purgatory keeps
the last report of a key, from whoever made it; the leader's report of the same high
watermark follows shortly after, so a stale report from either side is overtaken at once.

Reporting never waits: :meth:`ProgressReporter.report` records the newest high watermark per
key, and one task writes everything recorded as one message on a long-lived ``ReportProgress``
stream (what is recorded meanwhile coalesces into the next message). A broken stream drops
what it carried (the leader's reports still complete the waits) and the next report opens a
new one. Not thread-safe (one event loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import grpc

from kbroker.purgatory.v1 import purgatory_pb2, purgatory_pb2_grpc
from services.common.channels import insecure_channel
from services.common.errors import ErrorCode

log = logging.getLogger(__name__)

WRITE_TIMEOUT_S = 5.0
_FAILURE_LOG_INTERVAL_S = 30.0


def partition_key(topic: str, partition: int) -> str:
    """The purgatory key of a partition (Kafka's ``TopicPartitionOperationKey``)."""
    return f"{topic}-{partition}"


def epoch_key(topic: str, partition: int, leader_epoch: int) -> str:
    """The purgatory key of a partition's appends at one leader epoch."""
    return f"{topic}-{partition}@{leader_epoch}"


class ProgressReporter:
    """Coalescing, fire-and-forget high watermark reports; create inside the event loop."""

    def __init__(self, address: str) -> None:
        self.address = address
        self._channel = insecure_channel(address)
        self._stub = purgatory_pb2_grpc.PurgatoryStub(self._channel)
        # key -> (position, Kafka error code)
        self._pending: dict[str, tuple[int, int]] = {}
        self._stream: grpc.aio.StreamUnaryCall | None = None
        self._wake = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run(),
                                                            name="purgatory-progress")
        self._last_failure_log = 0.0

    def report(self, topic: str, partition: int, leader_epoch: int,
               high_watermark: int) -> None:
        self._pending[partition_key(topic, partition)] = (high_watermark, 0)
        self._pending[epoch_key(topic, partition, leader_epoch)] = (high_watermark, 0)
        self._wake.set()

    def leader_changed(self, topic: str, partition: int, old_epoch: int,
                       high_watermark: int) -> None:
        """Fail what waits on ``old_epoch``'s key: that leader no longer leads."""
        self._pending[epoch_key(topic, partition, old_epoch)] = (
            high_watermark, ErrorCode.not_leader_or_follower.value)
        self._wake.set()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            pending, self._pending = self._pending, {}
            if pending:
                await self._send(pending)

    async def _send(self, positions: dict[str, tuple[int, int]]) -> None:
        request = purgatory_pb2.CheckAndCompleteRequest(keys=[
            purgatory_pb2.KeyState(key=key, position=position, error_code=error)
            for key, (position, error) in positions.items()])
        try:
            if self._stream is None or self._stream.done():
                self._stream = self._stub.ReportProgress()
            async with asyncio.timeout(WRITE_TIMEOUT_S):  # not wait_for: see manager.py
                await self._stream.write(request)
        except (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError,
                TimeoutError) as exc:
            self._drop_stream()
            now = time.monotonic()
            if now - self._last_failure_log >= _FAILURE_LOG_INTERVAL_S:
                self._last_failure_log = now
                log.warning("purgatory %s: progress report failed (%s); %d key(s) dropped",
                            self.address, type(exc).__name__, len(positions))

    def _drop_stream(self) -> None:
        if self._stream is not None:
            self._stream.cancel()
            self._stream = None

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._drop_stream()
        await self._channel.close()
