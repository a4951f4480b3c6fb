"""gRPC glue of ``kbroker.log.v1.LogService``: protobuf in, domain calls on the
:class:`~services.log.log_manager.LogManager`, protobuf out. Domain errors become per-partition
Kafka error codes here, and only here: a :class:`KafkaError` carries its code, an ``OSError`` is
KAFKA_STORAGE_ERROR (as Kafka maps I/O failures) and fails the log directory (see
:mod:`services.log.log_dir_failure`: logged once, not per call), anything else
UNKNOWN_SERVER_ERROR.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

import grpc
from google.protobuf import message_factory
from google.protobuf.message import Message

from kbroker.log.v1 import log_pb2, log_pb2_grpc
from services.common import payloads
from services.common.call_streams import serve_calls
from services.common.envelopes import APPEND_BATCHES
from services.common.errors import ErrorCode, KafkaError, RecordValidationError, error_name
from services.common.file_records import is_local, spool_reader
from services.common.payloads import Detached, MaybePayload, PayloadPath
from services.common.records.record_batch import NO_TIMESTAMP

from . import metrics
from .log_dir_failure import DiskUsage, LogDirFailureChannel
from .log_manager import LogManager
from .partition_log import LAST_STABLE, NO_LEADER_EPOCH, NO_OFFSET, PartitionLog
from .replica_fetch_codec import encode_fetch_response
from .replica_fetch_session import ReplicaFetchSession
from .replica_manager import ReplicaManager
from .verification import VerificationRequiredError

log = logging.getLogger(__name__)

R = TypeVar("R", bound=Message)

# Where appends and reads carry their record batches: read from the received bytes as views,
# and written around the batches (services.common.payloads), never copied by protobuf.
APPEND_RECORDS = PayloadPath(log_pb2.AppendStreamRequest.DESCRIPTOR, "request.partitions.records")
READ_RECORDS = PayloadPath(log_pb2.ReadResponse.DESCRIPTOR, "results.records")


_COMMITTED = metrics.COMMIT_WAIT_SECONDS.labels("committed")
_HANDED_ON = metrics.COMMIT_WAIT_SECONDS.labels("handed_on")


async def _await_commits(
        commits: list[tuple[log_pb2.PartitionAppendResult,
                            asyncio.Future[tuple[int, ...] | None]]],
        seconds: float) -> float:
    """Hold the answer to an acks=all append (or to transaction markers) until the leader's
    high watermark passes what it wrote to each partition, for at most ``seconds``: a partition
    committed meanwhile is answered with its high watermark at its log end offset and the ISR
    that committed it, so the write needs no wait in the purgatory (one hop and up to three
    messages fewer); the others are answered as they were written. Returns how long the answer
    was held, in seconds."""
    started = time.perf_counter()
    await asyncio.wait([future for _, future in commits], timeout=seconds)
    waited = time.perf_counter() - started
    for result, future in commits:
        isr = future.result() if future.done() else None
        if isr is None:
            future.cancel()
            _HANDED_ON.observe(waited)
            continue
        result.high_watermark = max(result.high_watermark, result.log_end_offset)
        result.commit_isr.extend(isr)
        _COMMITTED.observe(waited)
    return waited


def _fail_append(api: str, exc: Exception, result: log_pb2.PartitionAppendResult,
                 log_dir: LogDirFailureChannel) -> None:
    """:func:`_fail` for a partition's append result, with the offsets unknown; an append
    that needs verifying carries its guard."""
    _fail(api, exc, result, log_dir)
    result.base_offset = result.log_start_offset = NO_OFFSET
    result.log_end_offset = result.high_watermark = NO_OFFSET
    result.log_append_time_ms = NO_TIMESTAMP
    if isinstance(exc, VerificationRequiredError):
        result.verification_guard = exc.guard
    if isinstance(exc, RecordValidationError):
        result.record_errors.extend(log_pb2.RecordError(batch_index=index, message=why)
                                    for index, why in exc.record_errors)


def _fail(api: str, exc: Exception, result: Any, log_dir: LogDirFailureChannel) -> None:
    """Put the Kafka error code (and message, where the result has one) for ``exc`` in a
    partition's ``result``; an I/O error fails ``log_dir``."""
    if isinstance(exc, KafkaError):
        code, message = exc.errno, exc.message or ""
    elif isinstance(exc, OSError):
        log_dir.fail(exc, api)
        code, message = int(ErrorCode.kafka_storage_error.value), str(exc)
    else:
        log.exception("%s: unexpected failure", api)
        code, message = int(ErrorCode.unknown_server_error.value), str(exc)
    metrics.ERRORS.labels(api, error_name(code)).inc()
    result.error_code = code
    if "error_message" in result.DESCRIPTOR.fields_by_name:
        result.error_message = message


