import asyncio
import dataclasses
import time

from kbroker.kafka.v1 import kafka_pb2 as k
from kbroker.log.v1 import log_pb2
from kbroker.purgatory.v1 import purgatory_pb2
from services.handler.apis.fetch import FetchApi
from services.handler.collaborators import UnreachableError
from services.handler.metadata_cache import MetadataCache

from .batches import batch_offsets
from .fakes import CONTEXT, FakeLogNodes, FakePurgatory, cache_of, cluster, topic, wait_result

TOPIC_ID = "5f7c0e53-7bd1-4d52-9b67-1b2a1c3e4f50"
FetchTopic = k.FetchRequest.FetchTopic
FetchPartition = k.FetchRequest.FetchPartition


def fetch(*topics, **fields):
    return k.FetchRequest(
        topics=[FetchTopic(topic=name, partitions=[
            FetchPartition(partition=p, fetch_offset=offset, partition_max_bytes=1 << 20)
            for p, offset in parts]) for name, parts in topics],
        **fields,
    )


def serve(req, snapshot, log_nodes, purgatory=None):
    api = FetchApi(cache_of(snapshot), log_nodes, purgatory or FakePurgatory())
    return asyncio.run(api.handle(req, CONTEXT))


def parts(response):
    return [(t.topic, p.partition_index, p.error_code, p.high_watermark,
             batch_offsets(p.records))
            for t in response.responses for p in t.partitions]


def optional(message, name):
    """A field's value, None when unset (null for the frontend)."""
    return getattr(message, name) if message.HasField(name) else None


def aborted_transactions(partition):
    """None when the frontend encodes the list as null (unset or flagged null)."""
    if partition.aborted_transactions_is_null or not partition.HasField(
            "aborted_transactions_is_null"):
        return None
    return [(a.producer_id, a.first_offset) for a in partition.aborted_transactions]


def test_reads_from_the_leaders_up_to_the_high_watermark():
    log_nodes = FakeLogNodes()
    log_nodes.put("t", 0, [b"a", b"b"])
    log_nodes.put("t", 0, [b"c"])
    log_nodes.put("t", 1, [b"x"])
    snapshot = cluster(topic("t", 2, leaders=[0, 1]), nodes=(0, 1))
    response = serve(fetch(("t", [(0, 1), (1, 0)])), snapshot, log_nodes)
    assert response.error_code == 0
    assert response.session_id == 0
    assert parts(response) == [("t", 0, 0, 3, [(0, 2), (2, 1)]), ("t", 1, 0, 1, [(0, 1)])]
    p = response.responses[0].partitions[0]
    assert (p.last_stable_offset, p.log_start_offset, p.preferred_read_replica) == (3, 0, -1)
    assert aborted_transactions(p) is None
    assert sorted(node for kind, node, _ in log_nodes.calls) == [0, 1]


def test_read_committed_has_an_empty_aborted_list():
    log_nodes = FakeLogNodes()
    log_nodes.put("t", 0, [b"a"])
    response = serve(fetch(("t", [(0, 0)]), isolation_level=1), cluster(topic("t")), log_nodes)
    assert aborted_transactions(response.responses[0].partitions[0]) == []


class Transactional(FakeLogNodes):
    """A leader with an open transaction from offset 2 (the last stable offset) and an aborted
    one at 0: read_committed reads stop there and name it."""

    def __init__(self):
        super().__init__()
        self.limits = []

    async def read(self, node, request, time_limit):
        self.limits.append(request.limit)
        out = await super().read(node, request, time_limit)
        for result in out.results:
            result.last_stable_offset = 2
            if request.limit == log_pb2.READ_LIMIT_LAST_STABLE:
                result.aborted_transactions.add(producer_id=9, first_offset=0)
        return out


def test_read_committed_reads_to_the_last_stable_offset_with_the_aborted_transactions():
    log_nodes = Transactional()
    log_nodes.put("t", 0, [b"a", b"b", b"c"])
    response = serve(fetch(("t", [(0, 0)]), isolation_level=1), cluster(topic("t")), log_nodes)
    p = response.responses[0].partitions[0]
    assert (p.high_watermark, p.last_stable_offset) == (3, 2)
    assert aborted_transactions(p) == [(9, 0)]
    uncommitted = serve(fetch(("t", [(0, 0)])), cluster(topic("t")), log_nodes)
    p = uncommitted.responses[0].partitions[0]
    assert (p.last_stable_offset, aborted_transactions(p)) == (2, None)
    assert log_nodes.limits == [log_pb2.READ_LIMIT_LAST_STABLE, log_pb2.READ_LIMIT_HIGH_WATERMARK]


