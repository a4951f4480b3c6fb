"""The handler's gRPC clients: the collaborator interfaces of ``collaborators.py`` over the
replicator, log node and purgatory contracts.

Channels are created once and kept: one to the replicator, one to the purgatory and one per
log node address (log nodes come and go with the metadata). Failed calls become
:class:`~.collaborators.UnreachableError` when the peer could not be reached at all (nothing
happened) and :class:`~.collaborators.OutcomeUnknownError` otherwise. The replicator's metadata is
turned into the cache's domain snapshot here.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import grpc

from kbroker.log.v1 import log_pb2, log_pb2_grpc
from kbroker.purgatory.v1 import purgatory_pb2, purgatory_pb2_grpc
from kbroker.replicator.v1 import replicator_pb2, replicator_pb2_grpc
from services.common.call_streams import CallStream
from services.common.channels import insecure_channel
from services.common.errors import error_name

from .collaborators import (
    AppendResult,
    CallError,
    EpochEndOffset,
    EpochQuery,
    KeyState,
    LowWatermark,
    NewTopic,
    OffsetQuery,
    OffsetResult,
    OutcomeUnknownError,
    PartitionAppend,
    PartitionIncrease,
    PartitionRead,
    ProducerIdBlock,
    ReadLimit,
    ReadResult,
    RecordDeletion,
    TopicConfigChanges,
    TopicResult,
    UnreachableError,
    WaitKind,
    WaitResult,
)
from .metadata_cache import ClusterMetadata, LogNode, PartitionInfo, TopicInfo
from .metrics import PURGATORY_WAIT_SECONDS, PURGATORY_WAITS
from .topic_identity import canonical_topic_id

# Words gRPC uses when a connection could not be established (so the call was never sent).
_CONNECT_FAILURES = (
    "failed to connect",
    "connections to all backends failing",
    "connection refused",
    "dns resolution failed",
    "name resolution",
    "no route to host",
    "connect failed",
)
# Extra time a purgatory wait may take beyond its own timeout before the call is abandoned.
PURGATORY_GRACE_S = 5.0
METADATA_TIMEOUT_S = 10.0


def call_failure(error: grpc.aio.AioRpcError, peer: str) -> CallError:
    """The domain failure for a failed call: whether the call can have had an effect."""
    return status_failure(error.code(), error.details() or "", peer)


def status_failure(code: grpc.StatusCode, details: str, peer: str) -> CallError:
    """:func:`call_failure` from a status code and its details."""
    message = f"{peer}: {code.name}: {details}"
    if code == grpc.StatusCode.UNAVAILABLE and any(
        marker in details.lower() for marker in _CONNECT_FAILURES
    ):
        return UnreachableError(message)
    return OutcomeUnknownError(message)


async def _call(method: Any, request: Any, time_limit: float, peer: str) -> Any:
    try:
        return await method(request, timeout=time_limit)
    except grpc.aio.AioRpcError as exc:
        raise call_failure(exc, peer) from exc


# --- replicator --------------------------------------------------------------------------------


def metadata_from_proto(message: replicator_pb2.ClusterMetadata) -> ClusterMetadata:
    return ClusterMetadata(
        version=message.version,
        cluster_id=message.cluster_id,
        controller_id=message.controller_id,
        log_nodes=[
            LogNode(node_id=n.node_id, address=n.address, rack=n.rack or None, alive=n.alive)
            for n in message.log_nodes
        ],
        topics=[
            TopicInfo(
                name=t.name,
                topic_id=canonical_topic_id(t.topic_id),
                internal=t.internal,
                configs=dict(t.configs),
                partitions={
                    p.partition: PartitionInfo(
                        partition=p.partition,
                        leader=p.leader,
                        leader_epoch=p.leader_epoch,
                        replicas=tuple(p.replicas),
                        isr=tuple(p.isr),
                        offline_replicas=tuple(p.offline_replicas),
                    )
                    for p in t.partitions
                },
            )
            for t in message.topics
        ],
    )


def _topic_result(r: replicator_pb2.TopicResult) -> TopicResult:
    return TopicResult(
        name=r.name,
        topic_id=r.topic_id or None,
        error_code=r.error_code,
        error_message=r.error_message or None,
        num_partitions=r.num_partitions,
        replication_factor=r.replication_factor,
        configs=dict(r.configs),
    )


class ReplicatorClient:
    """The replicator as the handler's :class:`~.collaborators.Controller` and metadata
    source."""

    def __init__(self, address: str) -> None:
        self._address = address
        self._channel = insecure_channel(address)
        self._stub = replicator_pb2_grpc.ReplicatorStub(self._channel)

    async def load_metadata(self) -> ClusterMetadata:
        message = await _call(self._stub.GetMetadata, replicator_pb2.GetMetadataRequest(),
                              METADATA_TIMEOUT_S, self._address)
        return metadata_from_proto(message)

    async def watch(self) -> AsyncIterator[ClusterMetadata]:
        """The replicator's metadata stream; ends or raises when the stream breaks."""
        call = self._stub.WatchMetadata(replicator_pb2.WatchMetadataRequest())
        try:
            async for message in call:
                yield metadata_from_proto(message)
        except grpc.aio.AioRpcError as exc:
            raise call_failure(exc, self._address) from exc
        finally:
            call.cancel()

    async def create_topics(
        self, topics: Sequence[NewTopic], validate_only: bool, time_limit: float
    ) -> list[TopicResult]:
        request = replicator_pb2.CreateTopicsRequest(
            validate_only=validate_only,
            topics=[
                replicator_pb2.NewTopic(
                    name=t.name,
                    num_partitions=t.num_partitions,
                    replication_factor=t.replication_factor,
                    configs=dict(t.configs),
                    assignments={
                        index: replicator_pb2.Replicas(node_ids=list(nodes))
                        for index, nodes in t.assignments.items()
                    },
                )
                for t in topics
            ],
        )
        response = await _call(self._stub.CreateTopics, request, time_limit, self._address)
        return [_topic_result(r) for r in response.topics]

    async def delete_topics(
        self, names: Sequence[str], topic_ids: Sequence[str], time_limit: float
    ) -> list[TopicResult]:
        request = replicator_pb2.DeleteTopicsRequest(names=list(names), topic_ids=list(topic_ids))
        response = await _call(self._stub.DeleteTopics, request, time_limit, self._address)
        return [_topic_result(r) for r in response.topics]

    async def alter_topic_configs(
        self, topics: Sequence[TopicConfigChanges], validate_only: bool, time_limit: float
    ) -> list[TopicResult]:
        request = replicator_pb2.AlterTopicConfigsRequest(
            validate_only=validate_only,
            topics=[
                replicator_pb2.TopicConfigChanges(
                    topic=t.topic,
                    replace=t.replace,
                    changes=[replicator_pb2.ConfigChange(name=name, operation=int(op),
                                                         value=value)
                             for name, op, value in t.changes],
                )
                for t in topics
            ],
        )
        response = await _call(self._stub.AlterTopicConfigs, request, time_limit, self._address)
        return [_topic_result(r) for r in response.topics]

    async def create_partitions(
        self, topics: Sequence[PartitionIncrease], validate_only: bool, time_limit: float
    ) -> list[TopicResult]:
        request = replicator_pb2.CreatePartitionsRequest(
            validate_only=validate_only,
            topics=[
                replicator_pb2.PartitionIncrease(
                    topic=t.topic, count=t.count,
                    assignments=[replicator_pb2.Replicas(node_ids=list(a))
                                 for a in t.assignments],
                )
                for t in topics
            ],
        )
        response = await _call(self._stub.CreatePartitions, request, time_limit, self._address)
        return [_topic_result(r) for r in response.topics]

    async def allocate_producer_ids(self, requester: str, time_limit: float) -> ProducerIdBlock:
        response = await _call(
            self._stub.AllocateProducerIds,
            replicator_pb2.AllocateProducerIdsRequest(requester=requester),
            time_limit, self._address)
        if response.error_code or response.producer_id_len <= 0:
            raise CallError(f"{self._address}: no producer ids: "
                            f"{error_name(response.error_code)} {response.error_message}")
        return ProducerIdBlock(first_id=response.producer_id_start,
                               size=response.producer_id_len)

    async def close(self) -> None:
        await self._channel.close()