class LogServicer(log_pb2_grpc.LogServiceServicer):
    """Serves one node's partition replicas."""

    def __init__(self, manager: LogManager, replicas: ReplicaManager,
                 local_files: bool = True) -> None:
        self._manager = manager
        self._replicas = replicas
        # Appends whose batches wait in a frontend's spool file on this host are read from it
        # (services.common.file_records).
        self._spool = spool_reader() if local_files else None
        # Whether an append to a replica is refused because the node hands it over (see
        # services.log.controlled_shutdown); the replica then answers NOT_LEADER_OR_FOLLOWER.
        self.refuses_append: Callable[[PartitionLog], bool] = lambda replica: False

    def _leader(self, topic: str, partition: int) -> PartitionLog:
        """The replica an append goes to, unless it is being handed over."""
        replica = self._manager.get(topic, partition)
        if self.refuses_append(replica):
            raise KafkaError(ErrorCode.not_leader_or_follower,
                             f"{topic}-{partition}: this log node is shutting down and hands "
                             "its leadership over")
        return replica

    def _log(self, item: Any) -> PartitionLog:
        return self._manager.get(item.topic, item.partition)

    async def _each(self, response: R, items: Iterable[Any],
                    work: Callable[[Any, Any], Awaitable[object] | object],
                    offsets: bool = False, **on_error: int) -> R:
        """Serve one partition per item of a request into ``response`` (of the API its type
        names): a result of the item's topic and partition is added to its results and filled
        by ``work(item, result)`` (awaited if it returns a coroutine); whatever that raises
        becomes the result's error (:func:`_fail`), with the ``on_error`` fields set. With
        ``offsets``, every result then gets the replica's offsets after the call, failed or
        not (they tell a reader whose offset is out of range where the log is); -1 without a
        replica."""
        api, field, offset_fields = _shape(type(response))
        results = getattr(response, field)
        for item in items:
            result = results.add(topic=item.topic, partition=item.partition)
            try:
                done = work(item, result)
                if asyncio.iscoroutine(done):
                    await done
            except Exception as exc:  # noqa: BLE001 - becomes the partition's error code
                _fail(api, exc, result, self._manager.log_dir)
                for name, value in on_error.items():
                    setattr(result, name, value)
        for result in results if offsets else ():
            found = self._manager.find(result.topic, result.partition)
            for name in offset_fields:
                setattr(result, name, NO_OFFSET if found is None else getattr(
                    found, _OFFSET_SOURCES[name]))
        return response

    async def CreatePartitions(self, request, context):
        async def create(spec: log_pb2.PartitionSpec, _: object) -> None:
            created = self._manager.create(spec.topic, spec.partition, spec.topic_id,
                                           dict(spec.configs))
            if spec.HasField("state"):
                await self._replicas.apply_state(created, spec.state)

        response = await self._each(log_pb2.CreatePartitionsResponse(), request.partitions, create)
        metrics.PARTITIONS.set(len(self._manager))
        return response

    async def DeletePartitions(self, request, context):
        def delete(tp: log_pb2.TopicPartition, _: object) -> None:
            self._replicas.forget((tp.topic, tp.partition))
            self._manager.delete(tp.topic, tp.partition)

        response = await self._each(log_pb2.DeletePartitionsResponse(), request.partitions,
                                    delete)
        metrics.PARTITIONS.set(len(self._manager))
        return response

    async def Append(self, request, context):
        response = log_pb2.AppendResponse()
        await self._append(request, response)
        return response

    async def AppendStream(self, request_iterator, context):
        """Appends on one stream; the requests arrive as bytes (see
        :func:`add_log_service_to_server`), several in one message when the caller batches
        them, and their record batches are appended from views of them; answers go in
        batches to a caller that takes them."""

        async def answer(data: bytes) -> bytes:
            message, records = payloads.parse_message(data, log_pb2.AppendStreamRequest,
                                                      APPEND_RECORDS)
            reply = log_pb2.AppendStreamResponse(call_id=message.call_id)
            await self._append(message.request, reply.response, records)
            return reply.SerializeToString()

        await serve_calls(request_iterator, context, answer, batches=APPEND_BATCHES,
                          name="append")

    async def _append(self, request: log_pb2.AppendRequest,
                      response: log_pb2.AppendResponse,
                      records: list[memoryview | None] | None = None) -> None:
        """``records``: each partition's batches, when they came beside the request."""
        if request.local_reader:
            records = self._spooled(request, records)
            if records is None:
                response.records_unreadable = True
                return
        # The hot path: one loop of its own, each result added whole.
        commits = []
        for number, item in enumerate(request.partitions):
            topic, partition = item.topic, item.partition
            batches = item.records if records is None else records[number] or b""
            topic_metrics = metrics.topic(topic)
            topic_metrics.append_requests.inc()
            started = time.perf_counter()
            try:
                leader = self._leader(topic, partition)
                info = await leader.append(
                    batches, expected_log_end_offset=item.expected_log_end_offset
                    if item.HasField("expected_log_end_offset") else None,
                    verification_guard=item.verification_guard,
                    min_insync_replicas=item.min_insync_replicas)
            except Exception as exc:  # noqa: BLE001 - becomes the partition's error code
                _fail_append("Append", exc, response.results.add(
                    topic=topic, partition=partition), self._manager.log_dir)
            else:
                topic_metrics.appended_bytes.inc(info.size_bytes)
                topic_metrics.appended_batches.inc(info.batch_count)
                response.results.add(
                    topic=topic, partition=partition, base_offset=info.base_offset,
                    log_append_time_ms=info.log_append_time_ms,
                    log_start_offset=info.log_start_offset, log_end_offset=info.log_end_offset,
                    high_watermark=info.high_watermark, leader_epoch=info.leader_epoch,
                    topic_id=leader.topic_id, partition_epoch=info.partition_epoch)
                if (request.commit_wait_ms > 0 and item.min_insync_replicas
                        and info.high_watermark < info.log_end_offset):
                    commits.append((response.results[-1], leader.committed(info.log_end_offset)))
            metrics.APPEND_SECONDS.observe(time.perf_counter() - started)
        if commits:
            waited = await _await_commits(commits, request.commit_wait_ms / 1000)
            response.commit_wait_us = int(waited * 1e6)

    def _spooled(self, request: log_pb2.AppendRequest, records: list[MaybePayload] | None,
                 ) -> list[MaybePayload] | None:
        """Every partition's batches, those named in spool files read from them; None (and
        nothing appended) when one cannot be read: the files are on another host, gone, or
        this node does not read them."""
        if self._spool is None or not is_local(request.local_reader):
            return None
        found: list[MaybePayload] = []
        for number, item in enumerate(request.partitions):
            if item.HasField("file_records"):
                files = item.file_records
                data = self._spool.read(files.path, files.inode, files.position, files.size)
                if data is None:
                    log.info("append: %d bytes at %d of %s (inode %d) unreadable", files.size,
                             files.position, files.path, files.inode)
                    return None
                found.append(data)
            else:
                found.append(item.records if records is None else records[number])
        return found

    async def WriteTxnMarkers(self, request, context):
        """Each marker on each of its partitions, in order, answered as an Append is (the
        marker's offset as base_offset), held like an acks=all one with ``commit_wait_ms``."""
        response = log_pb2.WriteTxnMarkersResponse()
        commits = []
        for marker in request.markers:
            results = response.markers.add(producer_id=marker.producer_id).partitions
            for item in marker.partitions:
                topic, partition = item.topic, item.partition
                try:
                    leader = self._leader(topic, partition)
                    info = await leader.write_txn_marker(
                        marker.producer_id, marker.producer_epoch, marker.committed,
                        marker.coordinator_epoch)
                except Exception as exc:  # noqa: BLE001 - becomes the partition's error code
                    _fail_append("WriteTxnMarkers", exc, results.add(
                        topic=topic, partition=partition), self._manager.log_dir)
                else:
                    result = results.add(
                        topic=topic, partition=partition, base_offset=info.base_offset,
                        log_append_time_ms=info.log_append_time_ms,
                        log_start_offset=info.log_start_offset,
                        log_end_offset=info.log_end_offset, high_watermark=info.high_watermark,
                        leader_epoch=info.leader_epoch, topic_id=leader.topic_id)
                    if request.commit_wait_ms > 0 and info.high_watermark < info.log_end_offset:
                        commits.append((result, leader.committed(info.log_end_offset)))
        if commits:
            waited = await _await_commits(commits, request.commit_wait_ms / 1000)
            response.commit_wait_us = int(waited * 1e6)
        return response

    async def DescribeProducers(self, request, context):
        def describe(tp: log_pb2.TopicPartition, result: log_pb2.PartitionProducers) -> None:
            for entry in self._log(tp).active_producers():
                result.active_producers.add(
                    producer_id=entry.producer_id, producer_epoch=entry.epoch,
                    last_sequence=entry.last_seq, last_timestamp=entry.last_timestamp,
                    coordinator_epoch=entry.coordinator_epoch,
                    current_txn_start_offset=entry.txn_first_offset)

        return await self._each(log_pb2.DescribeProducersResponse(), request.partitions,
                                describe)

    async def Read(self, request, context):
        """Reads each partition in order under the request's overall byte limit, as Kafka's
        fetch does: only the first partition that returns data may exceed a limit (with one
        whole batch); after it, partitions get at most what remains of the budget. With
        ``max_wait_ms``, a read that found nothing (and no error) waits for the next append to
        any of the partitions, or the time limit, and reads again. The answer keeps its
        record batches beside it (:class:`~services.common.payloads.Detached`), serialized
        around them."""
        response = self._read(request)
        # As Kafka's fetch, a read of no partitions is answered at once.
        if (request.max_wait_ms <= 0 or not request.partitions
                or any(response.payloads)
                or any(r.HasField("file_records") for r in response.message.results)
                or any(r.error_code for r in response.message.results)):
            return response
        try:
            logs = [self._log(r) for r in request.partitions]
        except KafkaError:
            return response  # deleted meanwhile: the next read reports it
        woken: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        for partition_log in logs:
            partition_log.wake_on_change(woken)
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(request.max_wait_ms / 1000):
                    await woken
        finally:
            for partition_log in logs:
                partition_log.forget_waiter(woken)
        return self._read(request)

    def _read(self, request: log_pb2.ReadRequest) -> Detached:
        # The hot path: one loop of its own.
        started = time.perf_counter()
        budget = request.max_bytes if request.max_bytes > 0 else None
        min_one = True
        committed = request.limit == LAST_STABLE
        # A reader on this host reads the batches from the segment files itself.
        in_files = is_local(request.local_reader)
        response = log_pb2.ReadResponse()
        found: list[MaybePayload] = []
        for item in request.partitions:
            result = response.results.add(topic=item.topic, partition=item.partition)
            max_bytes = item.max_bytes if budget is None else min(item.max_bytes, budget)
            partition_log = self._manager.find(item.topic, item.partition)
            try:
                read_log = self._log(item)
                where = read_log.locate(item.offset, max(max_bytes, 0), request.limit, min_one)
                if committed:
                    for txn in read_log.aborted_within(where):
                        result.aborted_transactions.add(producer_id=txn.producer_id,
                                                        first_offset=txn.first_offset)
                size, records = where.size, b""
                if not (in_files and where.name_in(result.file_records)):
                    records = where.read()
            except Exception as exc:  # noqa: BLE001 - becomes the partition's error code
                _fail("Read", exc, result, self._manager.log_dir)
                records, size = b"", 0
            # The replica's offsets, failed or not: they tell a reader whose offset is out of
            # range where the log is.
            if partition_log is None:
                result.high_watermark = result.last_stable_offset = NO_OFFSET
                result.log_start_offset = result.log_end_offset = NO_OFFSET
            else:
                result.high_watermark = partition_log.high_watermark
                result.last_stable_offset = partition_log.last_stable_offset
                result.log_start_offset = partition_log.log_start_offset
                result.log_end_offset = partition_log.log_end_offset
            found.append(records or None)
            if size:
                metrics.topic(item.topic).read_bytes.inc(size)
                min_one = False
                if budget is not None:
                    budget = max(budget - size, 0)
        metrics.READ_SECONDS.observe(time.perf_counter() - started)
        return Detached(response, READ_RECORDS, found)

    async def ListOffsets(self, request, context):
        def list_offset(query: log_pb2.PartitionTimestamp, result: log_pb2.PartitionOffset) -> None:
            found = self._log(query).list_offset(query.timestamp, request.limit)
            result.offset, result.timestamp = found.offset, found.timestamp
            result.leader_epoch = found.leader_epoch

        return await self._each(log_pb2.ListOffsetsResponse(), request.partitions, list_offset,
                                offset=NO_OFFSET, timestamp=NO_TIMESTAMP,
                                leader_epoch=NO_LEADER_EPOCH)

    async def DescribePartitions(self, request, context):
        return await self._each(log_pb2.DescribePartitionsResponse(),
                                request.partitions or self._manager.partitions(),
                                lambda tp, state: _describe(state, self._log(tp)), offsets=True)

    async def DescribeLogDir(self, request, context):
        manager = self._manager
        log_dir = manager.log_dir
        description = log_pb2.LogDirDescription(path=str(log_dir.path))
        if log_dir.offline:
            description.error_code = int(ErrorCode.kafka_storage_error.value)
            description.error_message = log_dir.failure or ""
            description.total_bytes = description.usable_bytes = -1
            return description
        usage = await asyncio.to_thread(DiskUsage.of, log_dir.path)
        description.total_bytes, description.usable_bytes = usage.total, usage.free
        wanted = {(p.topic, p.partition) for p in request.partitions}
        for partition_log in manager.partitions():
            key = (partition_log.topic, partition_log.partition)
            if wanted and key not in wanted:
                continue
            description.replicas.add(
                topic=partition_log.topic, partition=partition_log.partition,
                size_bytes=partition_log.size_bytes,
                offset_lag=max(partition_log.high_watermark - partition_log.log_end_offset, 0))
        return description

    async def DeleteRecords(self, request, context):
        async def delete(item: log_pb2.PartitionDeleteRecords,
                         result: log_pb2.PartitionLowWatermark) -> None:
            result.low_watermark = await self._manager.delete_records(
                item.topic, item.partition, item.offset)

        return await self._each(log_pb2.DeleteRecordsResponse(), request.partitions, delete,
                                low_watermark=NO_OFFSET)

    async def UpdatePartitionConfigs(self, request, context):
        return await self._each(log_pb2.UpdatePartitionConfigsResponse(), request.partitions,
                                lambda spec, _: self._manager.update_configs(
                                    spec.topic, spec.partition, dict(spec.configs)))

    async def UpdateReplicaStates(self, request, context):
        return await self._each(log_pb2.UpdateReplicaStatesResponse(), request.states,
                                lambda state, _: self._replicas.apply_state(self._log(state),
                                                                            state))

    async def UpdateReplicationSettings(self, request, context):
        self._replicas.apply_settings(request)
        return log_pb2.ReplicationSettingsResponse()

    async def ReplicaFetch(self, request_iterator, context):
        """A follower's fetch session: each request answered in turn (serialized by hand,
        see :func:`add_log_service_to_server`)."""
        session = ReplicaFetchSession()
        async for request in request_iterator:
            yield encode_fetch_response(await self._replicas.fetch(request, session))
            if self._replicas.stopping:
                return  # the follower opens a session elsewhere, or again once restarted

    async def ReplicaFetchOnce(self, request, context):
        return encode_fetch_response(await self._replicas.fetch(request))

    async def AlterPartitions(self, request_iterator, context):
        """The replicator's control stream: this node's ISR changes out, answers in."""

        async def take_answers() -> None:
            async for answers in request_iterator:
                await self._replicas.apply_answers(answers)

        answering = asyncio.ensure_future(take_answers())
        subscription = self._replicas.subscribe_isr_changes()
        sending: asyncio.Future[log_pb2.IsrChangeRequests] | None = None
        try:
            while True:
                sending = asyncio.ensure_future(subscription.next())
                await asyncio.wait({sending, answering}, return_when=asyncio.FIRST_COMPLETED)
                if not sending.done():
                    break  # the replicator closed its side
                changes = sending.result()
                if changes is None:
                    break  # this node stops
                yield changes
        finally:
            for task in (sending, answering):
                if task is not None:
                    task.cancel()
            subscription.close()
            if answering.done() and not answering.cancelled() and answering.exception():
                log.error("ISR change answers failed", exc_info=answering.exception())

    async def OffsetForLeaderEpoch(self, request, context):
        def end_offset(item: log_pb2.PartitionLeaderEpoch, result: log_pb2.EpochEndOffset) -> None:
            partition_log = self._log(item)
            result.leader_epoch, result.end_offset = partition_log.leader_epochs.end_offset_for(
                item.leader_epoch, partition_log.log_end_offset)

        return await self._each(log_pb2.OffsetForLeaderEpochResponse(), request.partitions,
                                end_offset, leader_epoch=NO_LEADER_EPOCH, end_offset=NO_OFFSET)


