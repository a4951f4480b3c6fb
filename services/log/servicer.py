"""gRPC glue of ``kbroker.log.v1.LogService``: protobuf in, domain calls on the
:class:`~services.log.log_manager.LogManager`, protobuf out. Domain errors become per-partition
Kafka error codes here, and only here: a :class:`KafkaError` carries its code, an ``OSError`` is
KAFKA_STORAGE_ERROR (as Kafka maps I/O failures), anything else UNKNOWN_SERVER_ERROR.
"""

from __future__ import annotations

import asyncio
import logging
import time

from kbroker.log.v1 import log_pb2, log_pb2_grpc
from services.common.call_streams import serve_calls
from services.common.errors import ErrorCode, KafkaError, error_name
from services.common.records.record_batch import NO_TIMESTAMP

from . import metrics
from .log_manager import LogManager
from .partition_log import NO_LEADER_EPOCH, NO_OFFSET, PartitionLog, ReadLimit
from .replica_state import ReplicaState, Role

log = logging.getLogger(__name__)

_READ_LIMITS = {
    log_pb2.READ_LIMIT_HIGH_WATERMARK: ReadLimit.HIGH_WATERMARK,
    log_pb2.READ_LIMIT_LOG_END: ReadLimit.LOG_END,
}


def _error_of(api: str, exc: Exception) -> tuple[int, str]:
    """The Kafka error code and message a partition answer carries for ``exc``."""
    if isinstance(exc, KafkaError):
        code, message = exc.errno, exc.message or ""
    elif isinstance(exc, OSError):
        log.exception("%s: storage failure", api)
        code, message = int(ErrorCode.kafka_storage_error.value), str(exc)
    else:
        log.exception("%s: unexpected failure", api)
        code, message = int(ErrorCode.unknown_server_error.value), str(exc)
    metrics.ERRORS.labels(api, error_name(code)).inc()
    return code, message


