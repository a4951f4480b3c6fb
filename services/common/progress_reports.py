"""Progress reports to the purgatory: the purgatory's key names, and :class:`ProgressStream`,
the one way a service (a log node, the replicator) tells it that keys moved.

Keys (Kafka's ``TopicPartitionOperationKey``): ``<topic>-<partition>``, which long-poll fetches
wait on, and ``<topic>-<partition>@<leader epoch>@<topic id>``, which acks=all produces wait on
(so that a later leader's high watermark never completes what an earlier leader appended; the
topic id, because a topic created again under a deleted one's name starts its epochs over).

An error reported for an epoch key ends that epoch for good: the purgatory fails every wait on
it, also one parked later (an append the old leader took just before it heard that it no longer
leads, whose produce parks after the epoch's end was reported), where the error of any other key
only concerns the operations parked before it.

A report never waits: :meth:`ProgressStream.report` records the newest (position, error, ISR)
per key (a leader's ISR on its epoch keys, see ``KeyState.isr``), and one task writes everything
recorded as one message on a long-lived ``ReportProgress`` stream (far cheaper than a call per
report); what is recorded while a write is in flight coalesces into the next message. When the
stream breaks, the reports in hand are dropped - a parked operation still completes by timeout -
and the next report opens a new stream.

Only keys the purgatory watches are reported (its ``WatchKeys`` stream lists the keys with
parked fetch or produce operations), so a partition nobody waits on costs no message per move.
A reporter given a ``position_of`` source answers each newly watched key with its current
position, which covers what it skipped before (log nodes do: they are the authority on their
high watermarks, and on the end of an epoch they have seen pass, which a report made while
nobody watched the key would otherwise lose); a reporter without one relies on those answers.
Errors are filtered alike: the purgatory honours an error only for operations parked before it
was reported (but an epoch's end for all). While the WatchKeys stream is not open (not yet, or
broken) every key is reported, so no wake-up is ever missed.

Not thread-safe: create and use inside one event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

import grpc

from kbroker.purgatory.v1 import purgatory_pb2, purgatory_pb2_grpc

from .channels import PLAINTEXT, internal_channel
from .tls import InternalTls

log = logging.getLogger(__name__)

WRITE_TIMEOUT_SECONDS = 5.0
# Reopening a broken WatchKeys stream: first after this long, then doubling up to the cap.
_WATCH_RETRY_SECONDS = (0.1, 2.0)
# Repeated failures (a purgatory that is down) are logged at most this often.
_FAILURE_LOG_INTERVAL_SECONDS = 30.0


# The position of a key that is not known (never reported, or an epoch ended where its last high
# watermark is not known to the reporter).
UNKNOWN_POSITION = -1


def partition_key(topic: str, partition: int) -> str:
    """The purgatory key of a partition."""
    return f"{topic}-{partition}"


def epoch_key(topic: str, partition: int, leader_epoch: int, topic_id: str) -> str:
    """The purgatory key of a partition's appends at one leader epoch."""
    return f"{topic}-{partition}@{leader_epoch}@{topic_id}"


def is_epoch_key(key: str) -> bool:
    """Whether ``key`` was made by :func:`epoch_key` (topic names never hold '@')."""
    return "@" in key


class ParsedKey(NamedTuple):
    topic: str
    partition: int
    leader_epoch: int | None  # None: a partition key
    topic_id: str | None


def parse_key(key: str) -> ParsedKey | None:
    """What a key made by :func:`partition_key` or :func:`epoch_key` names; None for any
    other key (topic names may hold '-', never '@')."""
    base, at, rest = key.partition("@")
    topic, dash, partition = base.rpartition("-")
    epoch, _, topic_id = rest.partition("@")
    if not dash or not topic or not partition.isdigit() or (at and not epoch.isdigit()):
        return None
    if not at:
        return ParsedKey(topic, int(partition), None, None)
    return ParsedKey(topic, int(partition), int(epoch), topic_id)


class Progress(NamedTuple):
    """Where a key is at a reporter: its position, and for a leader's epoch key the ISR that
    position was reached with (empty: not said); a Kafka error for an epoch key whose epoch the
    reporter knows to be over (0: none)."""

    position: int
    isr: tuple[int, ...] = ()
    error_code: int = 0


PositionSource = Callable[[str], "Progress | None"]
"""The current progress of a key at this reporter, or None if it does not report the key."""