# The replica offsets results carry (outside Read), by the partition log property giving them.
_OFFSET_SOURCES = {"high_watermark": "high_watermark", "log_start_offset": "log_start_offset",
                   "log_end_offset": "log_end_offset"}


@functools.cache
def _shape(kind: type[Message]) -> tuple[str, str, tuple[str, ...]]:
    """The API a response type answers, the name of its results and their offset fields."""
    results = kind.DESCRIPTOR.fields[0]
    return (kind.DESCRIPTOR.name.removesuffix("Response"), results.name,
            tuple(name for name in _OFFSET_SOURCES if name in results.message_type.fields_by_name))


def _describe(state: log_pb2.PartitionState, partition_log: PartitionLog) -> None:
    state.size_bytes = partition_log.size_bytes
    state.segments = partition_log.segment_count
    state.leader_epoch = partition_log.state.leader_epoch
    state.role = partition_log.state.role
    state.latest_log_epoch = partition_log.leader_epochs.latest_epoch
    state.partition_epoch = partition_log.state.partition_epoch


# Methods whose answers the servicer serializes itself (bytes out), answers kept beside their
# record batches (serialized around them), and requests taken as bytes (their batches read as
# views of them).
_SERIALIZED_ANSWERS = frozenset({"ReplicaFetch", "ReplicaFetchOnce", "AppendStream"})
_DETACHED_ANSWERS = frozenset({"Read"})
_RAW_REQUESTS = frozenset({"AppendStream"})
_HANDLER_KINDS = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}


