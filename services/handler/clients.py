"""The handler's gRPC clients: the interfaces of ``collaborators.py`` over the replicator, log
node and purgatory stubs, and the mapping of failed calls onto their errors.

Channels are created once and kept: one to the replicator, one to the purgatory and one per
log node address (log nodes come and go with the metadata). Failed calls become
:class:`~.collaborators.UnreachableError` when the peer could not be reached at all (nothing
happened) and :class:`~.collaborators.OutcomeUnknownError` otherwise. The replicator's metadata is
turned into the cache's domain snapshot here.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import grpc

from kbroker.log.v1 import log_pb2, log_pb2_grpc
from kbroker.purgatory.v1 import purgatory_pb2, purgatory_pb2_grpc
from kbroker.replicator.v1 import replicator_pb2, replicator_pb2_grpc
from services.common import payloads
from services.common.acls import AclBinding
from services.common.call_streams import CallStream
from services.common.channels import PLAINTEXT, internal_channel
from services.common.envelopes import APPEND_BATCHES
from services.common.outages import OutageLog
from services.common.payloads import MaybePayload, PayloadPath
from services.common.tls import InternalTls

from .collaborators import CallError, OutcomeUnknownError, UnreachableError
from .metadata_cache import (
    ClusterMetadata,
    LogNode,
    PartitionInfo,
    QuotaEntity,
    ScramCredentialInfo,
    TopicInfo,
)
from .metrics import PURGATORY_WAIT_SECONDS, PURGATORY_WAITS
from .topic_identity import canonical_topic_id

log = logging.getLogger(__name__)

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


async def _call(method: Any, request: Any, time_limit: float, peer: str, *,
                wait_for_ready: bool = False) -> Any:
    try:
        return await method(request, timeout=time_limit, wait_for_ready=wait_for_ready)
    except grpc.aio.AioRpcError as exc:
        raise call_failure(exc, peer) from exc


async def _follow(call: Any, peer: str) -> AsyncIterator[Any]:
    """The messages of a server stream ``call``, until it ends or breaks (a CallError)."""
    try:
        async for message in call:
            yield message
    except grpc.aio.AioRpcError as exc:
        raise call_failure(exc, peer) from exc
    finally:
        call.cancel()


# --- replicator --------------------------------------------------------------------------------


def metadata_from_proto(message: replicator_pb2.ClusterMetadata) -> ClusterMetadata:
    """The cache's snapshot of the replicator's metadata (ids canonical, empty racks none;
    of SCRAM credentials only mechanisms and iterations)."""
    scram: dict[str, list[ScramCredentialInfo]] = {}
    for credential in message.scram_credentials:
        scram.setdefault(credential.user, []).append(ScramCredentialInfo(
            mechanism=credential.mechanism, iterations=credential.iterations))
    quotas: dict[QuotaEntity, dict[str, float]] = {}
    for quota in message.client_quotas:
        entity = tuple(sorted((p.entity_type, None if p.is_default else p.name)
                              for p in quota.entity))
        quotas[entity] = dict(quota.values)
    return ClusterMetadata(
        version=message.version, cluster_id=message.cluster_id,
        controller_id=message.controller_id,
        log_nodes=[LogNode(node_id=n.node_id, address=n.address, rack=n.rack or None,
                           alive=n.alive, fenced=n.fenced) for n in message.log_nodes],
        topics=[TopicInfo(
            name=t.name, topic_id=canonical_topic_id(t.topic_id), internal=t.internal,
            configs=dict(t.configs), partitions={p.partition: PartitionInfo(
                partition=p.partition, leader=p.leader, leader_epoch=p.leader_epoch,
                replicas=tuple(p.replicas), isr=tuple(p.isr),
                offline_replicas=tuple(p.offline_replicas),
                adding_replicas=tuple(p.adding_replicas),
                removing_replicas=tuple(p.removing_replicas)) for p in t.partitions})
            for t in message.topics],
        acls=[AclBinding.from_pb(b) for b in message.acls],
        scram_credentials=scram, client_quotas=quotas,
        config_resources={(r.resource_type, r.name): dict(r.configs)
                          for r in message.config_resources})


class ReplicatorClient:
    """The replicator as the handler's :class:`~.collaborators.Controller` and metadata
    source."""

    def __init__(self, address: str, tls: InternalTls = PLAINTEXT) -> None:
        self._address = address
        self._channel = internal_channel(address, tls, "replicator")
        self._stub = replicator_pb2_grpc.ReplicatorStub(self._channel)

    async def _change(self, method: Any, request: Any, time_limit: float) -> Any:
        """A change of the cluster metadata: while the replicator is unreachable (restarting,
        or a standby taking over) it waits for it, up to ``time_limit``, as Kafka's brokers
        hold requests they forward to the controller, rather than failing at once."""
        return await _call(method, request, time_limit, self._address, wait_for_ready=True)

    async def load_metadata(self) -> ClusterMetadata:
        message = await _call(self._stub.GetMetadata, replicator_pb2.GetMetadataRequest(),
                              METADATA_TIMEOUT_S, self._address)
        return metadata_from_proto(message)

    async def watch(self) -> AsyncIterator[ClusterMetadata]:
        """The replicator's metadata stream; ends or raises when the stream breaks."""
        call = self._stub.WatchMetadata(replicator_pb2.WatchMetadataRequest())
        async for message in _follow(call, self._address):
            yield metadata_from_proto(message)

    async def create_topics(self, request: replicator_pb2.CreateTopicsRequest,
                            time_limit: float) -> replicator_pb2.CreateTopicsResponse:
        return await self._change(self._stub.CreateTopics, request, time_limit)

    async def delete_topics(self, request: replicator_pb2.DeleteTopicsRequest,
                            time_limit: float) -> replicator_pb2.DeleteTopicsResponse:
        return await self._change(self._stub.DeleteTopics, request, time_limit)

    async def alter_topic_configs(self, request: replicator_pb2.AlterTopicConfigsRequest,
                                  time_limit: float) -> replicator_pb2.AlterTopicConfigsResponse:
        return await self._change(self._stub.AlterTopicConfigs, request, time_limit)

    async def create_partitions(self, request: replicator_pb2.CreatePartitionsRequest,
                                time_limit: float) -> replicator_pb2.CreatePartitionsResponse:
        return await self._change(self._stub.CreatePartitions, request, time_limit)

    async def elect_leaders(self, request: replicator_pb2.ElectLeadersRequest,
                            time_limit: float) -> replicator_pb2.ElectLeadersResponse:
        return await self._change(self._stub.ElectLeaders, request, time_limit)

    async def alter_config_resources(
            self, request: replicator_pb2.AlterConfigResourcesRequest, time_limit: float,
    ) -> replicator_pb2.AlterConfigResourcesResponse:
        return await self._change(self._stub.AlterConfigResources, request, time_limit)

    async def alter_partition_reassignments(
            self, request: replicator_pb2.AlterPartitionReassignmentsRequest, time_limit: float,
    ) -> replicator_pb2.AlterPartitionReassignmentsResponse:
        return await self._change(self._stub.AlterPartitionReassignments, request, time_limit)

    async def allocate_producer_ids(self, request: replicator_pb2.AllocateProducerIdsRequest,
                                    time_limit: float,
                                    ) -> replicator_pb2.AllocateProducerIdsResponse:
        return await self._change(self._stub.AllocateProducerIds, request, time_limit)

    async def create_acls(self, request: replicator_pb2.CreateAclsRequest,
                          time_limit: float) -> replicator_pb2.CreateAclsResponse:
        return await self._change(self._stub.CreateAcls, request, time_limit)

    async def delete_acls(self, request: replicator_pb2.DeleteAclsRequest,
                          time_limit: float) -> replicator_pb2.DeleteAclsResponse:
        return await self._change(self._stub.DeleteAcls, request, time_limit)

    async def alter_scram_credentials(
        self, request: replicator_pb2.AlterScramCredentialsRequest, time_limit: float,
    ) -> replicator_pb2.AlterScramCredentialsResponse:
        return await self._change(self._stub.AlterScramCredentials, request, time_limit)

    async def alter_client_quotas(self, request: replicator_pb2.AlterClientQuotasRequest,
                                  time_limit: float) -> replicator_pb2.AlterClientQuotasResponse:
        return await self._change(self._stub.AlterClientQuotas, request, time_limit)

    async def close(self) -> None:
        await self._channel.close()


