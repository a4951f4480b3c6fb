"""In-memory stand-ins for the handler's collaborators, for unit tests of the API modules."""

from __future__ import annotations

import asyncio
import struct
from collections import defaultdict
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field

from kbroker.log.v1 import log_pb2
from kbroker.purgatory.v1 import purgatory_pb2
from kbroker.replicator.v1 import replicator_pb2
from services.common import payloads
from services.common.errors import ErrorCode, NotEnoughReplicasError
from services.common.file_records import SPOOL_FILE, FileRecordsReader, is_local
from services.common.payloads import PayloadPath
from services.common.records.control_records import (
    ControlRecordType,
    EndTransactionMarker,
    build_end_transaction_batch,
)
from services.handler.collaborators import CallError
from services.handler.metadata_cache import (
    ClusterMetadata,
    LogNode,
    MetadataCache,
    PartitionInfo,
    TopicInfo,
)
from services.handler.request_context import RequestContext

from .batches import batch_offsets, record_batch

APPEND_RECORDS = PayloadPath(log_pb2.AppendRequest.DESCRIPTOR, "partitions.records")


def whole_append(request: log_pb2.AppendRequest,
                 records: Sequence[bytes | memoryview | None] | None) -> log_pb2.AppendRequest:
    """An append as one message, its batches in it, however they came (``records``: beside
    it, as the produce API sends them)."""
    if records is None:
        return request
    whole = log_pb2.AppendRequest()
    whole.CopyFrom(request)
    return payloads.fill(whole, APPEND_RECORDS, records)

CONTEXT = RequestContext(advertised_host="kafka.example", advertised_port=9092)


def topic(
    name: str,
    partitions: int = 1,
    *,
    leaders: Sequence[int] | None = None,
    topic_id: str | None = None,
    epoch: int = 0,
) -> TopicInfo:
    leaders = leaders or [0] * partitions
    return TopicInfo(
        name=name,
        topic_id=topic_id,
        partitions={
            p: PartitionInfo(partition=p, leader=leaders[p], leader_epoch=epoch,
                             replicas=(leaders[p],), isr=(leaders[p],))
            for p in range(partitions)
        },
    )


def cluster(
    *topics: TopicInfo,
    nodes: Sequence[int] = (0,),
    dead: Sequence[int] = (),
    version: int = 1,
    controller: int = 0,
    fenced: Sequence[int] = (),
) -> ClusterMetadata:
    """``dead``: nodes not answering (not yet fenced); ``fenced``: down and fenced."""
    return ClusterMetadata(
        version=version,
        cluster_id="test-cluster",
        controller_id=controller,
        log_nodes=[LogNode(node_id=n, address=f"node-{n}:1", alive=n not in (*dead, *fenced),
                           fenced=n in fenced)
                   for n in (*nodes, *dead, *fenced)],
        topics=topics,
    )


def cache_of(metadata: ClusterMetadata) -> MetadataCache:
    cache = MetadataCache(_constant(metadata))
    cache.install(metadata)
    return cache


def _constant(metadata: ClusterMetadata):  # type: ignore[no-untyped-def]
    async def load() -> ClusterMetadata:
        return metadata
    return load


@dataclass
class FakePartition:
    batches: list[bytes] = field(default_factory=list)
    log_end: int = 0
    high_watermark: int = 0