class ProgressStream:
    """Coalescing, fire-and-forget progress reports on one purgatory's ReportProgress stream.
    ``on_outcome("sent" | "failed")`` is told how each write went (for metrics)."""

    def __init__(self, address: str, position_of: PositionSource | None = None,
                 on_outcome: Callable[[str], None] = lambda outcome: None, *,
                 tls: InternalTls = PLAINTEXT) -> None:
        self.address = address
        self._channel = internal_channel(address, tls, "purgatory")
        self._stub = purgatory_pb2_grpc.PurgatoryStub(self._channel)
        # key -> (position, Kafka error code, ISR)
        self._pending: dict[str, tuple[int, int, Sequence[int]]] = {}
        self._stream: grpc.aio.StreamUnaryCall | None = None
        self._wake = asyncio.Event()
        # Keys the purgatory watches; None while that is not known (then every key is reported).
        self._watched: set[str] | None = None
        # May be set later (a log node sets it once its replicas are loaded; until then a newly
        # watched key waits for its next move).
        self.position_of = position_of
        self._on_outcome = on_outcome
        self._last_failure_log = 0.0
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._run(), name="purgatory-progress")
        self._watch_task = loop.create_task(self._follow_watched_keys(),
                                            name="purgatory-watched-keys")

    def report(self, key: str, position: int, error_code: int = 0,
               isr: Sequence[int] = ()) -> None:
        """Report ``key``'s new position (unless nobody watches it); returns at once."""
        watched = self._watched
        if watched is not None and key not in watched:
            return
        self._pending[key] = (position, error_code, isr)
        self._wake.set()

    @property
    def watched_keys(self) -> frozenset[str] | None:
        """The keys reported now; None means every key."""
        return None if self._watched is None else frozenset(self._watched)

    def apply_watched_keys(self, reset: bool, added: Sequence[str],
                           removed: Sequence[str]) -> None:
        """Take one WatchKeys message: adopt the change, then report the current position of
        every added key this reporter knows."""
        if reset or self._watched is None:
            self._watched = set(added)
        else:
            self._watched.difference_update(removed)
            self._watched.update(added)
        position_of = self.position_of
        if position_of is None:
            return
        for key in added:
            progress = position_of(key)
            if progress is not None:
                self._pending[key] = (progress.position, progress.error_code, progress.isr)
                self._wake.set()

    async def _follow_watched_keys(self) -> None:
        delay = _WATCH_RETRY_SECONDS[0]
        while True:
            call = self._stub.WatchKeys(purgatory_pb2.WatchKeysRequest())
            try:
                async for message in call:
                    self.apply_watched_keys(message.reset, message.added, message.removed)
                    delay = _WATCH_RETRY_SECONDS[0]
            except grpc.aio.AioRpcError:
                pass  # reopened below, after a pause
            finally:
                # Until the next reset nothing is known: report everything.
                self._watched = None
                call.cancel()
            await asyncio.sleep(delay)
            delay = min(delay * 2, _WATCH_RETRY_SECONDS[1])

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            pending, self._pending = self._pending, {}
            if pending:
                await self._send(pending)

    async def _send(self, positions: dict[str, tuple[int, int, Sequence[int]]]) -> None:
        request = purgatory_pb2.CheckAndCompleteRequest(keys=[
            purgatory_pb2.KeyState(key=key, position=position, error_code=error, isr=isr)
            for key, (position, error, isr) in positions.items()])
        try:
            if self._stream is None or self._stream.done():
                self._stream = self._stub.ReportProgress()
            # asyncio.timeout, not wait_for: wait_for can swallow a cancellation (3.11).
            async with asyncio.timeout(WRITE_TIMEOUT_SECONDS):
                await self._stream.write(request)
        except (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError,
                TimeoutError) as exc:
            self._failed()
            now = time.monotonic()
            if now - self._last_failure_log >= _FAILURE_LOG_INTERVAL_SECONDS:
                self._last_failure_log = now
                log.warning("purgatory %s: progress report failed (%s); %d key(s) dropped",
                            self.address, _describe(exc), len(positions))
        except Exception:
            self._failed()
            log.exception("purgatory %s: progress report failed", self.address)
        else:
            self._on_outcome("sent")

    def _failed(self) -> None:
        if self._stream is not None:
            self._stream.cancel()
            self._stream = None
        self._on_outcome("failed")

    async def close(self) -> None:
        """Stop sending (pending reports are dropped) and close the channel."""
        for task in (self._task, self._watch_task):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._stream is not None:
            self._stream.cancel()
            self._stream = None
        await self._channel.close()


def _describe(exc: BaseException) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    return type(exc).__name__