class LogServicer(log_pb2_grpc.LogServiceServicer):
    """Serves one node's partition replicas."""

    def __init__(self, manager: LogManager) -> None:
        self._manager = manager

    async def CreatePartitions(self, request, context):
        response = log_pb2.CreatePartitionsResponse()
        for spec in request.partitions:
            result = response.results.add(topic=spec.topic, partition=spec.partition)
            try:
                created = self._manager.create(spec.topic, spec.partition, spec.topic_id,
                                               dict(spec.configs))
                if spec.HasField("state"):
                    await created.become(_replica_state(spec.state))
            except Exception as exc:  # noqa: BLE001 - becomes the partition's error code
                result.error_code, result.error_message = _error_of("CreatePartitions", exc)
        metrics.PARTITIONS.set(len(self._manager))
        return response

    async def DeletePartitions(self, request, context):
        response = log_pb2.DeletePartitionsResponse()
        for tp in request.partitions:
            result = response.results.add(topic=tp.topic, partition=tp.partition)
            try:
                self._manager.delete(tp.topic, tp.partition)
            except Exception as exc:  # noqa: BLE001
                result.error_code, result.error_message = _error_of("DeletePartitions", exc)
        metrics.PARTITIONS.set(len(self._manager))
        return response

    async def Append(self, request, context):
        response = log_pb2.AppendResponse()
        await self._append(request, response)
        return response

    async def AppendStream(self, request_iterator, context):
        async def answer(message: log_pb2.AppendStreamRequest) -> log_pb2.AppendStreamResponse:
            reply = log_pb2.AppendStreamResponse(call_id=message.call_id)
            await self._append(message.request, reply.response)
            return reply

        await serve_calls(request_iterator, context, answer)

    async def _append(self, request: log_pb2.AppendRequest,
                      response: log_pb2.AppendResponse) -> None:
        for append in request.partitions:
            topic = append.topic
            topic_metrics = metrics.topic(topic)
            topic_metrics.append_requests.inc()
            started = time.perf_counter()
            try:
                expected = (append.expected_log_end_offset
                            if append.HasField("expected_log_end_offset") else None)
                info = await self._manager.get(topic, append.partition).append(
                    append.records, expected_log_end_offset=expected)
            except Exception as exc:  # noqa: BLE001
                code, message = _error_of("Append", exc)
                response.results.add(
                    topic=topic, partition=append.partition, error_code=code,
                    error_message=message, base_offset=NO_OFFSET,
                    log_append_time_ms=NO_TIMESTAMP, log_start_offset=NO_OFFSET,
                    log_end_offset=NO_OFFSET, high_watermark=NO_OFFSET,
                )
            else:
                topic_metrics.appended_bytes.inc(info.size_bytes)
                topic_metrics.appended_batches.inc(info.batch_count)
                response.results.add(
                    topic=topic, partition=append.partition, base_offset=info.base_offset,
                    log_append_time_ms=info.log_append_time_ms,
                    log_start_offset=info.log_start_offset, log_end_offset=info.log_end_offset,
                    high_watermark=info.high_watermark, leader_epoch=info.leader_epoch,
                )
            metrics.APPEND_SECONDS.observe(time.perf_counter() - started)

    async def Read(self, request, context):
        """Reads each partition in order under the request's overall byte limit, as Kafka's
        fetch does: only the first partition that returns data may exceed a limit (with one
        whole batch); after it, partitions get at most what remains of the budget. With
        ``max_wait_ms``, a read that found nothing (and no error) waits for the next append to
        any of the partitions, or the time limit, and reads again."""
        response = self._read(request)
        if request.max_wait_ms <= 0 or any(r.records or r.error_code for r in response.results):
            return response
        try:
            events = [self._manager.get(r.topic, r.partition).appended()
                      for r in request.partitions]
        except KafkaError:
            return response  # deleted meanwhile: the next read reports it
        waiters = [asyncio.ensure_future(event.wait()) for event in events]
        try:
            await asyncio.wait(waiters, timeout=request.max_wait_ms / 1000,
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()
        return self._read(request)

    def _read(self, request: log_pb2.ReadRequest) -> log_pb2.ReadResponse:
        started = time.perf_counter()
        limit = _READ_LIMITS.get(request.limit, ReadLimit.HIGH_WATERMARK)
        budget = request.max_bytes if request.max_bytes > 0 else None
        min_one = True
        response = log_pb2.ReadResponse()
        for read in request.partitions:
            result = response.results.add(topic=read.topic, partition=read.partition)
            max_bytes = read.max_bytes if budget is None else min(read.max_bytes, budget)
            partition_log: PartitionLog | None = None
            try:
                partition_log = self._manager.get(read.topic, read.partition)
                info = partition_log.read(read.offset, max(max_bytes, 0), limit, min_one)
            except Exception as exc:  # noqa: BLE001
                result.error_code, result.error_message = _error_of("Read", exc)
                _fill_offsets(result, partition_log)
                continue
            records = info.records
            result.records = records
            result.high_watermark = info.high_watermark
            result.last_stable_offset = info.high_watermark  # no transactions yet
            result.log_start_offset = info.log_start_offset
            result.log_end_offset = info.log_end_offset
            if records:
                metrics.topic(read.topic).read_bytes.inc(len(records))
                min_one = False
                if budget is not None:
                    budget = max(budget - len(records), 0)
        metrics.READ_SECONDS.observe(time.perf_counter() - started)
        return response

    async def ListOffsets(self, request, context):
        limit = _READ_LIMITS.get(request.limit, ReadLimit.HIGH_WATERMARK)
        response = log_pb2.ListOffsetsResponse()
        for query in request.partitions:
            result = response.results.add(topic=query.topic, partition=query.partition)
            try:
                found = self._manager.get(query.topic, query.partition).list_offset(
                    query.timestamp, limit
                )
            except Exception as exc:  # noqa: BLE001
                result.error_code, _ = _error_of("ListOffsets", exc)
                result.offset, result.timestamp = NO_OFFSET, NO_TIMESTAMP
                result.leader_epoch = NO_LEADER_EPOCH
                continue
            result.offset = found.offset
            result.timestamp = found.timestamp
            result.leader_epoch = found.leader_epoch
        return response

    async def DescribePartitions(self, request, context):
        response = log_pb2.DescribePartitionsResponse()
        if not request.partitions:
            for partition_log in self._manager.partitions():
                _describe(response.partitions.add(), partition_log)
            return response
        for tp in request.partitions:
            state = response.partitions.add(topic=tp.topic, partition=tp.partition)
            try:
                _describe(state, self._manager.get(tp.topic, tp.partition))
            except Exception as exc:  # noqa: BLE001
                state.error_code, _ = _error_of("DescribePartitions", exc)
                state.log_start_offset = state.log_end_offset = NO_OFFSET
                state.high_watermark = NO_OFFSET
        return response

    async def DeleteRecords(self, request, context):
        response = log_pb2.DeleteRecordsResponse()
        for item in request.partitions:
            result = response.results.add(topic=item.topic, partition=item.partition)
            try:
                result.low_watermark = await self._manager.delete_records(
                    item.topic, item.partition, item.offset)
            except Exception as exc:  # noqa: BLE001
                result.error_code, result.error_message = _error_of("DeleteRecords", exc)
                result.low_watermark = NO_OFFSET
        return response

    async def UpdatePartitionConfigs(self, request, context):
        response = log_pb2.UpdatePartitionConfigsResponse()
        for spec in request.partitions:
            result = response.results.add(topic=spec.topic, partition=spec.partition)
            try:
                self._manager.update_configs(spec.topic, spec.partition, dict(spec.configs))
            except Exception as exc:  # noqa: BLE001
                result.error_code, result.error_message = _error_of(
                    "UpdatePartitionConfigs", exc)
        return response


    async def UpdateReplicaStates(self, request, context):
        response = log_pb2.UpdateReplicaStatesResponse()
        for state in request.states:
            result = response.results.add(topic=state.topic, partition=state.partition)
            try:
                await self._manager.get(state.topic, state.partition).become(
                    _replica_state(state))
            except Exception as exc:  # noqa: BLE001
                result.error_code, result.error_message = _error_of("UpdateReplicaStates", exc)
        return response

    async def ReplicateAppend(self, request, context):
        response = log_pb2.ReplicateAppendResponse()
        for item in request.partitions:
            result = response.results.add(topic=item.topic, partition=item.partition)
            partition_log: PartitionLog | None = None
            try:
                partition_log = self._manager.get(item.topic, item.partition)
                await partition_log.append_as_follower(item.records, item.leader_epoch,
                                                       item.high_watermark)
                # Kafka's maybeIncrementLogStartOffset: records the leader deleted go here too.
                start = min(item.log_start_offset, partition_log.high_watermark)
                if start > partition_log.log_start_offset:
                    await self._manager.delete_records(item.topic, item.partition, start)
            except Exception as exc:  # noqa: BLE001
                result.error_code, result.error_message = _error_of("ReplicateAppend", exc)
            _fill_ends(result, partition_log)
        return response

    async def UpdateHighWatermarks(self, request, context):
        response = log_pb2.UpdateHighWatermarksResponse()
        for item in request.partitions:
            result = response.results.add(topic=item.topic, partition=item.partition)
            try:
                self._manager.get(item.topic, item.partition).update_high_watermark(
                    item.high_watermark, item.leader_epoch)
            except Exception as exc:  # noqa: BLE001
                result.error_code, result.error_message = _error_of("UpdateHighWatermarks", exc)
        return response

    async def Truncate(self, request, context):
        response = log_pb2.TruncateResponse()
        for item in request.partitions:
            result = response.results.add(topic=item.topic, partition=item.partition)
            partition_log: PartitionLog | None = None
            try:
                partition_log = self._manager.get(item.topic, item.partition)
                if item.start_over:
                    await partition_log.start_over_at(item.offset)
                else:
                    await partition_log.truncate_to(item.offset)
            except Exception as exc:  # noqa: BLE001
                result.error_code, result.error_message = _error_of("Truncate", exc)
            _fill_ends(result, partition_log)
        return response

    async def OffsetForLeaderEpoch(self, request, context):
        response = log_pb2.OffsetForLeaderEpochResponse()
        for item in request.partitions:
            result = response.results.add(topic=item.topic, partition=item.partition)
            try:
                result.leader_epoch, result.end_offset = self._manager.get(
                    item.topic, item.partition).end_offset_for_epoch(item.leader_epoch)
            except Exception as exc:  # noqa: BLE001
                result.error_code, _ = _error_of("OffsetForLeaderEpoch", exc)
                result.leader_epoch, result.end_offset = NO_LEADER_EPOCH, NO_OFFSET
        return response


_ROLES = {
    log_pb2.REPLICA_ROLE_LEADER: Role.LEADER,
    log_pb2.REPLICA_ROLE_FOLLOWER: Role.FOLLOWER,
}
_ROLE_VALUES = {
    Role.UNKNOWN: log_pb2.REPLICA_ROLE_UNKNOWN,
    Role.LEADER: log_pb2.REPLICA_ROLE_LEADER,
    Role.FOLLOWER: log_pb2.REPLICA_ROLE_FOLLOWER,
}


def _replica_state(message: log_pb2.ReplicaState) -> ReplicaState:
    role = _ROLES.get(message.role)
    if role is None:
        raise KafkaError(ErrorCode.invalid_request, "a replica state must lead or follow")
    return ReplicaState(role=role, leader_epoch=message.leader_epoch,
                        in_sync_alone=message.in_sync_alone)


def _fill_ends(result: log_pb2.PartitionReplicateResult,
               partition_log: PartitionLog | None) -> None:
    if partition_log is None:
        result.log_end_offset = result.high_watermark = NO_OFFSET
    else:
        result.log_end_offset = partition_log.log_end_offset
        result.high_watermark = partition_log.high_watermark


def _fill_offsets(result: log_pb2.PartitionReadResult, partition_log: PartitionLog | None) -> None:
    """Offsets of a failed read: the replica's own when it exists (they tell a reader whose
    offset is out of range where the log is), else unknown (-1)."""
    if partition_log is None:
        result.high_watermark = result.last_stable_offset = NO_OFFSET
        result.log_start_offset = result.log_end_offset = NO_OFFSET
        return
    result.high_watermark = result.last_stable_offset = partition_log.high_watermark
    result.log_start_offset = partition_log.log_start_offset
    result.log_end_offset = partition_log.log_end_offset


def _describe(state: log_pb2.PartitionState, partition_log: PartitionLog) -> None:
    state.topic = partition_log.topic
    state.partition = partition_log.partition
    state.log_start_offset = partition_log.log_start_offset
    state.log_end_offset = partition_log.log_end_offset
    state.high_watermark = partition_log.high_watermark
    state.size_bytes = partition_log.size_bytes
    state.segments = partition_log.segment_count
    state.leader_epoch = partition_log.state.leader_epoch
    state.role = _ROLE_VALUES[partition_log.state.role]
    state.latest_log_epoch = partition_log.leader_epochs.latest_epoch