# --- log nodes ---------------------------------------------------------------------------------


class LogNodeClients:
    """Every log node the handler has talked to, one long-lived channel per address."""

    def __init__(self) -> None:
        self._stubs: dict[str, tuple[grpc.aio.Channel, log_pb2_grpc.LogServiceStub]] = {}
        self._append_streams: dict[str, CallStream] = {}
        self._closing: set[asyncio.Task[None]] = set()

    @property
    def addresses(self) -> set[str]:
        """Addresses with an open channel."""
        return set(self._stubs)

    def _stub(self, node: LogNode) -> log_pb2_grpc.LogServiceStub:
        entry = self._stubs.get(node.address)
        if entry is None:
            channel = insecure_channel(node.address)
            entry = (channel, log_pb2_grpc.LogServiceStub(channel))
            self._stubs[node.address] = entry
        return entry[1]

    def _append_stream(self, node: LogNode) -> CallStream:
        """Appends go over one long-lived stream per log node (see :mod:`.call_streams`)."""
        stream = self._append_streams.get(node.address)
        if stream is None:
            peer = _peer(node)
            stream = CallStream(self._stub(node).AppendStream,
                                lambda code, details: status_failure(code, details, peer))
            self._append_streams[node.address] = stream
        return stream

    async def append(
        self, node: LogNode, appends: Sequence[PartitionAppend], time_limit: float
    ) -> list[AppendResult]:
        message = log_pb2.AppendStreamRequest()
        for a in appends:
            message.request.partitions.add(topic=a.topic, partition=a.partition,
                                           records=a.records)
        answer = await self._append_stream(node).call(message, time_limit)
        return [_append_result(r) for r in answer.response.results]

    async def append_if_end(
        self, node: LogNode, append: PartitionAppend, expected_log_end_offset: int,
        time_limit: float,
    ) -> AppendResult:
        """Append only if the partition's log end offset is still ``expected_log_end_offset``
        (else INVALID_UPDATE_VERSION): a compare-and-set on the log."""
        message = log_pb2.AppendStreamRequest()
        message.request.partitions.add(
            topic=append.topic, partition=append.partition, records=append.records,
            expected_log_end_offset=expected_log_end_offset)
        answer = await self._append_stream(node).call(message, time_limit)
        return _append_result(answer.response.results[0])

    async def read(
        self,
        node: LogNode,
        reads: Sequence[PartitionRead],
        max_bytes: int,
        limit: ReadLimit,
        time_limit: float,
    ) -> list[ReadResult]:
        request = log_pb2.ReadRequest(
            partitions=[
                log_pb2.PartitionRead(topic=r.topic, partition=r.partition, offset=r.offset,
                                      max_bytes=r.max_bytes)
                for r in reads
            ],
            max_bytes=max_bytes,
            limit=int(limit),
        )
        response = await _call(self._stub(node).Read, request, time_limit, _peer(node))
        return [
            ReadResult(
                topic=r.topic,
                partition=r.partition,
                error_code=r.error_code,
                error_message=r.error_message or None,
                records=r.records,
                high_watermark=r.high_watermark,
                log_start_offset=r.log_start_offset,
                log_end_offset=r.log_end_offset,
            )
            for r in response.results
        ]

    async def list_offsets(
        self, node: LogNode, queries: Sequence[OffsetQuery], limit: ReadLimit, time_limit: float
    ) -> list[OffsetResult]:
        request = log_pb2.ListOffsetsRequest(
            partitions=[
                log_pb2.PartitionTimestamp(topic=q.topic, partition=q.partition,
                                           timestamp=q.timestamp)
                for q in queries
            ],
            limit=int(limit),
        )
        response = await _call(self._stub(node).ListOffsets, request, time_limit, _peer(node))
        return [
            OffsetResult(
                topic=r.topic,
                partition=r.partition,
                error_code=r.error_code,
                offset=r.offset,
                timestamp=r.timestamp,
                leader_epoch=r.leader_epoch,
            )
            for r in response.results
        ]

    async def delete_records(
        self, node: LogNode, deletions: Sequence[RecordDeletion], time_limit: float
    ) -> list[LowWatermark]:
        request = log_pb2.DeleteRecordsRequest(partitions=[
            log_pb2.PartitionDeleteRecords(topic=d.topic, partition=d.partition, offset=d.offset)
            for d in deletions
        ])
        response = await _call(self._stub(node).DeleteRecords, request, time_limit, _peer(node))
        return [
            LowWatermark(topic=r.topic, partition=r.partition, error_code=r.error_code,
                         low_watermark=r.low_watermark)
            for r in response.results
        ]

    async def end_offsets_for_epochs(
        self, node: LogNode, queries: Sequence[EpochQuery], time_limit: float
    ) -> list[EpochEndOffset]:
        request = log_pb2.OffsetForLeaderEpochRequest(partitions=[
            log_pb2.PartitionLeaderEpoch(topic=q.topic, partition=q.partition,
                                         leader_epoch=q.leader_epoch)
            for q in queries
        ])
        response = await _call(self._stub(node).OffsetForLeaderEpoch, request, time_limit,
                               _peer(node))
        return [
            EpochEndOffset(topic=r.topic, partition=r.partition, error_code=r.error_code,
                           leader_epoch=r.leader_epoch, end_offset=r.end_offset)
            for r in response.results
        ]

    def retain(self, addresses: set[str]) -> None:
        """Close the channels of addresses no log node has any more (a node moved or left);
        calls still running on them fail as calls to a vanished node would."""
        for address in [a for a in self._stubs if a not in addresses]:
            channel, _ = self._stubs.pop(address)
            stream = self._append_streams.pop(address, None)
            task = asyncio.get_running_loop().create_task(
                _close_channel(channel, stream))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    def on_metadata(self, snapshot: ClusterMetadata) -> None:
        """Metadata listener: keep channels only for the log nodes the cluster has."""
        self.retain({node.address for node in snapshot.log_nodes.values()})

    async def close(self) -> None:
        channels = [channel for channel, _ in self._stubs.values()]
        streams = list(self._append_streams.values())
        self._stubs.clear()
        self._append_streams.clear()
        for stream in streams:
            await stream.close()
        for channel in channels:
            await channel.close()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)


