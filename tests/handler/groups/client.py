"""Group API calls to a handler for service tests, as a frontend would send them (each with
the API version it stands for)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kbroker.handler.v1 import kafka_handler_pb2_grpc
from kbroker.kafka.v1 import kafka_pb2 as k

from ..harness import CALL_TIMEOUT, FRONTEND_METADATA

JOIN_TIMEOUT = 60.0


def context(version: int, client_id: str = "handler-tests") -> tuple[tuple[str, str], ...]:
    pairs = tuple(p for p in FRONTEND_METADATA if p[0] != "kafka-client-id")
    return (*pairs, ("kafka-client-id", client_id), ("kafka-api-version", str(version)))


class GroupClient:
    """One consumer's view of a group: its member id and generation, kept between calls."""

    def __init__(self, stub: kafka_handler_pb2_grpc.KafkaHandlerStub, group_id: str,
                 client_id: str = "client", *, session_timeout_ms: int = 10_000,
                 rebalance_timeout_ms: int = 10_000, instance_id: str | None = None,
                 protocols: Sequence[tuple[str, bytes]] = (("range", b"meta"),)) -> None:
        self.stub = stub
        self.group_id = group_id
        self.client_id = client_id
        self.session_timeout_ms = session_timeout_ms
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.instance_id = instance_id
        self.protocols = list(protocols)
        self.member_id = ""
        self.generation = -1

    def _md(self, version: int) -> tuple[tuple[str, str], ...]:
        return context(version, self.client_id)

    async def join_once(self, version: int = 9) -> k.JoinGroupResponse:
        request = k.JoinGroupRequest(
            group_id=self.group_id, session_timeout_ms=self.session_timeout_ms,
            rebalance_timeout_ms=self.rebalance_timeout_ms, member_id=self.member_id,
            protocol_type="consumer",
            protocols=[k.JoinGroupRequest.JoinGroupRequestProtocol(name=n, metadata=m)
                       for n, m in self.protocols])
        if self.instance_id is not None:
            request.group_instance_id = self.instance_id
        response = await self.stub.JoinGroup(request, metadata=self._md(version),
                                             timeout=JOIN_TIMEOUT)
        if response.member_id:
            self.member_id = response.member_id
        if response.error_code == 0:
            self.generation = response.generation_id
        return response

    async def join(self, version: int = 9) -> k.JoinGroupResponse:
        """Join as a client does: once more when the broker hands out the member id."""
        response = await self.join_once(version)
        if response.error_code == 79:  # MEMBER_ID_REQUIRED
            response = await self.join_once(version)
        return response

    async def sync(self, assignments: dict[str, bytes] | None = None,
                   version: int = 5) -> k.SyncGroupResponse:
        request = k.SyncGroupRequest(
            group_id=self.group_id, generation_id=self.generation, member_id=self.member_id,
            assignments=[k.SyncGroupRequest.SyncGroupRequestAssignment(member_id=m,
                                                                       assignment=a)
                         for m, a in (assignments or {}).items()])
        if self.instance_id is not None:
            request.group_instance_id = self.instance_id
        return await self.stub.SyncGroup(request, metadata=self._md(version),
                                         timeout=JOIN_TIMEOUT)

    async def heartbeat(self) -> int:
        request = k.HeartbeatRequest(group_id=self.group_id, generation_id=self.generation,
                                     member_id=self.member_id)
        if self.instance_id is not None:
            request.group_instance_id = self.instance_id
        response = await self.stub.Heartbeat(request, metadata=self._md(4),
                                             timeout=CALL_TIMEOUT)
        return response.error_code

    async def leave(self) -> k.LeaveGroupResponse:
        return await self.stub.LeaveGroup(k.LeaveGroupRequest(
            group_id=self.group_id, members=[k.LeaveGroupRequest.MemberIdentity(
                member_id=self.member_id)]), metadata=self._md(5), timeout=CALL_TIMEOUT)

    async def commit(self, offsets: dict[tuple[str, int], int],
                     generation: int | None = None) -> dict[tuple[str, int], int]:
        topics: dict[str, list[Any]] = {}
        for (topic, partition), offset in offsets.items():
            topics.setdefault(topic, []).append(
                k.OffsetCommitRequest.OffsetCommitRequestPartition(
                    partition_index=partition, committed_offset=offset,
                    committed_leader_epoch=-1, committed_metadata=""))
        response = await self.stub.OffsetCommit(k.OffsetCommitRequest(
            group_id=self.group_id,
            generation_id_or_member_epoch=self.generation if generation is None
            else generation,
            member_id=self.member_id if generation is None else "",
            topics=[k.OffsetCommitRequest.OffsetCommitRequestTopic(name=t, partitions=ps)
                    for t, ps in topics.items()]),
            metadata=self._md(8), timeout=CALL_TIMEOUT)
        return {(t.name, p.partition_index): p.error_code
                for t in response.topics for p in t.partitions}


async def committed(stub: kafka_handler_pb2_grpc.KafkaHandlerStub, group_id: str,
                    partitions: Sequence[tuple[str, int]] | None = None,
                    version: int = 7) -> dict[tuple[str, int], int]:
    request = k.OffsetFetchRequest(group_id=group_id, topics_is_null=partitions is None)
    by_topic: dict[str, list[int]] = {}
    for topic, partition in partitions or ():
        by_topic.setdefault(topic, []).append(partition)
    for topic, indexes in by_topic.items():
        request.topics.add(name=topic, partition_indexes=indexes)
    response = await stub.OffsetFetch(request, metadata=context(version), timeout=CALL_TIMEOUT)
    assert response.error_code == 0, response
    return {(t.name, p.partition_index): p.committed_offset
            for t in response.topics for p in t.partitions}
