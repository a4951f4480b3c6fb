"""DeleteRecords through the handler: the API module against a real log node on port 0 (real
files in tmp_path), and what unset request fields mean."""

from __future__ import annotations

import asyncio
from pathlib import Path

from kbroker.kafka.v1 import kafka_pb2 as k
from kbroker.log.v1 import log_pb2
from services.common.errors import ErrorCode
from services.handler.apis.records import DeleteRecordsApi
from services.handler.clients import LogNodeClients
from services.handler.metadata_cache import ClusterMetadata, LogNode, MetadataCache
from services.log.config import LogConfig
from services.log.server import start

from ..record_batches import build_batch, values
from .fakes import CONTEXT, cache_of, cluster, topic


def request(*items: tuple[str, int, int], timeout_ms: int = 5000) -> k.DeleteRecordsRequest:
    by_topic: dict[str, list[dict[str, int]]] = {}
    for name, partition, offset in items:
        by_topic.setdefault(name, []).append({"partition_index": partition, "offset": offset})
    return k.DeleteRecordsRequest(topics=[{"name": n, "partitions": p}
                                          for n, p in by_topic.items()], timeout_ms=timeout_ms)


def answers(response) -> list[tuple[str, int, int, int]]:  # type: ignore[no-untyped-def]
    return [(t.name, p.partition_index, p.error_code, p.low_watermark)
            for t in response.topics for p in t.partitions]


def test_delete_records_moves_log_start_offsets_on_the_leaders(tmp_path: Path) -> None:
    async def main() -> None:
        node = await start(LogConfig(data_dir=str(tmp_path / "data"),
                                     grpc_address="127.0.0.1:0"))
        clients = LogNodeClients()
        try:
            for partition in (0, 1):
                log_ = node.manager.create("t", partition, "", {"segment.bytes": "200"})
                for _ in range(5):
                    await log_.append(build_batch(values(2, size=20)))
            snapshot = ClusterMetadata(
                version=1, cluster_id="c", controller_id=0,
                log_nodes=[LogNode(node_id=0, address=f"127.0.0.1:{node.port}", alive=True),
                           LogNode(node_id=1, address="127.0.0.1:1", alive=False)],
                topics=(topic("t", 2), topic("orphan", 1, leaders=[1])),
            )
            api = DeleteRecordsApi(cache_of(snapshot), clients)
            response = await api.handle(request(
                ("t", 0, 7), ("t", 1, 99), ("t", 0, 6), ("t", 5, 1), ("nope", 0, 1),
                ("orphan", 0, 1)), CONTEXT)
            assert answers(response) == [
                ("t", 0, 0, 6),  # the last offset given for a partition wins
                ("t", 1, ErrorCode.offset_out_of_range.value, -1),
                ("t", 5, ErrorCode.unknown_topic_or_partition.value, -1),
                ("nope", 0, ErrorCode.unknown_topic_or_partition.value, -1),
                ("orphan", 0, ErrorCode.not_leader_or_follower.value, -1),
            ]
            assert node.manager.get("t", 0).log_start_offset == 6
            everything = await api.handle(request(("t", 1, -1)), CONTEXT)
            assert answers(everything) == [("t", 1, 0, 10)]
            assert node.manager.get("t", 1).segment_count == 1
        finally:
            await clients.close()
            await node.stop(0)

    asyncio.run(asyncio.wait_for(main(), 60))


class FakeDeleter:
    """Log nodes that record what they are asked and answer low watermark = offset."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[tuple[str, int, int]], float]] = []

    async def delete_records(self, node, request, time_limit):  # type: ignore[no-untyped-def]
        deletions = request.partitions
        self.calls.append(([(d.topic, d.partition, d.offset) for d in deletions], time_limit))
        return log_pb2.DeleteRecordsResponse(results=[log_pb2.PartitionLowWatermark(
            topic=d.topic, partition=d.partition, low_watermark=d.offset) for d in deletions])


def test_unset_offsets_mean_the_high_watermark_and_the_timeout_bounds_the_call() -> None:
    deleter = FakeDeleter()
    api = DeleteRecordsApi(cache_of(cluster(topic("t", 4))), deleter)
    message = k.DeleteRecordsRequest(timeout_ms=1234, topics=[
        {"name": "t", "partitions": [{"partition_index": 2, "offset": 40},
                                     {"partition_index": 3}]}])
    response = asyncio.run(api.handle(message, CONTEXT))
    assert deleter.calls == [([("t", 2, 40), ("t", 3, -1)], 1.234)]
    assert answers(response) == [("t", 2, 0, 40), ("t", 3, 0, -1)]
    # Unset timeout (a hand-made request): 30 s.
    asyncio.run(api.handle(k.DeleteRecordsRequest(topics=[
        {"name": "t", "partitions": [{"partition_index": 0, "offset": 1}]}]), CONTEXT))
    assert deleter.calls[-1][1] == 30.0


def test_without_metadata_every_partition_is_not_leader() -> None:
    async def main():  # type: ignore[no-untyped-def]
        async def down():  # type: ignore[no-untyped-def]
            raise ConnectionError("no replicator")

        api = DeleteRecordsApi(MetadataCache(down), FakeDeleter())
        return await api.handle(request(("t", 2, 40), ("t", 3, -1)), CONTEXT)

    assert answers(asyncio.run(main())) == [
        ("t", 2, ErrorCode.not_leader_or_follower.value, -1),
        ("t", 3, ErrorCode.not_leader_or_follower.value, -1)]