def _append_result(r: log_pb2.PartitionAppendResult) -> AppendResult:
    return AppendResult(
        topic=r.topic,
        partition=r.partition,
        error_code=r.error_code,
        error_message=r.error_message or None,
        base_offset=r.base_offset,
        log_append_time_ms=r.log_append_time_ms,
        log_start_offset=r.log_start_offset,
        log_end_offset=r.log_end_offset,
        high_watermark=r.high_watermark,
        leader_epoch=r.leader_epoch,
    )


async def _close_channel(channel: grpc.aio.Channel, stream: CallStream | None) -> None:
    if stream is not None:
        await stream.close()
    await channel.close()


def _peer(node: LogNode) -> str:
    return f"log node {node.node_id} at {node.address}"


# --- purgatory ---------------------------------------------------------------------------------

_KINDS = {
    WaitKind.FETCH: purgatory_pb2.OPERATION_KIND_FETCH,
    WaitKind.PRODUCE: purgatory_pb2.OPERATION_KIND_PRODUCE,
    WaitKind.JOIN: purgatory_pb2.OPERATION_KIND_JOIN,
}
# Session timer calls are quick; a purgatory that does not answer in this time is down.
SESSION_TIMER_TIMEOUT_S = 5.0


class PurgatoryClient:
    """The purgatory as the handler's :class:`~.collaborators.Purgatory`."""

    def __init__(self, address: str) -> None:
        self._address = address
        self._channel = insecure_channel(address)
        self._stub = purgatory_pb2_grpc.PurgatoryStub(self._channel)

    async def wait(
        self,
        kind: WaitKind,
        thresholds: Mapping[str, int],
        require_all: bool,
        timeout_ms: int,
    ) -> WaitResult:
        request = purgatory_pb2.AwaitRequest(
            kind=_KINDS[kind],
            keys=[purgatory_pb2.WatchedKey(key=k, threshold=t) for k, t in thresholds.items()],
            require_all=require_all,
            timeout_ms=timeout_ms,
        )
        started = time.perf_counter()
        outcome = "unavailable"
        try:
            response = await _call(self._stub.Await, request,
                                   timeout_ms / 1000 + PURGATORY_GRACE_S, self._address)
            completed = response.outcome == purgatory_pb2.OUTCOME_COMPLETED
            outcome = "completed" if completed else "expired"
            return WaitResult(
                completed=completed,
                keys={s.key: KeyState(position=s.position, error_code=s.error_code)
                      for s in response.keys},
            )
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        finally:
            PURGATORY_WAITS.labels(kind.value, outcome).inc()
            PURGATORY_WAIT_SECONDS.labels(kind.value).observe(time.perf_counter() - started)

    async def complete(self, positions: Mapping[str, int]) -> None:
        request = purgatory_pb2.CheckAndCompleteRequest(keys=[
            purgatory_pb2.KeyState(key=key, position=position)
            for key, position in positions.items()])
        await _call(self._stub.CheckAndComplete, request, SESSION_TIMER_TIMEOUT_S,
                    self._address)

    async def schedule(self, deadlines: Mapping[str, int]) -> None:
        request = purgatory_pb2.ScheduleRequest(deadlines=[
            purgatory_pb2.Deadline(key=key, timeout_ms=timeout)
            for key, timeout in deadlines.items()])
        await _call(self._stub.Schedule, request, SESSION_TIMER_TIMEOUT_S, self._address)

    async def unschedule(self, keys: Sequence[str]) -> None:
        await _call(self._stub.Unschedule, purgatory_pb2.UnscheduleRequest(keys=list(keys)),
                    SESSION_TIMER_TIMEOUT_S, self._address)

    async def armed(self, keys: Sequence[str]) -> set[str]:
        response = await _call(self._stub.Armed, purgatory_pb2.ArmedRequest(keys=list(keys)),
                               SESSION_TIMER_TIMEOUT_S, self._address)
        return set(response.keys)

    async def watch_expirations(self) -> AsyncIterator[list[str]]:
        """Expired keys as the purgatory publishes them (see SessionTimers)."""
        call = self._stub.WatchExpirations(purgatory_pb2.WatchExpirationsRequest())
        try:
            async for message in call:
                yield list(message.keys)
        except grpc.aio.AioRpcError as exc:
            raise call_failure(exc, self._address) from exc
        finally:
            call.cancel()

    async def close(self) -> None:
        await self._channel.close()