class FakeLogNodes:
    """Log nodes holding batches in memory; the high watermark follows the log end unless
    ``lagging_high_watermark`` is set. ``failures[node_id]`` makes calls to a node raise.
    ``guards[(topic, partition)]``: the partition wants the transaction of the next
    transactional batch verified (KIP-890): it refuses it (INVALID_TXN_STATE, the guard in the
    answer) unless it comes with that guard, as a leader log node does. ``isr[(topic,
    partition)]``: the ISR its leader has (3 replicas when unset), which an append's
    min_insync_replicas is checked against (NOT_ENOUGH_REPLICAS, nothing stored), at
    ``partition_epoch`` (the metadata version the appends answer with). ``commits_with``: the
    ISR with which a lagging high watermark passes an acks=all append while its leader holds
    the answer (AppendRequest.commit_wait_ms; None: not within the wait). Batches named in a
    frontend's spool file are read from it, as a leader on the handler's host does, unless
    ``spool_elsewhere`` (a leader on another host): then nothing is stored and the answer says
    records_unreadable."""

    def __init__(self) -> None:
        self.commits_with: tuple[int, ...] | None = None
        self.append_requests: list[log_pb2.AppendRequest] = []
        self.partitions: dict[tuple[str, int], FakePartition] = {}
        self.calls: list[tuple[str, int, list]] = []
        self.failures: dict[int, Exception] = {}
        self.lagging_high_watermark = False
        self.appended = asyncio.Event()
        self.guards: dict[tuple[str, int], int] = {}
        self.isr: dict[tuple[str, int], tuple[int, ...]] = {}
        self.partition_epoch = 0
        self.spool_elsewhere = False

    def partition(self, topic: str, partition: int) -> FakePartition:
        return self.partitions.setdefault((topic, partition), FakePartition())

    def _check(self, node: LogNode) -> None:
        failure = self.failures.get(node.node_id)
        if failure is not None:
            raise failure

    def put(self, topic: str, partition: int, values: list[bytes]) -> None:
        """Append a batch directly, as if produced."""
        p = self.partition(topic, partition)
        p.batches.append(record_batch(values, base_offset=p.log_end))
        p.log_end += len(values)
        p.high_watermark = p.log_end

    async def append(self, node: LogNode, request: log_pb2.AppendRequest, time_limit: float,
                     records: Sequence[bytes | memoryview | None] | None = None,
                     ) -> log_pb2.AppendResponse:
        request = whole_append(request, records)
        self.append_requests.append(request)
        self.calls.append(("append", node.node_id, list(request.partitions)))
        self._check(node)
        out = log_pb2.AppendResponse()
        if request.local_reader and not self._read_spooled(request):
            out.records_unreadable = True
            return out
        for a in request.partitions:
            guard = self.guards.get((a.topic, a.partition))
            if guard is not None and a.verification_guard != guard:
                out.results.add(topic=a.topic, partition=a.partition,
                                error_code=ErrorCode.invalid_txn_state.value,
                                verification_guard=guard)
                continue
            isr = self.isr.get((a.topic, a.partition), (0, 1, 2))
            if a.min_insync_replicas > len(isr):
                refused = NotEnoughReplicasError(isr, a.min_insync_replicas, a.topic,
                                                 a.partition)
                out.results.add(topic=a.topic, partition=a.partition, error_code=refused.errno,
                                error_message=refused.message)
                continue
            self.guards.pop((a.topic, a.partition), None)
            p = self.partition(a.topic, a.partition)
            count = sum(n for _, n in batch_offsets(a.records))
            base = p.log_end
            p.batches.append(a.records)
            p.log_end += count
            commit_isr = self.commits_with if (
                request.commit_wait_ms > 0 and a.min_insync_replicas > 0) else None
            if not self.lagging_high_watermark or commit_isr is not None:
                p.high_watermark = p.log_end
            result = out.results.add(topic=a.topic, partition=a.partition, base_offset=base,
                                     log_start_offset=0, log_end_offset=p.log_end,
                                     high_watermark=p.high_watermark, leader_epoch=-1,
                                     partition_epoch=self.partition_epoch)
            if commit_isr is not None:
                result.commit_isr.extend(commit_isr)
                out.commit_wait_us = 1500
        self.appended.set()
        return out

    def _read_spooled(self, request: log_pb2.AppendRequest) -> bool:
        """Whether every partition's batches named in a spool file were read into it."""
        if self.spool_elsewhere or not is_local(request.local_reader):
            return False
        reader = FileRecordsReader(names=SPOOL_FILE)
        try:
            for a in request.partitions:
                if a.HasField("file_records"):
                    f = a.file_records
                    data = reader.read(f.path, f.inode, f.position, f.size)
                    if data is None:
                        return False
                    a.records = data
        finally:
            reader.close()
        return True

    async def read(self, node: LogNode, request: log_pb2.ReadRequest,
                   time_limit: float) -> log_pb2.ReadResponse:
        self.calls.append(("read", node.node_id, list(request.partitions)))
        self._check(node)
        out = log_pb2.ReadResponse()
        for r in request.partitions:
            p = self.partition(r.topic, r.partition)
            if r.offset > p.log_end or r.offset < 0:
                out.results.add(topic=r.topic, partition=r.partition, error_code=1)
                continue
            data = b""
            for batch in p.batches:
                (base, count), = batch_offsets(batch)
                if base + count <= r.offset or base >= p.high_watermark:
                    continue
                if data and len(data) + len(batch) > r.max_bytes:
                    break
                data += batch
            out.results.add(topic=r.topic, partition=r.partition, records=data,
                            high_watermark=p.high_watermark, log_start_offset=0,
                            log_end_offset=p.log_end, last_stable_offset=p.high_watermark)
        return out

    async def list_offsets(self, node: LogNode, request: log_pb2.ListOffsetsRequest,
                           time_limit: float) -> log_pb2.ListOffsetsResponse:
        self.calls.append(("list_offsets", node.node_id, list(request.partitions)))
        self._check(node)
        out = log_pb2.ListOffsetsResponse()
        for q in request.partitions:
            p = self.partition(q.topic, q.partition)
            end = p.high_watermark if request.limit == log_pb2.READ_LIMIT_HIGH_WATERMARK \
                else p.log_end
            offset = {-1: end, -2: 0}.get(q.timestamp, 0)
            out.results.add(topic=q.topic, partition=q.partition, offset=offset,
                            timestamp=-1, leader_epoch=-1)
        return out