def test_incremental_fetches_name_a_session_that_does_not_exist():
    log_nodes = FakeLogNodes()
    for session_id, epoch in [(7, 1), (0, 3)]:
        response = serve(fetch(("t", [(0, 0)]), session_id=session_id, session_epoch=epoch),
                         cluster(topic("t")), log_nodes)
        assert (response.error_code, response.session_id, list(response.responses)) == (
            70, 0, [])
    assert log_nodes.calls == []
    # A full fetch that closes or opens a session is served sessionless.
    for epoch in (-1, 0):
        response = serve(fetch(("t", [(0, 0)]), session_id=7, session_epoch=epoch),
                         cluster(topic("t")), log_nodes)
        assert (response.error_code, response.session_id) == (0, 0)


def test_topic_ids_resolve_and_unknown_ids_are_reported():
    log_nodes = FakeLogNodes()
    log_nodes.put("t", 0, [b"a"])
    other = "11111111-2222-3333-4444-555555555555"
    req = k.FetchRequest(topics=[
        FetchTopic(topic_id=TOPIC_ID, partitions=[FetchPartition(partition=0, fetch_offset=0)]),
        FetchTopic(topic_id=other, partitions=[FetchPartition(partition=0, fetch_offset=0)]),
    ])
    response = serve(req, cluster(topic("t", topic_id=TOPIC_ID)), log_nodes)
    assert [(optional(t, "topic"), t.topic_id) for t in response.responses] == [
        ("t", TOPIC_ID), (None, other)]
    assert [p.error_code for t in response.responses for p in t.partitions] == [0, 100]


def test_errors_per_partition():
    log_nodes = FakeLogNodes()
    log_nodes.put("t", 0, [b"a"])
    snapshot = cluster(topic("t", 2, leaders=[0, 1], epoch=5), nodes=(0,), dead=(1,))
    req = k.FetchRequest(topics=[
        FetchTopic(topic="t", partitions=[
            FetchPartition(partition=0, fetch_offset=99),
            FetchPartition(partition=1, fetch_offset=0),
            FetchPartition(partition=0, fetch_offset=0, current_leader_epoch=6),
            FetchPartition(partition=0, fetch_offset=0, current_leader_epoch=4),
            FetchPartition(partition=7, fetch_offset=0),
        ]),
        FetchTopic(topic="missing", partitions=[FetchPartition(partition=0, fetch_offset=0)]),
    ])
    response = serve(req, snapshot, log_nodes)
    assert [p.error_code for t in response.responses for p in t.partitions] == [
        1, 6, 75, 74, 3, 3]
    errored = response.responses[0].partitions[0]
    assert (errored.high_watermark, errored.log_start_offset, errored.records) == (-1, -1, b"")
    # Empty records, not null; no aborted transactions (null).
    assert errored.HasField("records") and aborted_transactions(errored) is None


def test_only_consumers_fetch():
    log_nodes = FakeLogNodes()
    response = serve(fetch(("t", [(0, 0)]), replica_id=1), cluster(topic("t")), log_nodes)
    assert parts(response) == [("t", 0, 6, -1, [])]
    assert log_nodes.calls == []


def test_max_bytes_cuts_at_whole_batches_and_the_first_batch_always_comes():
    log_nodes = FakeLogNodes()
    for _ in range(3):
        log_nodes.put("t", 0, [b"v" * 100])
        log_nodes.put("t", 1, [b"v" * 100])
    size = len(log_nodes.partition("t", 0).batches[0])
    snapshot = cluster(topic("t", 2))
    response = serve(fetch(("t", [(0, 0), (1, 0)]), max_bytes=1), snapshot, log_nodes)
    assert [len(batch_offsets(p.records)) for p in response.responses[0].partitions] == [1, 0]
    response = serve(fetch(("t", [(0, 0), (1, 0)]), max_bytes=size * 4), snapshot, log_nodes)
    assert [len(batch_offsets(p.records)) for p in response.responses[0].partitions] == [3, 1]
    req = k.FetchRequest(topics=[FetchTopic(topic="t", partitions=[
        FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=size * 2),
        FetchPartition(partition=1, fetch_offset=0, partition_max_bytes=1)])])
    response = serve(req, snapshot, log_nodes)
    assert [len(batch_offsets(p.records)) for p in response.responses[0].partitions] == [2, 0]


