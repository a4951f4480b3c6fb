"""The fetch loop from one leader log node to one follower log node (Kafka's
``ReplicaFetcherThread``), for every partition that node pair shares.

A round: check the logs of followers new to this leader epoch against the leader's and cut
them where they part (:meth:`ReplicaFetcher._prepare`); read from the leader, up to its log
end, from each follower's log end offset on (a long poll: the leader answers as soon as one of
the partitions gets an append, or after ``fetch_wait_ms``); append what came to the follower as
it is, with the high watermark the follower should have; record the follower's new log end
offset and whether it caught up with the leader, and report the partition's progress (the
manager then moves the high watermark). Partitions whose read or append failed back off for a
while, the others go on. When the partition set changes, a read in flight is abandoned (reads
have no effect) and the round starts over.

Per-partition errors: the follower refusing a state it should have (not a follower, another
epoch) or either side not knowing the partition is reported to ``on_stale_state``, which sends
the replica its state again; a follower append that does not continue its log (its log end
moved) takes the log end offset from the answer and retries; a read out of the leader's range
(the follower has more than the leader, or less than its log start) has the follower checked
again and is reported to ``on_diverged``. A node that fails as a whole makes the loop back
off, doubling up to ``8 * backoff``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from services.common.errors import ErrorCode

from .. import metrics
from ..log_nodes import LogNodeError
from ..metadata import NodeId
from .nodes import (
    FetchRequest,
    ReplicaNodes,
    ReplicateRequest,
    Role,
    TopicPartition,
)
from .partition_state import PartitionReplication

log = logging.getLogger(__name__)

_STALE_STATE = frozenset({
    ErrorCode.not_leader_or_follower, ErrorCode.fenced_leader_epoch,
    ErrorCode.unknown_leader_epoch, ErrorCode.unknown_topic_or_partition,
})
_FAILURE_LOG_INTERVAL_S = 30.0


def now_ms() -> int:
    return int(time.monotonic() * 1000)


@dataclass(frozen=True, slots=True, kw_only=True)
class FetchSettings:
    """Kafka's replica.fetch.* settings."""

    wait_ms: int = 500
    max_bytes: int = 1 << 20
    response_max_bytes: int = 10 << 20
    backoff_ms: int = 200