def _serialize_detached(answer: Detached | Message) -> bytes:
    return answer.SerializeToString()


def add_log_service_to_server(servicer: LogServicer, server: grpc.aio.Server) -> None:
    """Serve ``LogService`` as the generated function would, except that record batches are
    never copied into or out of a protobuf message: the follower fetch answers go out as the
    bytes the servicer wrote (:mod:`.replica_fetch_codec`), reads are serialized around their
    batches and appends on the stream are read from the received bytes
    (:mod:`services.common.payloads`)."""
    service = log_pb2.DESCRIPTOR.services_by_name["LogService"]
    handlers = {}
    for method in service.methods:
        kind = _HANDLER_KINDS[(method.client_streaming, method.server_streaming)]
        request = message_factory.GetMessageClass(method.input_type)
        response = message_factory.GetMessageClass(method.output_type)
        serializer: Callable[[Any], bytes] | None = response.SerializeToString
        if method.name in _SERIALIZED_ANSWERS:
            serializer = None
        elif method.name in _DETACHED_ANSWERS:
            serializer = _serialize_detached
        handlers[method.name] = kind(
            getattr(servicer, method.name),
            request_deserializer=None if method.name in _RAW_REQUESTS else request.FromString,
            response_serializer=serializer)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(service.full_name, handlers),))
