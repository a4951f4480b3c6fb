import asyncio

from kbroker.kafka.v1 import kafka_pb2 as k
from kbroker.log.v1 import log_pb2
from services.handler.apis.offsets import ListOffsetsApi
from services.handler.collaborators import UnreachableError
from services.handler.metadata_cache import MetadataCache

from .fakes import CONTEXT, FakeLogNodes, cache_of, cluster, topic


def request(*partitions, replica_id=-1):
    return k.ListOffsetsRequest(replica_id=replica_id, topics=[{
        "name": "t", "partitions": [{"partition_index": p, "timestamp": ts,
                                     "current_leader_epoch": epoch}
                                    for p, ts, epoch in partitions]}])


def serve(req, snapshot, log_nodes):
    return asyncio.run(ListOffsetsApi(cache_of(snapshot), log_nodes).handle(req, CONTEXT))


def answers(response):
    return [(p.partition_index, p.error_code, p.offset, p.timestamp, p.leader_epoch)
            for t in response.topics for p in t.partitions]


def test_latest_and_earliest_for_consumers():
    log_nodes = FakeLogNodes()
    log_nodes.put("t", 0, [b"a", b"b"])
    log_nodes.partition("t", 0).log_end = 5  # unreplicated tail beyond the high watermark
    snapshot = cluster(topic("t", 2, epoch=4))
    response = serve(request((0, -1, -1), (1, -2, 4)), snapshot, log_nodes)
    assert answers(response) == [(0, 0, 2, -1, 4), (1, 0, 0, -1, -1)]
    ((_, _, queries),) = log_nodes.calls
    assert [q.timestamp for q in queries] == [-1, -2]


def test_earliest_local_is_earliest_and_non_consumers_see_the_log_end():
    log_nodes = FakeLogNodes()
    log_nodes.put("t", 0, [b"a", b"b"])
    log_nodes.partition("t", 0).log_end = 5
    seen = []

    class Spy(FakeLogNodes):
        async def list_offsets(self, node, request, time_limit):
            seen.append(request.limit)
            return await log_nodes.list_offsets(node, request, time_limit)

    response = serve(request((0, -4, -1), (1, -1, -1), replica_id=-2),
                     cluster(topic("t", 2)), Spy())
    assert seen == [log_pb2.READ_LIMIT_LOG_END]
    assert [q.timestamp for q in log_nodes.calls[0][2]] == [-2, -1]
    assert answers(response)[1][2] == 0  # partition 1 is empty


def test_errors_per_partition():
    log_nodes = FakeLogNodes()
    snapshot = cluster(topic("t", 2, leaders=[0, 1], epoch=3), nodes=(0,), dead=(1,))
    response = serve(request((0, -1, 4), (0, -1, 2), (1, -1, -1), (5, -1, -1)),
                     snapshot, log_nodes)
    # Partition 0 twice: INVALID_REQUEST for both.
    assert [a[1] for a in answers(response)] == [42, 42, 6, 3]
    response = serve(request((0, -1, 4)), snapshot, log_nodes)
    assert answers(response) == [(0, 75, -1, -1, -1)]
    response = serve(request((0, -1, 2)), snapshot, log_nodes)
    assert answers(response) == [(0, 74, -1, -1, -1)]
    log_nodes.failures[0] = UnreachableError("down")
    response = serve(request((0, -1, -1)), snapshot, log_nodes)
    assert answers(response) == [(0, 6, -1, -1, -1)]


def test_an_unset_replica_id_is_a_consumer():
    log_nodes = FakeLogNodes()
    log_nodes.put("t", 0, [b"a", b"b"])
    log_nodes.partition("t", 0).log_end = 5
    req = k.ListOffsetsRequest(topics=[{"name": "t", "partitions": [
        {"partition_index": 0, "timestamp": -1}]}])
    # The high watermark (not the log end), with the partition's leader epoch.
    assert answers(serve(req, cluster(topic("t", epoch=4)), log_nodes)) == [(0, 0, 2, -1, 4)]


def test_without_metadata_every_partition_is_not_leader():
    async def main():
        async def down():
            raise ConnectionError("no replicator")

        return await ListOffsetsApi(MetadataCache(down), FakeLogNodes()).handle(
            request((0, -1, -1), (1, -2, -1)), CONTEXT)

    assert answers(asyncio.run(main())) == [(0, 6, -1, -1, -1), (1, 6, -1, -1, -1)]


def test_read_committed_consumers_list_up_to_the_last_stable_offset():
    seen = []

    class Spy(FakeLogNodes):
        async def list_offsets(self, node, request, time_limit):
            seen.append(request.limit)
            return await super().list_offsets(node, request, time_limit)

    committed = request((0, -1, -1))
    committed.isolation_level = 1
    serve(committed, cluster(topic("t")), Spy())
    serve(request((0, -1, -1)), cluster(topic("t")), Spy())
    assert seen == [log_pb2.READ_LIMIT_LAST_STABLE, log_pb2.READ_LIMIT_HIGH_WATERMARK]