def test_too_little_data_waits_in_the_purgatory_and_reads_again_when_woken():
    log_nodes = FakeLogNodes()
    log_nodes.put("t", 0, [b"a"])
    purgatory = FakePurgatory()
    snapshot = cluster(topic("t", 2))

    async def main():
        api = FetchApi(cache_of(snapshot), log_nodes, purgatory)
        task = asyncio.create_task(api.handle(fetch(("t", [(0, 1), (1, 0)]), min_bytes=1,
                                                    max_wait_ms=5000), CONTEXT))
        await asyncio.wait_for(purgatory.parked.wait(), 2)
        log_nodes.put("t", 1, [b"late"])
        purgatory.wake.set()
        return await asyncio.wait_for(task, 2)

    started = time.monotonic()
    response = asyncio.run(main())
    assert time.monotonic() - started < 2
    assert parts(response) == [("t", 0, 0, 1, []), ("t", 1, 0, 1, [(0, 1)])]
    ((kind, thresholds, require_all, timeout_ms),) = purgatory.waits
    assert kind == purgatory_pb2.OPERATION_KIND_FETCH
    assert thresholds == {"t-0": 2, "t-1": 1}
    assert not require_all
    assert 4000 < timeout_ms <= 5000


def test_the_wait_expires_at_max_wait():
    log_nodes = FakeLogNodes()
    started = time.monotonic()
    response = serve(fetch(("t", [(0, 0)]), min_bytes=1, max_wait_ms=200), cluster(topic("t")),
                     log_nodes)
    elapsed = time.monotonic() - started
    assert 0.18 <= elapsed < 1.0
    assert parts(response) == [("t", 0, 0, 0, [])]
    # Read before the wait and once after it.
    assert len(log_nodes.calls) == 2


def test_without_a_purgatory_the_fetch_waits_out_max_wait_without_spinning():
    log_nodes = FakeLogNodes()
    started = time.monotonic()
    response = serve(fetch(("t", [(0, 0)]), min_bytes=1, max_wait_ms=200), cluster(topic("t")),
                     log_nodes, FakePurgatory(UnreachableError("down")))
    assert 0.18 <= time.monotonic() - started < 1.0
    assert parts(response) == [("t", 0, 0, 0, [])]
    assert len(log_nodes.calls) == 2


def test_no_wait_when_enough_data_an_error_or_nothing_to_read():
    log_nodes = FakeLogNodes()
    log_nodes.put("t", 0, [b"a"])
    purgatory = FakePurgatory()
    snapshot = cluster(topic("t", 2, leaders=[0, 1]), nodes=(0,), dead=(1,))
    for req in [
        fetch(("t", [(0, 0)]), min_bytes=1, max_wait_ms=5000),  # enough data
        fetch(("t", [(0, 1), (1, 0)]), min_bytes=1, max_wait_ms=5000),  # partition error
        fetch(("missing", [(0, 0)]), min_bytes=1, max_wait_ms=5000),  # nothing to read
        fetch(("t", [(0, 9)]), min_bytes=1, max_wait_ms=5000),  # out of range
    ]:
        started = time.monotonic()
        serve(req, snapshot, log_nodes, purgatory)
        assert time.monotonic() - started < 1
    assert purgatory.waits == []


def test_a_key_error_reported_by_the_purgatory_answers_at_once():
    log_nodes = FakeLogNodes()
    purgatory = FakePurgatory(wait_result(True, {"t-0": 0}, {"t-0": 6}))
    started = time.monotonic()
    serve(fetch(("t", [(0, 0)]), min_bytes=1, max_wait_ms=5000), cluster(topic("t")),
          log_nodes, purgatory)
    assert time.monotonic() - started < 1
    assert len(purgatory.waits) == 1


def test_unset_fields_take_kafka_defaults():
    """A hand-made request naming only partitions and offsets is a consumer's full fetch
    without byte limits (1 MiB per partition) or epoch checks."""
    log_nodes = FakeLogNodes()
    log_nodes.put("t", 0, [b"a"])
    limits = []

    class Spy(FakeLogNodes):
        async def read(self, node, request, time_limit):
            limits.append((request.max_bytes, [r.max_bytes for r in request.partitions]))
            return await log_nodes.read(node, request, time_limit)

    req = k.FetchRequest(topics=[FetchTopic(topic="t", partitions=[
        FetchPartition(partition=0, fetch_offset=0)])])
    response = serve(req, cluster(topic("t", epoch=5)), Spy())
    assert (response.error_code, response.session_id) == (0, 0)
    assert parts(response) == [("t", 0, 0, 1, [(0, 1)])]
    assert limits == [(2**31 - 1, [1 << 20])]
    # Named by name, of a topic without an id: the answer has no topic id (null).
    assert not response.responses[0].HasField("topic_id")


