"""The fetch loop of one leader log node (Kafka's ``ReplicaFetcherThread``, turned around: one
loop per leader serving all the followers of the partitions it leads, so the leader is read
once for all of them).

A round:

1. followers new to the partition's leader epoch are checked against the leader's log and cut
   where they part (:meth:`LeaderFetcher._prepare`, Kafka's truncation by leader epoch);
2. one long-poll ``Read`` on the leader, up to its log end, with an entry per partition and
   distinct follower log end offset (followers at the same offset share it: in the steady
   state, one entry per partition; a follower catching up reads on its own and never holds
   the others back). The leader answers as soon as one of them gets an append, or after
   ``wait_ms``;
3. what came is appended to each follower as it is (one ``ReplicateAppend`` per follower node,
   all nodes at once), with the high watermark the follower should have; each follower's new
   log end offset is recorded, with whether it caught up with the leader's log end as of the
   read, and the partition's progress reported (the manager then moves the high watermark).

A (partition, follower) whose step failed backs off for a while, the others go on; a follower
node that fails as a whole backs off all of its partitions. When the set of partitions or
followers changes, a read in flight is abandoned (reads have no effect) and the round starts
over. A leader that fails as a whole makes the loop back off, doubling up to ``8 * backoff``.

Per-partition errors: a replica refusing the state it should have (not a follower, another
epoch) or not knowing the partition is reported to ``on_stale_state``, which sends the replica
its state again; a follower append that does not continue its log (its log end moved) takes the
log end offset from the answer and retries; a read out of the leader's range either finds the
follower's log ending below the leader's log start (it then drops its log and starts over
there, Kafka's truncateFullyAndStartAt) or past the leader's end (it is checked against the
leader's log again, with a warning).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from kbroker.log.v1 import log_pb2
from services.common.errors import ErrorCode, error_name

from .. import metrics
from ..log_nodes import NO_OFFSET, LogNodeError, LogNodes, TopicPartition
from ..metadata import NodeId
from .partition_state import PartitionReplication
from .throttle import ReplicationThrottle

log = logging.getLogger(__name__)

_STALE_STATE = frozenset(e.value for e in (
    ErrorCode.not_leader_or_follower, ErrorCode.fenced_leader_epoch,
    ErrorCode.unknown_leader_epoch, ErrorCode.unknown_topic_or_partition))
_OUT_OF_RANGE = ErrorCode.offset_out_of_range.value
_FAILURE_LOG_INTERVAL_S = 30.0

# A (partition, follower) pair.
Pair = tuple[TopicPartition, NodeId]


def now_ms() -> int:
    return int(time.monotonic() * 1000)


@dataclass(frozen=True, slots=True, kw_only=True)
class FetchSettings:
    """Kafka's replica.fetch.* settings."""

    wait_ms: int = 500
    max_bytes: int = 1 << 20
    response_max_bytes: int = 10 << 20
    backoff_ms: int = 200