# --- log nodes ---------------------------------------------------------------------------------

# Appends and reads carry their record batches beside protobuf (services.common.payloads):
# written around them on the way to the log node, read as views of what it answers.
_APPEND_RECORDS = PayloadPath(log_pb2.AppendStreamRequest.DESCRIPTOR, "request.partitions.records")
_READ_RECORDS = PayloadPath(log_pb2.ReadResponse.DESCRIPTOR, "results.records")
_LOG_SERVICE = log_pb2.DESCRIPTOR.services_by_name["LogService"].full_name
_APPEND_STREAM_METHOD = f"/{_LOG_SERVICE}/AppendStream"
_READ_METHOD = f"/{_LOG_SERVICE}/Read"


def _encode_append(call: tuple[log_pb2.AppendRequest, list[MaybePayload] | None],
                   call_id: int) -> bytes:
    request, records = call
    message = log_pb2.AppendStreamRequest(call_id=call_id, request=request)
    if records is None:  # the batches are in the request
        return message.SerializeToString()
    return payloads.Detached(message, _APPEND_RECORDS, records).SerializeToString()


def _decode_append(data: bytes) -> tuple[int, log_pb2.AppendStreamResponse]:
    answer = log_pb2.AppendStreamResponse.FromString(data)
    return answer.call_id, answer