def test_replica_state_names_the_replica_from_fetch_v15():
    log_nodes = FakeLogNodes()
    replica = fetch(("t", [(0, 0)]), replica_id=-1,
                    replica_state=k.FetchRequest.ReplicaState(replica_id=2))
    assert parts(serve(replica, cluster(topic("t")), log_nodes)) == [("t", 0, 6, -1, [])]
    assert log_nodes.calls == []
    consumer = fetch(("t", [(0, 0)]),
                     replica_state=k.FetchRequest.ReplicaState(replica_id=-1, replica_epoch=-1))
    assert parts(serve(consumer, cluster(topic("t")), log_nodes)) == [("t", 0, 0, 0, [])]


def test_without_metadata_every_partition_is_not_leader_with_empty_records():
    async def main():
        async def down():
            raise ConnectionError("no replicator")

        api = FetchApi(MetadataCache(down), FakeLogNodes(), FakePurgatory())
        return await api.handle(fetch(("t", [(0, 0), (1, 5)])), CONTEXT)

    response = asyncio.run(main())
    # Per partition, as from a broker that does not know them; no error for the whole request.
    assert response.error_code == 0
    assert parts(response) == [("t", 0, 6, -1, []), ("t", 1, 6, -1, [])]
    assert all(p.HasField("records") for p in response.responses[0].partitions)


class InSegmentFiles(FakeLogNodes):
    """Leaders that name each partition's batches as a range of a file (written here) to a
    reader whose key they share, as log nodes on the frontend's host do."""

    KEY = "this-host/mnt:[1]"

    def __init__(self, directory):
        super().__init__()
        self.directory = directory
        self.readers = []

    async def read(self, node, request, time_limit):
        self.readers.append(request.local_reader)
        out = await super().read(node, request, time_limit)
        if request.local_reader != self.KEY:
            return out
        for result in out.results:
            if result.records:
                path = self.directory / f"{result.topic}-{result.partition}.log"
                path.write_bytes(b"\0" * 7 + result.records)
                result.file_records.path = str(path)
                result.file_records.inode = path.stat().st_ino
                result.file_records.position = 7
                result.file_records.size = len(result.records)
                result.records = b""
        return out


def serve_locally(req, log_nodes):
    context = dataclasses.replace(CONTEXT, detached_payloads=True,
                                  local_reader=InSegmentFiles.KEY)
    api = FetchApi(cache_of(cluster(topic("t", 2, leaders=[0, 1]), nodes=(0, 1))), log_nodes,
                   FakePurgatory())
    return asyncio.run(api.handle(req, context))


def test_a_local_reader_gets_the_leaders_file_ranges_in_place_of_the_batches(tmp_path):
    log_nodes = InSegmentFiles(tmp_path)
    log_nodes.put("t", 0, [b"a", b"b"])
    log_nodes.put("t", 1, [b"x"])
    answer = serve_locally(fetch(("t", [(0, 0), (1, 0)])), log_nodes)
    assert log_nodes.readers == [InSegmentFiles.KEY] * 2
    assert [bytes(p) for p in answer.payloads] == [b"", b""]
    assert [leaf for leaf, _ in answer.files] == [0, 1]
    named = [(tmp_path / f"t-{n}.log").read_bytes()[7:] for n in (0, 1)]
    assert [batch_offsets(records) for records in named] == [[(0, 2)], [(0, 1)]]
    assert [files.size for _, files in answer.files] == [len(records) for records in named]
    partitions = answer.message.responses[0].partitions
    assert [(p.partition_index, p.error_code, p.high_watermark) for p in partitions] == [
        (0, 0, 2), (1, 0, 1)]
    # A caller that takes no batches beside the answer never names a key.
    plain = InSegmentFiles(tmp_path)
    plain.put("t", 0, [b"a"])
    serve(fetch(("t", [(0, 0)])), cluster(topic("t")), plain)
    assert plain.readers == [""]


def test_ranges_past_the_fetchs_byte_limit_are_read_again_as_batches(tmp_path):
    """Only cutting batches off would fit them: the batches themselves are read instead."""
    log_nodes = InSegmentFiles(tmp_path)
    for _ in range(3):
        log_nodes.put("t", 0, [b"v" * 100])
        log_nodes.put("t", 1, [b"v" * 100])
    size = len(log_nodes.partition("t", 0).batches[0])
    answer = serve_locally(fetch(("t", [(0, 0), (1, 0)]), max_bytes=size * 4), log_nodes)
    assert log_nodes.readers == [InSegmentFiles.KEY] * 2 + [""] * 2
    assert not answer.files
    assert [len(batch_offsets(p)) for p in answer.payloads] == [3, 1]