def wait_result(completed: bool, positions: Mapping[str, int] | None = None,
                errors: Mapping[str, int] | None = None,
                isr: Sequence[int] = ()) -> purgatory_pb2.AwaitResponse:
    """The purgatory's answer to an Await: its outcome and each key's position and error (and
    the leader's ISR it was satisfied with, the same for every key)."""
    errors = errors or {}
    return purgatory_pb2.AwaitResponse(
        outcome=purgatory_pb2.OUTCOME_COMPLETED if completed else purgatory_pb2.OUTCOME_EXPIRED,
        keys=[purgatory_pb2.KeyState(key=key, position=position, error_code=errors.get(key, 0),
                                     isr=isr)
              for key, position in (positions or {}).items()])


class FakePurgatory:
    """Records waits; answers with ``answer`` (an AwaitResponse, an exception to raise, or
    None to sleep out the timeout and expire). ``wake`` completes a pending wait early."""

    def __init__(self, answer: purgatory_pb2.AwaitResponse | Exception | None = None) -> None:
        self.answer = answer
        self.waits: list[tuple[int, dict[str, int], bool, int]] = []
        self.wake = asyncio.Event()
        self.parked = asyncio.Event()

    async def wait(self, kind: int, thresholds: Mapping[str, int], require_all: bool,
                   timeout_ms: int) -> purgatory_pb2.AwaitResponse:
        self.waits.append((kind, dict(thresholds), require_all, timeout_ms))
        self.parked.set()
        if isinstance(self.answer, Exception):
            raise self.answer
        if self.answer is not None:
            return self.answer
        try:
            await asyncio.wait_for(self.wake.wait(), timeout_ms / 1000)
        except TimeoutError:
            return wait_result(False)
        self.wake.clear()
        return wait_result(True, thresholds)