class PartitionRead:
    """One partition's result of a Read, its record batches (``records``) a view of the
    answer received: every field of ``log_pb2.PartitionReadResult``."""

    __slots__ = ("_result", "records")

    def __init__(self, result: log_pb2.PartitionReadResult, records: memoryview | None) -> None:
        self._result = result
        self.records = b"" if records is None else records

    def __getattr__(self, name: str) -> Any:
        return getattr(self._result, name)


class ReadAnswer:
    """A Read's answer, as ``log_pb2.ReadResponse`` reads: its results :class:`PartitionRead`
    (the batches views of the answer), or those of the response itself when it was small
    enough to parse whole (:func:`services.common.payloads.parse_message`)."""

    __slots__ = ("results",)

    def __init__(self, data: bytes) -> None:
        response, records = payloads.parse_message(data, log_pb2.ReadResponse, _READ_RECORDS)
        if records is None:  # a small answer, parsed whole: its batches are in it
            self.results = response.results
        else:
            self.results = [PartitionRead(result, batches)
                            for result, batches in zip(response.results, records, strict=True)]


class LogNodeClients:
    """Every log node the handler has talked to, one long-lived channel per address."""

    def __init__(self, tls: InternalTls = PLAINTEXT) -> None:
        self._tls = tls
        # Per address: the channel, its stub, and Read answering a ReadAnswer.
        self._stubs: dict[str, tuple[grpc.aio.Channel, log_pb2_grpc.LogServiceStub, Any]] = {}
        self._append_streams: dict[str, CallStream] = {}
        self._closing: set[asyncio.Task[None]] = set()

    def _entry(self, node: LogNode) -> tuple[grpc.aio.Channel, log_pb2_grpc.LogServiceStub, Any]:
        entry = self._stubs.get(node.address)
        if entry is None:
            channel = internal_channel(node.address, self._tls, "log")
            read = channel.unary_unary(
                _READ_METHOD, request_serializer=log_pb2.ReadRequest.SerializeToString,
                response_deserializer=ReadAnswer)
            entry = (channel, log_pb2_grpc.LogServiceStub(channel), read)
            self._stubs[node.address] = entry
        return entry

    def _channel(self, node: LogNode) -> grpc.aio.Channel:
        return self._entry(node)[0]

    def _stub(self, node: LogNode) -> log_pb2_grpc.LogServiceStub:
        return self._entry(node)[1]

    def _append_stream(self, node: LogNode) -> CallStream:
        """Appends go over one long-lived stream per log node (see :mod:`.call_streams`),
        written by hand around their record batches."""
        stream = self._append_streams.get(node.address)
        if stream is None:
            peer = _peer(node)
            stream = CallStream(
                self._channel(node).stream_stream(_APPEND_STREAM_METHOD),
                lambda code, details: status_failure(code, details, peer),
                encode=_encode_append, decode=_decode_append,
                not_sent=lambda code, details: UnreachableError(
                    f"{peer}: {code.name}: {details} (the append was not sent)"),
                batches=APPEND_BATCHES, name="append")
            self._append_streams[node.address] = stream
        return stream

    async def append(self, node: LogNode, request: log_pb2.AppendRequest,
                     time_limit: float, records: list[MaybePayload] | None = None,
                     ) -> log_pb2.AppendResponse:
        answer = await self._append_stream(node).call((request, records), time_limit)
        return answer.response

    async def read(self, node: LogNode, request: log_pb2.ReadRequest,
                   time_limit: float) -> ReadAnswer:
        return await _call(self._entry(node)[2], request, time_limit, _peer(node))

    async def list_offsets(self, node: LogNode, request: log_pb2.ListOffsetsRequest,
                           time_limit: float) -> log_pb2.ListOffsetsResponse:
        return await _call(self._stub(node).ListOffsets, request, time_limit, _peer(node))

    async def delete_records(self, node: LogNode, request: log_pb2.DeleteRecordsRequest,
                             time_limit: float) -> log_pb2.DeleteRecordsResponse:
        return await _call(self._stub(node).DeleteRecords, request, time_limit, _peer(node))

    async def offset_for_leader_epoch(self, node: LogNode,
                                      request: log_pb2.OffsetForLeaderEpochRequest,
                                      time_limit: float,
                                      ) -> log_pb2.OffsetForLeaderEpochResponse:
        return await _call(self._stub(node).OffsetForLeaderEpoch, request, time_limit,
                           _peer(node))

    async def write_txn_markers(self, node: LogNode, request: log_pb2.WriteTxnMarkersRequest,
                                time_limit: float) -> log_pb2.WriteTxnMarkersResponse:
        return await _call(self._stub(node).WriteTxnMarkers, request, time_limit, _peer(node))

    async def describe_producers(self, node: LogNode, request: log_pb2.DescribeProducersRequest,
                                 time_limit: float) -> log_pb2.DescribeProducersResponse:
        return await _call(self._stub(node).DescribeProducers, request, time_limit, _peer(node))

    async def describe_log_dir(self, node: LogNode, request: log_pb2.DescribeLogDirRequest,
                               time_limit: float) -> log_pb2.LogDirDescription:
        return await _call(self._stub(node).DescribeLogDir, request, time_limit, _peer(node))

    def on_metadata(self, snapshot: ClusterMetadata) -> None:
        """Metadata listener: close the channels of addresses no log node has any more (a
        node moved or left); calls still running on them fail as calls to a vanished node
        would."""
        addresses = {node.address for node in snapshot.log_nodes.values()}
        for address in [a for a in self._stubs if a not in addresses]:
            channel = self._stubs.pop(address)[0]
            stream = self._append_streams.pop(address, None)
            task = asyncio.get_running_loop().create_task(_close_channel(channel, stream))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        channels = [entry[0] for entry in self._stubs.values()]
        streams = list(self._append_streams.values())
        self._stubs.clear()
        self._append_streams.clear()
        for stream in streams:
            await stream.close()
        for channel in channels:
            await channel.close()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)


