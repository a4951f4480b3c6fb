"""Tells the purgatory when a partition's high watermark moves, so that parked operations
watching ``<topic>-<partition>`` (DelayedProduce, DelayedFetch) complete without waiting for
their timeout.

An append must never wait for, or fail because of, the purgatory: :meth:`notify` only records
the key's latest position in memory; one background task writes the pending keys as one
message on a long-lived ``ReportProgress`` stream (far cheaper than a call per append), so
positions reported while a write is in flight coalesce (the latest position per key wins). When
the stream breaks the positions in hand are dropped - a parked operation still completes by
timeout - and the next report opens a new stream; the channel reconnects on its own.

Only keys the purgatory watches are reported (its ``WatchKeys`` stream lists the keys with
parked fetch or produce operations): a partition nobody long-polls and no acks=all producer
waits on costs no message per append. When a key is added, its current position is reported at
once, which covers what was skipped before. Without the stream (not yet open, broken, or a
purgatory that does not serve it) every key is reported, so no wake-up is ever missed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence

import grpc

from kbroker.purgatory.v1 import purgatory_pb2, purgatory_pb2_grpc
from services.common.channels import insecure_channel

from .metrics import PURGATORY_NOTIFICATIONS

log = logging.getLogger(__name__)

CALL_TIMEOUT_SECONDS = 5.0
# Reopening a broken WatchKeys stream: first after this long, then doubling up to the cap.
_WATCH_RETRY_SECONDS = (0.1, 2.0)
# A purgatory that does not serve WatchKeys is asked again this rarely.
_WATCH_UNSUPPORTED_RETRY_SECONDS = 60.0
# Repeated failures (a purgatory that is down) are logged at most this often.
_FAILURE_LOG_INTERVAL_SECONDS = 30.0


def partition_key(topic: str, partition: int) -> str:
    """The purgatory key of a partition, as Kafka's ``TopicPartitionOperationKey``."""
    return f"{topic}-{partition}"


def epoch_key(key: str, leader_epoch: int) -> str:
    """The purgatory key of a partition's appends at one leader epoch."""
    return f"{key}@{leader_epoch}"


def parse_key(key: str) -> tuple[str, int, int | None] | None:
    """(topic, partition, leader epoch or None) of a key made by :func:`partition_key` or
    :func:`epoch_key`; None for any other key (topic names may hold '-', never '@')."""
    base, at, epoch = key.partition("@")
    topic, dash, partition = base.rpartition("-")
    if not dash or not topic or not partition.isdigit() or (at and not epoch.isdigit()):
        return None
    return topic, int(partition), int(epoch) if at else None


# The current position of a key on this node, or None if this node does not report it.
PositionSource = Callable[[str], "int | None"]


class PurgatoryNotifier:
    """Coalescing, fire-and-forget CheckAndComplete sender; create inside the event loop."""

    def __init__(self, address: str, position_of: PositionSource | None = None) -> None:
        self.address = address
        self._channel = insecure_channel(address)
        self._stub = purgatory_pb2_grpc.PurgatoryStub(self._channel)
        self._pending: dict[str, int] = {}
        self._stream: grpc.aio.StreamUnaryCall | None = None
        self._wake = asyncio.Event()
        # Keys the purgatory watches; None while that is not known (then every key is reported).
        self._watched: set[str] | None = None
        # Where the current position of a newly watched key comes from (set once the replicas
        # are loaded; until then a newly watched key waits for its next move).
        self.position_of = position_of
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._run(), name="purgatory-notify")
        self._watch_task = loop.create_task(self._follow_watched_keys(),
                                            name="purgatory-watched-keys")
        self._last_failure_log = 0.0

    def notify(self, key: str, position: int) -> None:
        """Report ``key``'s new position (unless the purgatory does not watch it); returns at
        once."""
        watched = self._watched
        if watched is not None and key not in watched:
            return
        self._pending[key] = position
        self._wake.set()

    @property
    def watched_keys(self) -> frozenset[str] | None:
        """The keys reported now; None means every key."""
        return None if self._watched is None else frozenset(self._watched)

    def apply_watched_keys(self, reset: bool, added: Sequence[str],
                           removed: Sequence[str]) -> None:
        """Take one WatchKeys message: adopt the change, then report the current position of
        every added key."""
        if reset or self._watched is None:
            self._watched = set(added)
        else:
            self._watched.difference_update(removed)
            self._watched.update(added)
        position_of = self.position_of
        if position_of is None:
            return
        for key in added:
            position = position_of(key)
            if position is not None:
                self._pending[key] = position
                self._wake.set()

    async def _follow_watched_keys(self) -> None:
        delay = _WATCH_RETRY_SECONDS[0]
        while True:
            call = self._stub.WatchKeys(purgatory_pb2.WatchKeysRequest())
            try:
                async for message in call:
                    self.apply_watched_keys(message.reset, message.added, message.removed)
                    delay = _WATCH_RETRY_SECONDS[0]
            except grpc.aio.AioRpcError as exc:
                if exc.code() is grpc.StatusCode.UNIMPLEMENTED:
                    log.info("purgatory %s does not publish watched keys; reporting every key",
                             self.address)
                    delay = _WATCH_UNSUPPORTED_RETRY_SECONDS
            finally:
                # Until the next reset nothing is known: report everything.
                self._watched = None
                call.cancel()
            await asyncio.sleep(delay)
            delay = min(delay * 2, _WATCH_RETRY_SECONDS[1])

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
        for task in (self._task, self._watch_task):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._drop_stream()
        await self._channel.close()


def _describe(exc: BaseException) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    return type(exc).__name__