class FakeController:
    """A controller keeping topics in a ClusterMetadata it hands out on load."""

    def __init__(self, metadata: ClusterMetadata, *, failure: CallError | None = None) -> None:
        self.metadata = metadata
        self.failure = failure
        self.created: list[tuple[list[replicator_pb2.NewTopic], bool]] = []
        self.deleted: list[tuple[list[str], list[str]]] = []
        self.loads = 0

    async def load_metadata(self) -> ClusterMetadata:
        self.loads += 1
        return self.metadata

    async def create_topics(self, request: replicator_pb2.CreateTopicsRequest,
                            time_limit: float) -> replicator_pb2.CreateTopicsResponse:
        self.created.append((list(request.topics), request.validate_only))
        if self.failure is not None:
            raise self.failure
        out = replicator_pb2.CreateTopicsResponse()
        known = dict(self.metadata.topics)
        for t in request.topics:
            if t.name in known:
                out.topics.add(name=t.name, error_code=36,
                               error_message=f"Topic '{t.name}' already exists.")
                continue
            count = 1 if t.num_partitions == -1 else t.num_partitions
            if count <= 0:
                out.topics.add(name=t.name, error_code=37)
                continue
            topic_id = f"00000000-0000-0000-0000-{len(known) + 1:012d}"
            configs = {"cleanup.policy": "delete", "retention.ms": "604800000", **t.configs}
            out.topics.add(name=t.name, topic_id=topic_id, num_partitions=count,
                           replication_factor=1, configs=configs)
            if not request.validate_only:
                known[t.name] = topic_ids(topic(t.name, count), topic_id)
        self._publish(known)
        return out

    async def delete_topics(self, request: replicator_pb2.DeleteTopicsRequest,
                            time_limit: float) -> replicator_pb2.DeleteTopicsResponse:
        self.deleted.append((list(request.names), list(request.topic_ids)))
        if self.failure is not None:
            raise self.failure
        known = dict(self.metadata.topics)
        out = replicator_pb2.DeleteTopicsResponse()
        for name in request.names:
            gone = known.pop(name, None)
            out.topics.add(name=name, topic_id=gone.topic_id if gone else None,
                           error_code=0 if gone else 3)
        for topic_id in request.topic_ids:
            match = next((t for t in known.values() if t.topic_id == topic_id), None)
            if match is not None:
                known.pop(match.name)
            out.topics.add(name=match.name if match else "", topic_id=topic_id,
                           error_code=0 if match else 100)
        self._publish(known)
        return out

    def _publish(self, topics: Mapping[str, TopicInfo]) -> None:
        self.metadata = ClusterMetadata(
            version=self.metadata.version + 1, cluster_id=self.metadata.cluster_id,
            controller_id=self.metadata.controller_id,
            log_nodes=self.metadata.log_nodes.values(), topics=topics.values(),
            acls=self.metadata.acls)


def topic_ids(info: TopicInfo, topic_id: str) -> TopicInfo:
    return TopicInfo(name=info.name, topic_id=topic_id, internal=info.internal,
                     configs=info.configs, partitions=info.partitions)