class ReplicaFetcher:
    """Copies one leader node's new batches to one follower node."""

    def __init__(
        self,
        *,
        leader: NodeId,
        follower: NodeId,
        nodes: ReplicaNodes,
        settings: FetchSettings,
        on_progress: Callable[[PartitionReplication], None],
        on_stale_state: Callable[[NodeId, TopicPartition], None],
        on_diverged: Callable[[NodeId, PartitionReplication], None],
    ) -> None:
        self.leader = leader
        self.follower = follower
        self._nodes = nodes
        self._settings = settings
        self._on_progress = on_progress
        self._on_stale_state = on_stale_state
        self._on_diverged = on_diverged
        self._partitions: dict[TopicPartition, PartitionReplication] = {}
        self._retry_at: dict[TopicPartition, float] = {}
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._last_failure_log = 0.0

    @property
    def partitions(self) -> Mapping[TopicPartition, PartitionReplication]:
        return self._partitions

    def set_partitions(self, partitions: Mapping[TopicPartition, PartitionReplication]) -> None:
        """Serve exactly ``partitions`` from now on (the same objects are kept as they are)."""
        if dict(partitions) == self._partitions:
            return
        self._partitions = dict(partitions)
        self._retry_at = {k: v for k, v in self._retry_at.items() if k in self._partitions}
        self._changed.set()

    def retry_now(self, key: TopicPartition) -> None:
        """Stop backing off ``key`` (its state was fixed)."""
        if self._retry_at.pop(key, None) is not None:
            self._changed.set()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name=f"replica-fetcher-{self.leader}-{self.follower}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        failures = 0
        while True:
            try:
                await self._round()
                failures = 0
            except asyncio.CancelledError:
                raise
            except LogNodeError as exc:
                failures += 1
                self._log_failure(exc.message)
                await asyncio.sleep(self._settings.backoff_ms / 1000 * 2 ** min(failures - 1, 3))
            except Exception:  # the loop must survive anything one round does
                failures += 1
                log.exception("replica fetcher %d -> %d: round failed", self.leader,
                              self.follower)
                await asyncio.sleep(self._settings.backoff_ms / 1000 * 2 ** min(failures - 1, 3))

    def _log_failure(self, message: str) -> None:
        now = time.monotonic()
        if now - self._last_failure_log >= _FAILURE_LOG_INTERVAL_S:
            self._last_failure_log = now
            log.warning("replica fetcher %d -> %d: %s", self.leader, self.follower, message)

    def _back_off(self, key: TopicPartition) -> None:
        self._retry_at[key] = time.monotonic() + self._settings.backoff_ms / 1000

    async def _wait_for_change(self, time_limit: float | None) -> None:
        changed = self._changed
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a cancellation
        # that arrives as the event is set, and the loop would never stop.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(time_limit):
                await changed.wait()

    def _ready(self) -> dict[TopicPartition, PartitionReplication]:
        now = time.monotonic()
        return {k: p for k, p in self._partitions.items() if self._retry_at.get(k, 0) <= now}

    async def _round(self) -> None:
        self._changed.clear()
        ready = self._ready()
        if not ready:
            waits = [at - time.monotonic() for k, at in self._retry_at.items()
                     if k in self._partitions]
            await self._wait_for_change(max(min(waits), 0) if waits else None)
            return
        await self._prepare(ready)
        requests = [
            FetchRequest(topic=p.topic, partition=p.partition,
                         offset=p.followers[self.follower].log_end_offset)
            for p in ready.values()
            if p.followers[self.follower].verified
            and p.followers[self.follower].log_end_offset >= 0
        ]
        if not requests:
            return
        # Long polls are abandoned when the partition set changes (a new partition must not
        # wait for the old ones' data).
        reading = asyncio.ensure_future(self._nodes.fetch(
            self.leader, requests, max_wait_ms=self._settings.wait_ms,
            max_bytes=self._settings.response_max_bytes,
            partition_max_bytes=self._settings.max_bytes))
        changed = asyncio.ensure_future(self._changed.wait())
        try:
            await asyncio.wait({reading, changed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            changed.cancel()
            if not reading.done():
                reading.cancel()
        if reading.cancelled():
            return
        results = reading.result()
        read_at = now_ms()
        appends: list[ReplicateRequest] = []
        leader_ends: dict[TopicPartition, int] = {}
        for result in results:
            key = (result.topic, result.partition)
            partition = ready.get(key)
            if partition is None or self._partitions.get(key) is not partition:
                continue  # its state changed while reading
            if result.error is not ErrorCode.none:
                self._read_failed(partition, result.error)
                continue
            partition.record_leader(result.log_end_offset, result.high_watermark)
            progress = partition.followers[self.follower]
            leader_ends[key] = result.log_end_offset
            if result.records or progress.high_watermark < partition.high_watermark:
                appends.append(ReplicateRequest(
                    topic=partition.topic, partition=partition.partition,
                    leader_epoch=partition.leader_epoch, records=result.records,
                    high_watermark=partition.high_watermark))
            else:
                partition.record_follower(self.follower, progress.log_end_offset,
                                          result.log_end_offset, read_at)
                self._on_progress(partition)
        if appends:
            await self._append(ready, appends, leader_ends)

    async def _append(
        self,
        ready: Mapping[TopicPartition, PartitionReplication],
        appends: list[ReplicateRequest],
        leader_ends: Mapping[TopicPartition, int],
    ) -> None:
        results = await self._nodes.replicate(self.follower, appends)
        appended_at = now_ms()
        sent = {(a.topic, a.partition): len(a.records) for a in appends}
        for result in results:
            key = (result.topic, result.partition)
            partition = ready.get(key)
            if partition is None or self._partitions.get(key) is not partition:
                continue
            if result.error is ErrorCode.offset_out_of_range and result.log_end_offset >= 0:
                # The follower's log end is not where we thought: continue from it.
                partition.record_follower(self.follower, result.log_end_offset,
                                          leader_ends[key], appended_at)
                continue
            if result.error is not ErrorCode.none:
                self._append_failed(partition, result.error, result.message)
                continue
            metrics.REPLICATED_BYTES.inc(sent.get(key, 0))
            partition.record_follower(self.follower, result.log_end_offset, leader_ends[key],
                                      appended_at, result.high_watermark)
            self._on_progress(partition)

    def _read_failed(self, partition: PartitionReplication, error: ErrorCode) -> None:
        self._back_off(partition.key)
        if error in _STALE_STATE:
            self._on_stale_state(self.leader, partition.key)
        elif error is ErrorCode.offset_out_of_range:
            partition.forget_follower(self.follower)  # check it against the leader again
            self._on_diverged(self.follower, partition)
        else:
            self._log_failure(f"reading {partition.topic}-{partition.partition}: {error.name}")

    def _append_failed(self, partition: PartitionReplication, error: ErrorCode,
                       message: str) -> None:
        self._back_off(partition.key)
        if error in _STALE_STATE:
            partition.forget_follower(self.follower)
            self._on_stale_state(self.follower, partition.key)
        else:
            self._log_failure(f"appending {partition.topic}-{partition.partition}: "
                              f"{error.name} {message}")

    async def _prepare(self, ready: Mapping[TopicPartition, PartitionReplication]) -> None:
        """Check the logs of followers not yet verified at this epoch against the leader's
        (Kafka's truncation by leader epoch, KIP-101/279) and cut them where they part: ask the
        leader where the follower's latest epoch ends; if the leader knows only an older
        epoch, the follower's own end of that one counts too. A follower whose log has no
        epochs has nothing to compare and is taken as it is."""
        todo = {k: p for k, p in ready.items() if not p.followers[self.follower].verified}
        if not todo:
            return
        latest: dict[TopicPartition, int] = {}
        for d in await self._nodes.describe(self.follower, list(todo)):
            key = (d.topic, d.partition)
            partition = todo.get(key)
            if partition is None:
                continue
            if (d.error is not ErrorCode.none or d.role is not Role.FOLLOWER
                    or d.leader_epoch != partition.leader_epoch):
                self._back_off(key)
                self._on_stale_state(self.follower, key)
                continue
            progress = partition.followers[self.follower]
            progress.log_end_offset = d.log_end_offset
            progress.high_watermark = d.high_watermark
            if d.latest_log_epoch < 0 or d.log_end_offset <= 0:
                progress.verified = True
            else:
                latest[key] = d.latest_log_epoch
        if not latest:
            return
        targets: dict[TopicPartition, int] = {}
        older: dict[TopicPartition, tuple[int, int]] = {}
        for answer in await self._nodes.end_offsets(
                self.leader, [(t, p, e) for (t, p), e in latest.items()]):
            key = (answer.topic, answer.partition)
            if key not in latest:
                continue
            progress = todo[key].followers[self.follower]
            if answer.error is not ErrorCode.none:
                self._read_failed(todo[key], answer.error)
            elif answer.end_offset < 0:
                # The leader knows no epoch that old: keep what was committed (Kafka's
                # fallback to the high watermark).
                targets[key] = max(progress.high_watermark, 0)
            elif answer.leader_epoch == latest[key]:
                targets[key] = answer.end_offset
            else:
                older[key] = (answer.leader_epoch, answer.end_offset)
        if older:
            for own in await self._nodes.end_offsets(
                    self.follower, [(t, p, e) for (t, p), (e, _) in older.items()]):
                key = (own.topic, own.partition)
                if key not in older:
                    continue
                leader_end = older[key][1]
                if own.error is not ErrorCode.none:
                    self._back_off(key)
                    continue
                targets[key] = leader_end if own.end_offset < 0 else min(leader_end,
                                                                         own.end_offset)
        cuts = []
        for key, target in targets.items():
            progress = todo[key].followers[self.follower]
            if target < progress.log_end_offset:
                cuts.append((key[0], key[1], target))
            else:
                progress.verified = True
        if not cuts:
            return
        for result in await self._nodes.truncate(self.follower, cuts):
            key = (result.topic, result.partition)
            partition = todo.get(key)
            if partition is None:
                continue
            if result.error is not ErrorCode.none:
                self._append_failed(partition, result.error, result.message)
                continue
            progress = partition.followers[self.follower]
            log.warning("%s-%d: follower %d cut from offset %d to %d to match leader %d at "
                        "epoch %d", result.topic, result.partition, self.follower,
                        progress.log_end_offset, result.log_end_offset, self.leader,
                        partition.leader_epoch)
            progress.log_end_offset = result.log_end_offset
            progress.high_watermark = result.high_watermark
            progress.verified = True
