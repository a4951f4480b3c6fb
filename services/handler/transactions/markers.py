"""Writing transaction markers (Kafka's ``TransactionMarkerChannelManager`` and its request
completion handler, and the broker side of WriteTxnMarkers as ``KafkaApis`` serves it): a COMMIT
or ABORT control batch on every partition of a transaction, written by each partition's leader
log node (``LogService.WriteTxnMarkers``) and acknowledged, as an acks=all produce is, once the
partition's high watermark covers it.

    TxnMarker => producer_id producer_epoch committed coordinator_epoch [partitions]
    answer per partition => error_code base_offset (the marker's offset) log_end_offset
                            high_watermark leader_epoch

:func:`write_markers` makes one attempt (the WriteTxnMarkers API answers with it); the
transaction coordinator's :class:`MarkerWriter` retries until every partition has its marker,
as Kafka's coordinator does:

- NONE once replicated; a partition no longer in the metadata (deleted) needs none, nor does
  one whose leader knows a newer epoch of the producer (INVALID_PRODUCER_EPOCH: the partition
  has moved past this transaction) or cannot hold markers (UNSUPPORTED_FOR_MESSAGE_FORMAT);
- a leader that moved or is down (NOT_LEADER_OR_FOLLOWER), a write not replicated in time
  (REQUEST_TIMED_OUT), too few in-sync replicas or a storage error: written again, to the
  leader the metadata names then, after a backoff;
- TRANSACTION_COORDINATOR_FENCED: a newer coordinator epoch wrote markers for this producer
  there; the next attempt asks for the coordinator epoch again (a handler whose metadata is
  behind catches up).

The markers of different leaders are written concurrently, one call per leader.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from kbroker.log.v1 import log_pb2
from kbroker.purgatory.v1 import purgatory_pb2
from services.common.errors import ErrorCode, KafkaError

from ..collaborators import CallError, LogNodes, Purgatory, UnreachableError
from ..metadata_cache import (
    Backoff,
    ClusterMetadata,
    LogNode,
    MetadataCache,
    MetadataUnavailableError,
)
from ..metrics import add_remote_time, parked
from ..routing import leader_error, locate, replication_key

log = logging.getLogger(__name__)

NONE = 0
UNKNOWN_TOPIC_OR_PARTITION = ErrorCode.unknown_topic_or_partition.value
NOT_LEADER_OR_FOLLOWER = ErrorCode.not_leader_or_follower.value
REQUEST_TIMED_OUT = ErrorCode.request_timed_out.value
UNKNOWN_SERVER_ERROR = ErrorCode.unknown_server_error.value
INVALID_PRODUCER_EPOCH = ErrorCode.invalid_producer_epoch.value
TRANSACTION_COORDINATOR_FENCED = ErrorCode.transaction_coordinator_fenced.value
# Partitions that need no marker (any more): written, deleted, or past this transaction.
DONE = frozenset({NONE, UNKNOWN_TOPIC_OR_PARTITION, INVALID_PRODUCER_EPOCH,
                  ErrorCode.unsupported_for_message_format.value,
                  ErrorCode.unsupported_version.value})
# A marker write is a local append on the leader.
WRITE_TIME_LIMIT_S = 10.0

TopicPartition = tuple[str, int]


@dataclass(frozen=True, slots=True, kw_only=True)
class Marker:
    """The end of a producer's transaction, for its partitions."""

    producer_id: int
    producer_epoch: int
    committed: bool
    coordinator_epoch: int
    partitions: frozenset[TopicPartition]


@dataclass(slots=True)
class _Written:
    marker: int
    tp: TopicPartition
    error: int = NONE
    result: log_pb2.PartitionAppendResult | None = None


async def _metadata(cache: MetadataCache, markers: Sequence[Marker]) -> ClusterMetadata | None:
    """The metadata to route by, looked up afresh when it lacks a partition of the markers (a
    handler that is behind must not take a new partition for a deleted one)."""
    try:
        metadata = await cache.current()
        known = all(_exists(metadata, tp) for m in markers for tp in m.partitions)
        return metadata if known else await cache.refresh()
    except MetadataUnavailableError:
        return None


def _exists(metadata: ClusterMetadata, tp: TopicPartition) -> bool:
    topic = metadata.topic(tp[0])
    return topic is not None and tp[1] in topic.partitions