class LeaderFetcher:
    """Copies one leader node's new batches to the followers of the partitions it leads."""

    def __init__(
        self,
        *,
        leader: NodeId,
        nodes: LogNodes,
        settings: FetchSettings,
        on_progress: Callable[[PartitionReplication], None],
        on_stale_state: Callable[[NodeId, TopicPartition], None],
        throttle: ReplicationThrottle | None = None,
    ) -> None:
        self.leader = leader
        self._throttle = throttle
        self._nodes = nodes
        self._settings = settings
        self._on_progress = on_progress
        self._on_stale_state = on_stale_state
        self._partitions: dict[TopicPartition, PartitionReplication] = {}
        self._followers: frozenset[NodeId] = frozenset()
        self._retry_at: dict[Pair, float] = {}
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._last_failure_log = 0.0

    @property
    def partitions(self) -> Mapping[TopicPartition, PartitionReplication]:
        return self._partitions

    def set_partitions(self, partitions: Mapping[TopicPartition, PartitionReplication],
                       followers: Iterable[NodeId]) -> None:
        """Serve exactly ``partitions`` (the same objects are kept as they are), copying to
        their followers among ``followers`` (the live nodes)."""
        followers = frozenset(followers)
        if dict(partitions) == self._partitions and followers == self._followers:
            return
        self._partitions = dict(partitions)
        self._followers = followers
        self._retry_at = {k: v for k, v in self._retry_at.items() if k[0] in self._partitions}
        self._changed.set()

    def retry_now(self, key: TopicPartition) -> None:
        """Stop backing off ``key`` for every follower (its state was fixed)."""
        stopped = [pair for pair in self._retry_at if pair[0] == key]
        for pair in stopped:
            del self._retry_at[pair]
        if stopped:
            self._changed.set()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name=f"replica-fetcher-{self.leader}")

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
                continue
            except LogNodeError as exc:
                self._log_failure(exc.message)
            except Exception:  # the loop must survive anything one round does
                log.exception("replica fetcher of leader %d: round failed", self.leader)
            failures += 1
            await asyncio.sleep(self._settings.backoff_ms / 1000 * 2 ** min(failures - 1, 3))

    def _log_failure(self, message: str) -> None:
        now = time.monotonic()
        if now - self._last_failure_log >= _FAILURE_LOG_INTERVAL_S:
            self._last_failure_log = now
            log.warning("replica fetcher of leader %d: %s", self.leader, message)

    def _back_off(self, pair: Pair) -> None:
        self._retry_at[pair] = time.monotonic() + self._settings.backoff_ms / 1000

    async def _wait_for_change(self, time_limit: float | None) -> None:
        changed = self._changed
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a cancellation
        # that arrives as the event is set, and the loop would never stop.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(time_limit):
                await changed.wait()

    def _ready(self) -> list[Pair]:
        now = time.monotonic()
        ready = [(key, follower) for key, p in self._partitions.items()
                 for follower in p.followers
                 if follower in self._followers and self._retry_at.get((key, follower), 0) <= now]
        if self._throttle is None:
            return ready
        allowed = []
        for key, follower in ready:
            delay = self._throttle.delay(key, self.leader, follower)
            if delay > 0:  # over its replication quota: left out until the bucket refills
                self._retry_at[(key, follower)] = now + delay
            else:
                allowed.append((key, follower))
        return allowed

    async def _round(self) -> None:
        self._changed.clear()
        partitions = self._partitions
        ready = self._ready()
        if not ready:
            waits = [at - time.monotonic() for pair, at in self._retry_at.items()
                     if pair[0] in partitions]
            await self._wait_for_change(max(min(waits), 0) if waits else None)
            return
        by_follower: dict[NodeId, list[TopicPartition]] = {}
        for key, follower in ready:
            by_follower.setdefault(follower, []).append(key)
        await asyncio.gather(*(self._prepare_follower(follower, keys, partitions)
                               for follower, keys in by_follower.items()))
        # One read entry per partition and distinct follower offset.
        entries: dict[tuple[TopicPartition, int], list[NodeId]] = {}
        for key, follower in ready:
            progress = partitions[key].followers[follower]
            if progress.verified and progress.log_end_offset >= 0 and \
                    self._retry_at.get((key, follower), 0) <= time.monotonic():
                entries.setdefault((key, progress.log_end_offset), []).append(follower)
        if not entries:
            return
        order = list(entries)
        reads = [log_pb2.PartitionRead(topic=key[0], partition=key[1], offset=offset,
                                       max_bytes=self._settings.max_bytes)
                 for key, offset in order]
        # A long poll is abandoned when the partitions change (a new partition or follower
        # must not wait for the others' data).
        reading = asyncio.ensure_future(self._nodes.fetch(
            self.leader, reads, max_wait_ms=self._settings.wait_ms,
            max_bytes=self._settings.response_max_bytes))
        changed = asyncio.ensure_future(self._changed.wait())
        try:
            await asyncio.wait({reading, changed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            changed.cancel()
            if not reading.done():
                reading.cancel()
        if not reading.done() or reading.cancelled():
            # Abandoned (cancel() only asks: the task is not cancelled yet, and has no result).
            return
        results = reading.result()
        read_at = now_ms()
        appends: dict[NodeId, list[log_pb2.PartitionReplicate]] = {}
        leader_ends: dict[TopicPartition, int] = {}
        for (key, _offset), result in zip(order, results, strict=False):
            partition = partitions[key]
            if self._partitions.get(key) is not partition:
                continue  # its state changed while reading
            followers = entries[(key, _offset)]
            if result.error_code:
                for follower in followers:
                    progress = partition.followers[follower]
                    if (result.error_code == _OUT_OF_RANGE
                            and 0 <= progress.log_end_offset < result.log_start_offset):
                        # Behind what the leader still has: copying cannot catch it up.
                        progress.start_over_at = result.log_start_offset
                        continue
                    self._read_failed(partition, follower, result.error_code)
                continue
            partition.record_leader(result.log_end_offset, result.high_watermark)
            leader_ends[key] = result.log_end_offset
            for follower in followers:
                progress = partition.followers[follower]
                if result.records or progress.high_watermark < partition.high_watermark:
                    appends.setdefault(follower, []).append(log_pb2.PartitionReplicate(
                        topic=partition.topic, partition=partition.partition,
                        leader_epoch=partition.leader_epoch, records=result.records,
                        high_watermark=partition.high_watermark,
                        log_start_offset=result.log_start_offset))
                else:
                    partition.record_follower(follower, progress.log_end_offset,
                                              result.log_end_offset, read_at)
                    self._on_progress(partition)
        if appends:
            await asyncio.gather(*(self._append(follower, requests, partitions, leader_ends)
                                   for follower, requests in appends.items()))

    async def _append(
        self,
        follower: NodeId,
        appends: list[log_pb2.PartitionReplicate],
        partitions: Mapping[TopicPartition, PartitionReplication],
        leader_ends: Mapping[TopicPartition, int],
    ) -> None:
        try:
            results = await self._nodes.replicate(follower, appends)
        except LogNodeError as exc:
            self._log_failure(exc.message)
            for a in appends:
                self._back_off(((a.topic, a.partition), follower))
            return
        appended_at = now_ms()
        sent = {(a.topic, a.partition): len(a.records) for a in appends}
        for result in results:
            key = (result.topic, result.partition)
            partition = partitions.get(key)
            if partition is None or self._partitions.get(key) is not partition:
                continue
            if result.error_code == _OUT_OF_RANGE and result.log_end_offset >= 0:
                # The follower's log end is not where we thought: continue from it.
                partition.record_follower(follower, result.log_end_offset, leader_ends[key],
                                          appended_at)
                continue
            if result.error_code:
                self._append_failed(partition, follower, result.error_code, result.error_message)
                continue
            metrics.REPLICATED_BYTES.inc(sent.get(key, 0))
            if self._throttle is not None:
                self._throttle.record(key, self.leader, follower, sent.get(key, 0))
            partition.record_follower(follower, result.log_end_offset, leader_ends[key],
                                      appended_at, result.high_watermark)
            self._on_progress(partition)

    def _read_failed(self, partition: PartitionReplication, follower: NodeId,
                     error: int) -> None:
        self._back_off((partition.key, follower))
        if error in _STALE_STATE:
            self._on_stale_state(self.leader, partition.key)
        elif error == _OUT_OF_RANGE:
            partition.forget_follower(follower)  # check it against the leader again
            log.warning("%s-%d: follower %d is outside the leader's log (leader %d, epoch %d); "
                        "it must be truncated", partition.topic, partition.partition, follower,
                        self.leader, partition.leader_epoch)
        else:
            self._log_failure(
                f"reading {partition.topic}-{partition.partition}: {error_name(error)}")

    def _append_failed(self, partition: PartitionReplication, follower: NodeId,
                       error: int, message: str) -> None:
        self._back_off((partition.key, follower))
        if error in _STALE_STATE:
            partition.forget_follower(follower)
            self._on_stale_state(follower, partition.key)
        else:
            self._log_failure(f"appending {partition.topic}-{partition.partition} to "
                              f"{follower}: {error_name(error)} {message}")

    async def _prepare_follower(
        self, follower: NodeId, keys: list[TopicPartition],
        partitions: Mapping[TopicPartition, PartitionReplication],
    ) -> None:
        try:
            await self._prepare(follower, keys, partitions)
        except LogNodeError as exc:
            self._log_failure(exc.message)
            for key in keys:
                if not partitions[key].followers[follower].verified:
                    self._back_off((key, follower))

    async def _truncate(
        self, follower: NodeId, cuts: list[tuple[str, int, int]],
        partitions: Mapping[TopicPartition, PartitionReplication], *, start_over: bool = False,
    ) -> None:
        """Cut ``follower``'s replicas back to an offset each (with ``start_over``: drop their
        logs and continue empty there); a replica cut is verified."""
        for result in await self._nodes.truncate(follower, cuts, start_over=start_over):
            partition = partitions.get((result.topic, result.partition))
            if partition is None:
                continue
            progress = partition.followers[follower]
            if start_over:
                progress.start_over_at = NO_OFFSET
            if result.error_code:
                self._append_failed(partition, follower, result.error_code, result.error_message)
                continue
            if start_over:
                log.warning("%s-%d: follower %d was behind the leader's log start; it starts "
                            "over at %d", result.topic, result.partition, follower,
                            result.log_end_offset)
            else:
                log.warning("%s-%d: follower %d cut from offset %d to %d to match leader %d at "
                            "epoch %d", result.topic, result.partition, follower,
                            progress.log_end_offset, result.log_end_offset, self.leader,
                            partition.leader_epoch)
            progress.log_end_offset = result.log_end_offset
            progress.high_watermark = result.high_watermark
            progress.verified = True

    async def _prepare(
        self, follower: NodeId, keys: list[TopicPartition],
        partitions: Mapping[TopicPartition, PartitionReplication],
    ) -> None:
        """Check the logs of ``follower``'s replicas not yet verified at this epoch against
        the leader's (Kafka's truncation by leader epoch, KIP-101/279) and cut them where they
        part: ask the leader where the follower's latest epoch ends; if the leader knows only
        an older epoch, the follower's own end of that one counts too. A follower whose log
        has no epochs has nothing to compare and is taken as it is."""
        # Followers whose log ends below the leader's log start drop it and continue empty
        # at the leader's log start (Kafka's truncateFullyAndStartAt).
        restarts = [(k[0], k[1], partitions[k].followers[follower].start_over_at) for k in keys
                    if partitions[k].followers[follower].start_over_at >= 0]
        if restarts:
            await self._truncate(follower, restarts, partitions, start_over=True)
        todo = {k: partitions[k] for k in keys if not partitions[k].followers[follower].verified}
        if not todo:
            return
        latest: dict[TopicPartition, int] = {}
        for d in await self._nodes.describe(follower, list(todo)):
            key = (d.topic, d.partition)
            partition = todo.get(key)
            if partition is None:
                continue
            if (d.error_code or d.role != log_pb2.REPLICA_ROLE_FOLLOWER
                    or d.leader_epoch != partition.leader_epoch):
                self._back_off((key, follower))
                self._on_stale_state(follower, key)
                continue
            progress = partition.followers[follower]
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
            progress = todo[key].followers[follower]
            if answer.error_code:
                self._read_failed(todo[key], follower, answer.error_code)
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
                    follower, [(t, p, e) for (t, p), (e, _) in older.items()]):
                key = (own.topic, own.partition)
                if key not in older:
                    continue
                leader_end = older[key][1]
                if own.error_code:
                    self._back_off((key, follower))
                    continue
                targets[key] = leader_end if own.end_offset < 0 else min(leader_end,
                                                                         own.end_offset)
        cuts = []
        for key, target in targets.items():
            progress = todo[key].followers[follower]
            if target < progress.log_end_offset:
                cuts.append((key[0], key[1], target))
            else:
                progress.verified = True
        if cuts:
            await self._truncate(follower, cuts, todo)
