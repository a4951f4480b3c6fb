"""A stand-in for the handler service: a real gRPC KafkaHandler (served unary and over the
KafkaHandlerStream the frontend uses) on a port-0 server that answers with simple canned
content and records what it was asked, with knobs to make it block (to kill it mid-request), be
slow, or reset its streams mid-request."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

from kbroker.handler.v1 import kafka_handler_pb2_grpc
from kbroker.kafka.v1 import kafka_pb2 as k
from services.common import payloads
from services.common.file_records import SPOOL_FILE, FileRecordsReader, SpooledRecords
from services.handler.exchange import REQUEST_RECORDS, ExchangeServicer, add_exchange_to_server

TOPIC_ID = "6b1c6ad4-62a2-4c3c-9a64-3e1ea9a0b9f1"

# Batches a frontend left in its spool are read from there, as a leader log node reads them.
_SPOOL = FileRecordsReader(names=SPOOL_FILE)


class _Exchange(ExchangeServicer):
    """The handler's stream, which a handler with ``breaks_streams`` resets (INTERNAL, as gRPC
    reports a stream reset under it) as soon as a call arrives on it, unanswered."""

    def __init__(self, handler: FakeHandler) -> None:
        super().__init__(handler)
        self._handler = handler

    async def Exchange(self, request_iterator, context):
        if not self._handler.breaks_streams:
            return await super().Exchange(request_iterator, context)
        async for _ in request_iterator:
            self._handler.streams_broken += 1
            await context.abort(grpc.StatusCode.INTERNAL, "Internal error from Core")


class FakeHandler(kafka_handler_pb2_grpc.KafkaHandlerServicer):
    """Answers every API; ``block`` names RPCs that never answer (until the server stops)."""

    def __init__(self, name: str = "handler", node_id: int = 1,
                 block: tuple[str, ...] = ()) -> None:
        self.name = name
        self.node_id = node_id
        self.block = set(block)
        self.calls: list[tuple[str, Any, dict[str, str]]] = []
        self.entered = asyncio.Event()  # a blocking RPC was entered
        self.received = asyncio.Event()  # any RPC was entered
        self.in_flight = 0
        self.max_in_flight = 0
        self.delays: dict[str, float] = {}
        self.errors: dict[str, grpc.StatusCode] = {}
        self.produce_errors: dict[str, int] = {}  # topic -> error code for its partitions
        self.next_offset: dict[tuple[str, int], int] = {}
        self.breaks_streams = False
        self.streams_broken = 0
        self.spooled = 0  # payloads that came as ranges of a frontend's spool file
        self.server: grpc.aio.Server | None = None
        self.port = 0

    async def start(self) -> FakeHandler:
        self.server = grpc.aio.server()
        kafka_handler_pb2_grpc.add_KafkaHandlerServicer_to_server(self, self.server)
        add_exchange_to_server(_Exchange(self), self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()
        return self

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(0)
            self.server = None

    def called(self, rpc: str) -> list[Any]:
        return [request for name, request, _ in self.calls if name == rpc]

    async def _enter(self, rpc: str, request: Any, context: grpc.aio.ServicerContext) -> None:
        # Record batches that came over the stream beside the request go back into it, as a
        # handler reads them.
        records = getattr(context, "record_payloads", None)
        if records is not None:
            self.spooled += sum(isinstance(r, SpooledRecords) for r in records)
            payloads.fill(request, REQUEST_RECORDS[rpc], [
                _SPOOL.read(r.path, r.inode, r.position, r.size)
                if isinstance(r, SpooledRecords) else r for r in records])
        self.calls.append((rpc, request, dict(context.invocation_metadata())))
        self.received.set()
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if rpc in self.block:
                self.entered.set()
                await asyncio.Event().wait()
            delay = self.delays.get(rpc)
            if delay:
                await asyncio.sleep(delay)
            if rpc in self.errors:
                await context.abort(self.errors[rpc], f"{self.name} fails {rpc}")
        finally:
            self.in_flight -= 1

    async def Metadata(self, request, context):
        await self._enter("Metadata", request, context)
        metadata = dict(context.invocation_metadata())
        host, _, port = metadata.get("kafka-advertised", "127.0.0.1:9092").rpartition(":")
        names = ["canned"] if request.topics_is_null else [t.name for t in request.topics]
        return k.MetadataResponse(
            brokers=[{"node_id": self.node_id, "host": host, "port": int(port)}],
            cluster_id=self.name, controller_id=self.node_id,
            topics=[{"error_code": 0, "name": name, "topic_id": TOPIC_ID, "is_internal": False,
                     "partitions": [{"error_code": 0, "partition_index": 0,
                                     "leader_id": self.node_id, "leader_epoch": 0,
                                     "replica_nodes": [self.node_id],
                                     "isr_nodes": [self.node_id]}]}
                    for name in names])

    async def Produce(self, request, context):
        await self._enter("Produce", request, context)
        topics = []
        for topic in request.topic_data:
            partitions = []
            for p in topic.partition_data:
                key = (topic.name, p.index)
                base = self.next_offset.get(key, 0)
                self.next_offset[key] = base + 1
                partitions.append({"index": p.index, "base_offset": base, "log_start_offset": 0,
                                   "error_code": self.produce_errors.get(topic.name, 0)})
            topics.append({"name": topic.name, "partition_responses": partitions})
        return k.ProduceResponse(responses=topics)

    async def Fetch(self, request, context):
        await self._enter("Fetch", request, context)
        return k.FetchResponse(responses=[
            {"topic": t.topic, "partitions": [
                {"partition_index": p.partition, "high_watermark": 0, "last_stable_offset": 0,
                 "log_start_offset": 0, "records": b""} for p in t.partitions]}
            for t in request.topics])

    async def ListOffsets(self, request, context):
        await self._enter("ListOffsets", request, context)
        return k.ListOffsetsResponse(topics=[
            {"name": t.name, "partitions": [
                {"partition_index": p.partition_index, "timestamp": -1, "offset": 0,
                 "leader_epoch": 0} for p in t.partitions]}
            for t in request.topics])

    async def CreateTopics(self, request, context):
        await self._enter("CreateTopics", request, context)
        return k.CreateTopicsResponse(topics=[
            {"name": t.name, "error_code": 0, "topic_id": TOPIC_ID,
             "num_partitions": max(t.num_partitions, 1),
             "replication_factor": max(t.replication_factor, 1)}
            for t in request.topics])

    async def DeleteTopics(self, request, context):
        await self._enter("DeleteTopics", request, context)
        names = list(request.topic_names) + [t.name for t in request.topics]
        return k.DeleteTopicsResponse(responses=[{"name": n, "error_code": 0} for n in names])

    async def DeleteRecords(self, request, context):
        await self._enter("DeleteRecords", request, context)
        return k.DeleteRecordsResponse()

    async def DescribeCluster(self, request, context):
        await self._enter("DescribeCluster", request, context)
        metadata = dict(context.invocation_metadata())
        host, _, port = metadata.get("kafka-advertised", "127.0.0.1:9092").rpartition(":")
        return k.DescribeClusterResponse(
            cluster_id=self.name, controller_id=self.node_id,
            brokers=[{"broker_id": self.node_id, "host": host, "port": int(port)}])

    async def DescribeConfigs(self, request, context):
        await self._enter("DescribeConfigs", request, context)
        return k.DescribeConfigsResponse(results=[
            {"error_code": 0, "resource_type": r.resource_type, "resource_name": r.resource_name,
             "configs": [{"name": "retention.ms", "value": "604800000", "read_only": False,
                          "config_source": 5, "is_sensitive": False}]}
            for r in request.resources])

    async def AlterConfigs(self, request, context):
        await self._enter("AlterConfigs", request, context)
        return k.AlterConfigsResponse(responses=[
            {"error_code": 0, "resource_type": r.resource_type, "resource_name": r.resource_name}
            for r in request.resources])

    async def IncrementalAlterConfigs(self, request, context):
        await self._enter("IncrementalAlterConfigs", request, context)
        return k.IncrementalAlterConfigsResponse(responses=[
            {"error_code": 0, "resource_type": r.resource_type, "resource_name": r.resource_name}
            for r in request.resources])

    async def CreatePartitions(self, request, context):
        await self._enter("CreatePartitions", request, context)
        return k.CreatePartitionsResponse(results=[
            {"name": t.name, "error_code": 0} for t in request.topics])

    async def InitProducerId(self, request, context):
        await self._enter("InitProducerId", request, context)
        return k.InitProducerIdResponse(error_code=0, producer_id=1000, producer_epoch=0)

    async def OffsetForLeaderEpoch(self, request, context):
        await self._enter("OffsetForLeaderEpoch", request, context)
        return k.OffsetForLeaderEpochResponse()

    # Group APIs: canned answers of a one-member group led by "member-1".

    async def FindCoordinator(self, request, context):
        await self._enter("FindCoordinator", request, context)
        metadata = dict(context.invocation_metadata())
        host, _, port = metadata.get("kafka-advertised", "127.0.0.1:9092").rpartition(":")
        keys = list(request.coordinator_keys) or [request.key]
        return k.FindCoordinatorResponse(
            error_code=0, node_id=self.node_id, host=host, port=int(port),
            coordinators=[{"key": key, "node_id": self.node_id, "host": host,
                           "port": int(port), "error_code": 0} for key in keys])

    async def JoinGroup(self, request, context):
        await self._enter("JoinGroup", request, context)
        protocol = request.protocols[0] if request.protocols else None
        return k.JoinGroupResponse(
            error_code=0, generation_id=1, protocol_type=request.protocol_type,
            protocol_name=protocol.name if protocol else "", leader="member-1",
            member_id="member-1",
            members=[{"member_id": "member-1", "metadata": protocol.metadata}]
            if protocol else [])

    async def SyncGroup(self, request, context):
        await self._enter("SyncGroup", request, context)
        assignment = next((a.assignment for a in request.assignments), b"")
        return k.SyncGroupResponse(error_code=0, assignment=assignment)

    async def Heartbeat(self, request, context):
        await self._enter("Heartbeat", request, context)
        return k.HeartbeatResponse(error_code=0)

    async def LeaveGroup(self, request, context):
        await self._enter("LeaveGroup", request, context)
        return k.LeaveGroupResponse(error_code=0, members=[
            {"member_id": m.member_id, "error_code": 0} for m in request.members])

    async def OffsetCommit(self, request, context):
        await self._enter("OffsetCommit", request, context)
        return k.OffsetCommitResponse(topics=[
            {"name": t.name, "partitions": [
                {"partition_index": p.partition_index, "error_code": 0} for p in t.partitions]}
            for t in request.topics])

    async def OffsetFetch(self, request, context):
        await self._enter("OffsetFetch", request, context)
        return k.OffsetFetchResponse(error_code=0, topics=[
            {"name": t.name, "partitions": [
                {"partition_index": p, "committed_offset": -1, "metadata": "",
                 "error_code": 0} for p in t.partition_indexes]}
            for t in request.topics])

    async def ListGroups(self, request, context):
        await self._enter("ListGroups", request, context)
        return k.ListGroupsResponse(error_code=0, groups=[
            {"group_id": "canned-group", "protocol_type": "consumer",
             "group_state": "Stable", "group_type": "classic"}])

    async def DescribeGroups(self, request, context):
        await self._enter("DescribeGroups", request, context)
        return k.DescribeGroupsResponse(groups=[
            {"error_code": 0, "group_id": g, "group_state": "Dead", "protocol_type": "",
             "protocol_data": ""} for g in request.groups])

    async def DeleteGroups(self, request, context):
        await self._enter("DeleteGroups", request, context)
        return k.DeleteGroupsResponse(results=[
            {"group_id": g, "error_code": 0} for g in request.groups_names])

    async def ConsumerGroupHeartbeat(self, request, context):
        await self._enter("ConsumerGroupHeartbeat", request, context)
        return k.ConsumerGroupHeartbeatResponse(
            error_code=0, member_id=request.member_id or "member-1", member_epoch=1,
            heartbeat_interval_ms=5000)

    async def ConsumerGroupDescribe(self, request, context):
        await self._enter("ConsumerGroupDescribe", request, context)
        return k.ConsumerGroupDescribeResponse(groups=[
            {"group_id": g, "error_code": 69, "group_state": "Dead", "group_epoch": -1,
             "assignment_epoch": -1, "assignor_name": ""} for g in request.group_ids])

    async def DescribeLogDirs(self, request, context):
        await self._enter("DescribeLogDirs", request, context)
        return k.DescribeLogDirsResponse(error_code=0, results=[
            {"error_code": 0, "log_dir": "/data", "total_bytes": 100, "usable_bytes": 50}])

    async def ElectLeaders(self, request, context):
        await self._enter("ElectLeaders", request, context)
        return k.ElectLeadersResponse(error_code=0, replica_election_results=[
            {"topic": t.topic, "partition_result": [
                {"partition_id": p, "error_code": 0} for p in t.partitions]}
            for t in request.topic_partitions])

    async def AlterPartitionReassignments(self, request, context):
        await self._enter("AlterPartitionReassignments", request, context)
        return k.AlterPartitionReassignmentsResponse(error_code=0, responses=[
            {"name": t.name, "partitions": [
                {"partition_index": p.partition_index, "error_code": 0} for p in t.partitions]}
            for t in request.topics])

    async def ListPartitionReassignments(self, request, context):
        await self._enter("ListPartitionReassignments", request, context)
        return k.ListPartitionReassignmentsResponse(error_code=0)

    async def OffsetDelete(self, request, context):
        await self._enter("OffsetDelete", request, context)
        return k.OffsetDeleteResponse(error_code=0, topics=[
            {"name": t.name, "partitions": [
                {"partition_index": p.partition_index, "error_code": 0} for p in t.partitions]}
            for t in request.topics])

    # Transaction APIs: empty answers (the frontend fills every field with its default).

    async def AddPartitionsToTxn(self, request, context):
        await self._enter("AddPartitionsToTxn", request, context)
        return k.AddPartitionsToTxnResponse()

    async def AddOffsetsToTxn(self, request, context):
        await self._enter("AddOffsetsToTxn", request, context)
        return k.AddOffsetsToTxnResponse(error_code=0)

    async def EndTxn(self, request, context):
        await self._enter("EndTxn", request, context)
        return k.EndTxnResponse(error_code=0)

    async def WriteTxnMarkers(self, request, context):
        await self._enter("WriteTxnMarkers", request, context)
        return k.WriteTxnMarkersResponse()

    async def TxnOffsetCommit(self, request, context):
        await self._enter("TxnOffsetCommit", request, context)
        return k.TxnOffsetCommitResponse()

    async def DescribeProducers(self, request, context):
        await self._enter("DescribeProducers", request, context)
        return k.DescribeProducersResponse()

    async def DescribeTransactions(self, request, context):
        await self._enter("DescribeTransactions", request, context)
        return k.DescribeTransactionsResponse()

    async def ListTransactions(self, request, context):
        await self._enter("ListTransactions", request, context)
        return k.ListTransactionsResponse(error_code=0)

    # Security admin APIs: empty answers.

    async def DescribeAcls(self, request, context):
        await self._enter("DescribeAcls", request, context)
        return k.DescribeAclsResponse(error_code=0)

    async def CreateAcls(self, request, context):
        await self._enter("CreateAcls", request, context)
        return k.CreateAclsResponse()

    async def DeleteAcls(self, request, context):
        await self._enter("DeleteAcls", request, context)
        return k.DeleteAclsResponse()

    async def DescribeClientQuotas(self, request, context):
        await self._enter("DescribeClientQuotas", request, context)
        return k.DescribeClientQuotasResponse(error_code=0, entries_is_null=False)

    async def AlterClientQuotas(self, request, context):
        await self._enter("AlterClientQuotas", request, context)
        return k.AlterClientQuotasResponse()

    async def DescribeUserScramCredentials(self, request, context):
        await self._enter("DescribeUserScramCredentials", request, context)
        return k.DescribeUserScramCredentialsResponse(error_code=0)

    async def AlterUserScramCredentials(self, request, context):
        await self._enter("AlterUserScramCredentials", request, context)
        return k.AlterUserScramCredentialsResponse()

    async def GetTelemetrySubscriptions(self, request, context):
        await self._enter("GetTelemetrySubscriptions", request, context)
        return k.GetTelemetrySubscriptionsResponse(
            error_code=0, client_instance_id="6b1c6ad4-62a2-4c3c-9a64-3e1ea9a0b9f2",
            subscription_id=1, push_interval_ms=300000, telemetry_max_bytes=1048576)

    async def PushTelemetry(self, request, context):
        await self._enter("PushTelemetry", request, context)
        return k.PushTelemetryResponse(error_code=0)