async def write_markers(cache: MetadataCache, log_nodes: LogNodes, purgatory: Purgatory,
                        markers: Sequence[Marker], timeout_ms: int, leader_wait_ms: int = 0
                        ) -> list[dict[TopicPartition, int]]:
    """Write every marker on its partitions' leaders once and wait, up to ``timeout_ms``, until
    the high watermarks cover them: the leaders hold their answers up to ``leader_wait_ms``
    (never past the timeout) for that, as for an acks=all produce, and what is not covered by
    then waits in the purgatory. Per marker, the error of each of its partitions (see the
    module docstring)."""
    commit_wait_ms = min(leader_wait_ms, timeout_ms)
    items = [_Written(i, tp) for i, m in enumerate(markers) for tp in sorted(m.partitions)]
    metadata = await _metadata(cache, markers)
    by_node: dict[int, tuple[LogNode, list[_Written]]] = {}
    for item in items:
        if metadata is None:
            item.error = NOT_LEADER_OR_FOLLOWER
            continue
        try:
            route = locate(metadata, metadata.topic(item.tp[0]), item.tp[1])
        except KafkaError as exc:
            item.error = exc.errno
            continue
        by_node.setdefault(route.leader.node_id, (route.leader, []))[1].append(item)

    waits_us = [0]  # what each leader held its answer for commits, in microseconds

    async def on(node: LogNode, written: list[_Written]) -> None:
        request = log_pb2.WriteTxnMarkersRequest(commit_wait_ms=commit_wait_ms)
        positions: dict[int, int] = {}
        for item in written:
            if item.marker not in positions:
                marker = markers[item.marker]
                positions[item.marker] = len(request.markers)
                request.markers.add(producer_id=marker.producer_id,
                                    producer_epoch=marker.producer_epoch,
                                    committed=marker.committed,
                                    coordinator_epoch=marker.coordinator_epoch)
            request.markers[positions[item.marker]].partitions.add(topic=item.tp[0],
                                                                  partition=item.tp[1])
        try:
            response = await log_nodes.write_txn_markers(node, request, WRITE_TIME_LIMIT_S)
        except CallError as exc:
            log.info("writing transaction markers on log node %d failed: %s", node.node_id, exc)
            error = NOT_LEADER_OR_FOLLOWER if isinstance(exc, UnreachableError) else (
                REQUEST_TIMED_OUT)
            for item in written:
                item.error = error
            return
        waits_us.append(response.commit_wait_us)
        results: dict[tuple[int, TopicPartition], log_pb2.PartitionAppendResult] = {}
        for position, answer in enumerate(response.markers):
            for result in answer.partitions:
                results[(position, (result.topic, result.partition))] = result
        for item in written:
            result = results.get((positions[item.marker], item.tp))
            item.result = result
            item.error = UNKNOWN_SERVER_ERROR if result is None else leader_error(
                result.error_code)

    started = time.monotonic()
    await asyncio.gather(*(on(node, written) for node, written in by_node.values()))
    # The longest a leader held its answer for commits: remote time, as a produce counts it.
    add_remote_time(max(waits_us) / 1e6)
    await _await_replicated(purgatory, [i for i in items if i.result is not None and not i.error],
                            timeout_ms - int((time.monotonic() - started) * 1000))
    errors: list[dict[TopicPartition, int]] = [{} for _ in markers]
    for item in items:
        errors[item.marker][item.tp] = item.error
    return errors


async def _await_replicated(purgatory: Purgatory, written: list[_Written],
                            timeout_ms: int) -> None:
    """Hold the markers' answers until each partition's high watermark passes its marker
    (Kafka's acks=all append); what is still short at the timeout is REQUEST_TIMED_OUT, a
    partition whose leader changed meanwhile NOT_LEADER_OR_FOLLOWER."""
    pending: dict[str, list[_Written]] = {}
    thresholds: dict[str, int] = {}
    for item in written:
        result = item.result
        assert result is not None
        if result.high_watermark < result.log_end_offset:
            key = replication_key(item.tp[0], item.tp[1], result.leader_epoch, result.topic_id)
            pending.setdefault(key, []).append(item)
            thresholds[key] = max(thresholds.get(key, 0), result.log_end_offset)
    if not pending:
        return
    try:
        with parked():
            outcome = await purgatory.wait(purgatory_pb2.OPERATION_KIND_PRODUCE, thresholds,
                                           require_all=True, timeout_ms=max(timeout_ms, 1))
        states = {state.key: state for state in outcome.keys}
    except CallError as exc:
        log.warning("awaiting the replication of transaction markers failed: %s", exc)
        states = {}
    for key, items in pending.items():
        state = states.get(key)
        error = (state.error_code if state is not None and state.error_code else
                 REQUEST_TIMED_OUT if state is None or state.position < thresholds[key] else NONE)
        for item in items:
            item.error = error


class MarkerWriter:
    """Writes a transaction's markers until every partition has one (the coordinator's side),
    or the time limit passes (the caller's timers start another writer later)."""

    def __init__(self, cache: MetadataCache, log_nodes: LogNodes, purgatory: Purgatory, *,
                 replication_timeout_ms: int = 5_000, time_limit_s: float = 60.0,
                 leader_wait_ms: int = 0) -> None:
        self._cache = cache
        self._log_nodes = log_nodes
        self._purgatory = purgatory
        self.replication_timeout_ms = replication_timeout_ms
        self.leader_wait_ms = leader_wait_ms
        self.time_limit_s = time_limit_s

    async def write(self, producer_id: int, producer_epoch: int, committed: bool,
                    partitions: frozenset[TopicPartition],
                    still_due: Callable[[], Awaitable[int | None]]) -> bool:
        """Write the markers; True once every partition has its marker. Before each attempt
        ``still_due()`` gives the coordinator epoch to write with, or None to stop (the
        transaction moved on: another handler took it over or completed it)."""
        pending = set(partitions)
        backoff = Backoff(initial=0.05, maximum=2.0)
        deadline = time.monotonic() + self.time_limit_s
        while pending:
            coordinator_epoch = await still_due()
            if coordinator_epoch is None:
                return False
            marker = Marker(producer_id=producer_id, producer_epoch=producer_epoch,
                            committed=committed, coordinator_epoch=coordinator_epoch,
                            partitions=frozenset(pending))
            [errors] = await write_markers(self._cache, self._log_nodes, self._purgatory,
                                           [marker], self.replication_timeout_ms,
                                           self.leader_wait_ms)
            for tp, error in errors.items():
                if error in DONE:
                    pending.discard(tp)
                    if error:
                        log.info("no %s marker of producer %d needed on %s-%d: error %d",
                                 "COMMIT" if committed else "ABORT", producer_id, *tp, error)
                else:
                    log.info("the %s marker of producer %d on %s-%d failed with error %d; "
                             "retrying", "COMMIT" if committed else "ABORT", producer_id, *tp,
                             error)
            if not pending:
                return True
            if time.monotonic() >= deadline:
                log.warning("markers of producer %d not all written within %.0f s: %s",
                            producer_id, self.time_limit_s, sorted(pending))
                return False
            await asyncio.sleep(backoff.next_delay())
        return True