async def _close_channel(channel: grpc.aio.Channel, stream: CallStream | None) -> None:
    if stream is not None:
        await stream.close()
    await channel.close()


def _peer(node: LogNode) -> str:
    return f"log node {node.node_id} at {node.address}"


# --- purgatory ---------------------------------------------------------------------------------

# Metric labels of the operation kinds: "fetch", "produce", "join".
_KIND_LABELS = {value: name.removeprefix("OPERATION_KIND_").lower()
                for name, value in purgatory_pb2.OperationKind.items()}
_STATUS_CODES = {code.value[0]: code for code in grpc.StatusCode}
# Session timer calls are quick; a purgatory that does not answer in this time is down.
SESSION_TIMER_TIMEOUT_S = 5.0


class PurgatoryClient:
    """The purgatory as the handler's :class:`~.collaborators.Purgatory`."""

    def __init__(self, address: str, tls: InternalTls = PLAINTEXT) -> None:
        self._address = address
        self._channel = internal_channel(address, tls, "purgatory")
        self._stub = purgatory_pb2_grpc.PurgatoryStub(self._channel)
        # Its callers answer or retry each failure quietly: the outage is logged here, once.
        self._outages = OutageLog(log, f"the purgatory at {address}")
        # Produce waits, one per acks=all request, share one stream (see :meth:`wait`).
        self._await_stream = CallStream(
            self._stub.AwaitStream,
            lambda code, details: status_failure(code, details, address),
            not_sent=lambda code, details: UnreachableError(
                f"{address}: {code.name}: {details} (the wait was not sent)"), name="await")

    async def _call(self, method: Any, request: Any, time_limit: float) -> Any:
        try:
            answer = await _call(method, request, time_limit, self._address)
        except CallError as exc:
            self._outages.failed(exc)
            raise
        self._outages.succeeded()
        return answer

    async def wait(self, kind: purgatory_pb2.OperationKind.ValueType,
                   thresholds: Mapping[str, int], require_all: bool,
                   timeout_ms: int) -> purgatory_pb2.AwaitResponse:
        request = purgatory_pb2.AwaitRequest(
            kind=kind, require_all=require_all, timeout_ms=timeout_ms,
            keys=[purgatory_pb2.WatchedKey(key=k, threshold=t) for k, t in thresholds.items()])
        started = time.perf_counter()
        outcome = "unavailable"
        time_limit = timeout_ms / 1000 + PURGATORY_GRACE_S
        try:
            if kind == purgatory_pb2.OPERATION_KIND_PRODUCE:
                response = await self._await_on_stream(request, time_limit)
            else:
                response = await self._call(self._stub.Await, request, time_limit)
            completed = response.outcome == purgatory_pb2.OUTCOME_COMPLETED
            outcome = "completed" if completed else "expired"
            return response
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        finally:
            PURGATORY_WAITS.labels(_KIND_LABELS[kind], outcome).inc()
            PURGATORY_WAIT_SECONDS.labels(_KIND_LABELS[kind]).observe(
                time.perf_counter() - started)

    async def _await_on_stream(self, request: purgatory_pb2.AwaitRequest,
                               time_limit: float) -> purgatory_pb2.AwaitResponse:
        """A produce wait on the stream of waits: no new HTTP/2 stream and server task per
        acks=all request. Only produce waits go there: their callers wait for the outcome
        whatever happens, while a fetch or join wait is abandoned (its consumer or member left)
        and cancelling its unary call takes the operation off the purgatory at once; one
        abandoned on the stream would stay parked until its timeout."""
        try:
            answer = await self._await_stream.call(
                purgatory_pb2.AwaitStreamRequest(request=request), time_limit)
            if answer.status_code:
                raise status_failure(_STATUS_CODES.get(answer.status_code, grpc.StatusCode.UNKNOWN),
                                     answer.status_details, self._address)
        except CallError as exc:
            self._outages.failed(exc)
            raise
        self._outages.succeeded()
        return answer.response

    async def complete(self, positions: Mapping[str, int]) -> None:
        request = purgatory_pb2.CheckAndCompleteRequest(keys=[
            purgatory_pb2.KeyState(key=key, position=position)
            for key, position in positions.items()])
        await self._call(self._stub.CheckAndComplete, request, SESSION_TIMER_TIMEOUT_S)

    async def schedule(self, deadlines: Mapping[str, int]) -> None:
        request = purgatory_pb2.ScheduleRequest(deadlines=[
            purgatory_pb2.Deadline(key=key, timeout_ms=timeout)
            for key, timeout in deadlines.items()])
        await self._call(self._stub.Schedule, request, SESSION_TIMER_TIMEOUT_S)

    async def unschedule(self, keys: Sequence[str]) -> None:
        await self._call(self._stub.Unschedule, purgatory_pb2.UnscheduleRequest(keys=list(keys)),
                         SESSION_TIMER_TIMEOUT_S)

    async def armed(self, keys: Sequence[str]) -> set[str]:
        response = await self._call(self._stub.Armed, purgatory_pb2.ArmedRequest(keys=list(keys)),
                                    SESSION_TIMER_TIMEOUT_S)
        return set(response.keys)

    async def watch_expirations(self) -> AsyncIterator[list[str]]:
        call = self._stub.WatchExpirations(purgatory_pb2.WatchExpirationsRequest())
        try:
            async for message in _follow(call, self._address):
                self._outages.succeeded()
                yield list(message.keys)
        except CallError as exc:
            self._outages.failed(exc)
            raise

    async def close(self) -> None:
        await self._await_stream.close()
        await self._channel.close()