class MemoryLog:
    """Partitions in memory with the log node's conditional append, reads to the log end, and
    transaction markers written as the leader writes them (control batches appended at the log
    end); every call yields to the event loop first, so concurrent callers interleave as over
    the network. ``lagging``: appends are not replicated at once (the high watermark stays
    behind), on every partition or on those in ``lagging_partitions``.
    ``marker_errors[(topic, partition)]``: the error markers there get (and nothing is
    written); ``marker_calls_fail``: every WriteTxnMarkers call raises it;
    ``markers_commit_in_wait``: a lagging partition's marker is committed while its leader
    holds the answer (WriteTxnMarkersRequest.commit_wait_ms, whose values are kept in
    ``marker_waits``), the answer reporting a hold of 1.5 ms. ``isr[(topic, partition)]``: the
    leader's ISR an append's min_insync_replicas is checked against (the leader alone when not
    given). ``appends_commit_with``: the ISR with which a lagging append is committed while its
    leader holds the answer (AppendRequest.commit_wait_ms, whose values are kept in
    ``append_waits``; None: not within the hold)."""

    def __init__(self) -> None:
        self.isr: dict[tuple[str, int], tuple[int, ...]] = {}
        self.batches: dict[tuple[str, int], list[tuple[int, int, bytes]]] = defaultdict(list)
        self.ends: dict[tuple[str, int], int] = defaultdict(int)
        self.lagging = False
        self.lagging_partitions: set[tuple[str, int]] = set()
        self.markers: list[tuple[int, int, bool, int, tuple[str, int]]] = []
        self.marker_errors: dict[tuple[str, int], int] = {}
        self.marker_calls_fail: Exception | None = None
        self.markers_commit_in_wait = False
        self.marker_waits: list[int] = []
        self.appends_commit_with: tuple[int, ...] | None = None
        self.append_waits: list[int] = []
        self.marker_written = asyncio.Event()
        self.producers: dict[tuple[str, int], list[log_pb2.ActiveProducer]] = {}
        self.reads = 0

    def _store(self, where: tuple[str, int], records: bytes) -> tuple[int, int]:
        base = self.ends[where]
        batch = bytearray(records)
        batch[0:8] = struct.pack(">q", base)  # the log node assigns offsets
        count = struct.unpack_from(">i", batch, 23)[0] + 1
        self.batches[where].append((base, count, bytes(batch)))
        self.ends[where] += count
        return base, self.ends[where]

    def _result(self, where: tuple[str, int], base: int, end: int
                ) -> log_pb2.PartitionAppendResult:
        return log_pb2.PartitionAppendResult(
            topic=where[0], partition=where[1], base_offset=base, log_end_offset=end,
            high_watermark=base if self.lagging or where in self.lagging_partitions else end,
            leader_epoch=0, topic_id=f"id-{where[0]}")

    async def append(self, node: LogNode, request: log_pb2.AppendRequest, time_limit: float,
                     records: Sequence[bytes | memoryview | None] | None = None,
                     ) -> log_pb2.AppendResponse:
        await asyncio.sleep(0)
        [append] = whole_append(request, records).partitions
        self.append_waits.append(request.commit_wait_ms)
        where = (append.topic, append.partition)
        expected = append.expected_log_end_offset
        assert append.HasField("expected_log_end_offset")
        if self.ends[where] != expected:
            return log_pb2.AppendResponse(results=[log_pb2.PartitionAppendResult(
                topic=append.topic, partition=append.partition,
                error_code=ErrorCode.invalid_update_version.value)])
        isr = self.isr.get(where, (0,))
        if append.min_insync_replicas > len(isr):
            refused = NotEnoughReplicasError(isr, append.min_insync_replicas, *where)
            return log_pb2.AppendResponse(results=[log_pb2.PartitionAppendResult(
                topic=append.topic, partition=append.partition, error_code=refused.errno,
                error_message=refused.message)])
        result = self._result(where, *self._store(where, append.records))
        if request.commit_wait_ms > 0 and self.appends_commit_with is not None:
            result.high_watermark = result.log_end_offset
            result.commit_isr.extend(self.appends_commit_with)
        return log_pb2.AppendResponse(results=[result])

    async def read(self, node: LogNode, request: log_pb2.ReadRequest,
                   time_limit: float) -> log_pb2.ReadResponse:
        await asyncio.sleep(0)
        assert request.limit == log_pb2.READ_LIMIT_LOG_END
        self.reads += 1
        out = log_pb2.ReadResponse()
        for r in request.partitions:
            where = (r.topic, r.partition)
            data = b"".join(b for base, count, b in self.batches[where] if base + count > r.offset)
            out.results.add(topic=r.topic, partition=r.partition, records=data,
                            log_start_offset=0, log_end_offset=self.ends[where],
                            high_watermark=self.ends[where])
        return out

    async def write_txn_markers(self, node: LogNode, request: log_pb2.WriteTxnMarkersRequest,
                                time_limit: float) -> log_pb2.WriteTxnMarkersResponse:
        await asyncio.sleep(0)
        if self.marker_calls_fail is not None:
            raise self.marker_calls_fail
        out = log_pb2.WriteTxnMarkersResponse()
        self.marker_waits.append(request.commit_wait_ms)
        for marker in request.markers:
            answer = out.markers.add(producer_id=marker.producer_id)
            for tp in marker.partitions:
                where = (tp.topic, tp.partition)
                error = self.marker_errors.get(where, 0)
                if error:
                    answer.partitions.add(topic=tp.topic, partition=tp.partition,
                                          error_code=error)
                    continue
                batch = build_end_transaction_batch(
                    EndTransactionMarker(
                        type=ControlRecordType.COMMIT if marker.committed
                        else ControlRecordType.ABORT,
                        coordinator_epoch=marker.coordinator_epoch),
                    producer_id=marker.producer_id, producer_epoch=marker.producer_epoch,
                    timestamp=0)
                result = self._result(where, *self._store(where, batch))
                if request.commit_wait_ms > 0 and self.markers_commit_in_wait:
                    result.high_watermark = result.log_end_offset
                    out.commit_wait_us = 1500
                answer.partitions.append(result)
                self.markers.append((marker.producer_id, marker.producer_epoch,
                                     marker.committed, marker.coordinator_epoch, where))
        self.marker_written.set()
        return out

    async def describe_producers(self, node: LogNode,
                                 request: log_pb2.DescribeProducersRequest,
                                 time_limit: float) -> log_pb2.DescribeProducersResponse:
        return log_pb2.DescribeProducersResponse(results=[
            log_pb2.PartitionProducers(topic=tp.topic, partition=tp.partition,
                                       active_producers=self.producers.get(
                                           (tp.topic, tp.partition), []))
            for tp in request.partitions])


