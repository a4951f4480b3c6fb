"""Consumer lag from the group offsets: every consumer group's committed offsets against its
partitions' high watermarks, asked of a handler over gRPC (``kbroker.handler.v1.KafkaHandler``,
the same calls grpcurl makes), on the driver:

    ListGroups                       every group the coordinators know
    OffsetFetch (groups, all topics) the committed offset of each group and partition
    ListOffsets (latest, read_uncommitted, as a consumer: replica -1)
                                     each partition's high watermark, the offset a consumer
                                     reads up to

One row per group and partition: ``lag = high_watermark - committed_offset`` (Kafka's
kafka-consumer-groups.sh LAG); a partition whose high watermark cannot be read (no leader) has
no high watermark and no lag. Channels are the data source's
(:func:`spark.datasource.open_channel`): mutual TLS with the cluster's material, plaintext to
loopback otherwise. With an authorizer on the handlers, the reader's certificate is not a
frontend's, so it runs as User:ANONYMOUS and sees only what ACLs allow that principal.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

TIMEOUT_S = 10.0
LATEST = -1
CONSUMER_REPLICA = -1


@dataclass(frozen=True, slots=True)
class GroupLag:
    group: str
    topic: str
    partition: int
    committed_offset: int
    high_watermark: int | None
    lag: int | None

    def row(self) -> dict[str, Any]:
        return asdict(self)


def compute_lag(committed: dict[str, dict[tuple[str, int], int]],
                high_watermarks: dict[tuple[str, int], int]) -> list[GroupLag]:
    """Rows of lag from committed offsets per group and high watermarks per partition (pure)."""
    rows = []
    for group in sorted(committed):
        for (topic, partition), offset in sorted(committed[group].items()):
            hw = high_watermarks.get((topic, partition))
            lag = None if hw is None or offset < 0 else max(hw - offset, 0)
            rows.append(GroupLag(group, topic, partition, offset, hw, lag))
    return rows


def read_group_lag(endpoint: str, settings: Any) -> list[GroupLag]:
    """The lag of every group, asked of the handler at ``endpoint`` (``settings``: the data
    source's :class:`~spark.datasource.ReadSettings`, for TLS: each service identity is tried
    as the data source tries them)."""
    import grpc

    from spark.datasource import open_channel, server_names

    names = server_names(endpoint, settings)
    for attempt, name in enumerate(names):
        with open_channel(endpoint, settings, name) as channel:
            try:
                return _ask(channel)
            except grpc.RpcError as error:
                if error.code() != grpc.StatusCode.UNAVAILABLE or attempt == len(names) - 1:
                    raise
    raise AssertionError("unreachable")


def _ask(channel: Any) -> list[GroupLag]:
    from kbroker.handler.v1 import kafka_handler_pb2_grpc
    from kbroker.kafka.v1 import kafka_pb2 as k

    stub = kafka_handler_pb2_grpc.KafkaHandlerStub(channel)
    listed = stub.ListGroups(k.ListGroupsRequest(), timeout=TIMEOUT_S)
    groups = sorted(g.group_id for g in listed.groups)
    committed: dict[str, dict[tuple[str, int], int]] = {}
    if groups:
        fetched = stub.OffsetFetch(k.OffsetFetchRequest(groups=[
            k.OffsetFetchRequest.OffsetFetchRequestGroup(group_id=g, topics_is_null=True)
            for g in groups]), timeout=TIMEOUT_S)
        for group in fetched.groups:
            if group.error_code:
                continue
            committed[group.group_id] = {
                (topic.name, p.partition_index): p.committed_offset
                for topic in group.topics for p in topic.partitions if not p.error_code}
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted({tp for offsets in committed.values() for tp in offsets}):
        by_topic.setdefault(topic, []).append(partition)
    high_watermarks: dict[tuple[str, int], int] = {}
    if by_topic:
        answer = stub.ListOffsets(k.ListOffsetsRequest(
            replica_id=CONSUMER_REPLICA, isolation_level=0, topics=[
                k.ListOffsetsRequest.ListOffsetsTopic(name=topic, partitions=[
                    k.ListOffsetsRequest.ListOffsetsPartition(partition_index=p,
                                                              timestamp=LATEST)
                    for p in indexes])
                for topic, indexes in by_topic.items()]), timeout=TIMEOUT_S)
        for topic in answer.topics:
            for p in topic.partitions:
                if not p.error_code and p.offset >= 0:
                    high_watermarks[(topic.name, p.partition_index)] = p.offset
    return compute_lag(committed, high_watermarks)