class MemoryPurgatory:
    """Waits on positions, timers by key and an expiry stream, in memory. Produce waits (for
    replication) complete at once unless ``replicated`` is False, answered with the leader's
    ISR ``isr`` (empty: not reported); ``expire(key)`` makes a timer run out."""

    def __init__(self) -> None:
        self.positions: dict[str, int] = {}
        self.changed = asyncio.Condition()
        self.replicated = True
        self.isr: tuple[int, ...] = ()
        self.produce_waits: list[dict[str, int]] = []
        self.armed_timers: dict[str, int] = {}
        self.expired: asyncio.Queue[str] = asyncio.Queue()
        self.subscriptions = 0

    async def wait(self, kind: int, thresholds: Mapping[str, int], require_all: bool,
                   timeout_ms: int) -> purgatory_pb2.AwaitResponse:
        if kind == purgatory_pb2.OPERATION_KIND_PRODUCE:
            self.produce_waits.append(dict(thresholds))
            return wait_result(self.replicated, thresholds if self.replicated else None,
                               isr=self.isr)

        def reached() -> bool:
            return any(self.positions.get(k, -1) >= t for k, t in thresholds.items())

        try:
            async with self.changed:
                await asyncio.wait_for(self.changed.wait_for(reached), timeout_ms / 1000)
        except TimeoutError:
            pass
        return wait_result(reached(), {k: self.positions.get(k, -1) for k in thresholds})

    async def complete(self, positions: Mapping[str, int]) -> None:
        async with self.changed:
            for key, position in positions.items():
                self.positions[key] = max(self.positions.get(key, -1), position)
            self.changed.notify_all()

    async def schedule(self, deadlines: Mapping[str, int]) -> None:
        self.armed_timers.update(deadlines)

    async def unschedule(self, keys: Sequence[str]) -> None:
        for key in keys:
            self.armed_timers.pop(key, None)

    async def armed(self, keys: Sequence[str]) -> set[str]:
        return {key for key in keys if key in self.armed_timers}

    async def expire(self, key: str) -> None:
        """The timer of ``key`` runs out (it is no longer armed)."""
        self.armed_timers.pop(key, None)
        await self.expired.put(key)

    async def watch_expirations(self) -> AsyncIterator[list[str]]:
        self.subscriptions += 1
        yield []
        while True:
            yield [await self.expired.get()]
