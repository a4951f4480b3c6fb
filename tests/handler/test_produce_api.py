import asyncio
import dataclasses
import os

import pytest

from kbroker.kafka.v1 import kafka_pb2 as k
from kbroker.log.v1 import log_pb2
from kbroker.purgatory.v1 import purgatory_pb2
from services.common.file_records import SpooledRecords
from services.common.records.record_batch import HEADER_SIZE, TRANSACTIONAL_BIT
from services.handler.apis.produce import ProduceApi
from services.handler.collaborators import (
    OutcomeUnknownError,
    RequestOutcomeUnknownError,
    UnreachableError,
)
from services.handler.coordinator.placement import CoordinatorError
from services.handler.request_context import RequestContext

from ..record_batches import build_batch
from .batches import record_batch
from .fakes import FakeLogNodes, FakePurgatory, cache_of, cluster, topic, wait_result

BATCH = record_batch([b"a", b"b", b"c"])
CONTEXT = RequestContext(advertised_host="localhost", advertised_port=9092)


def request(*topics, acks=1, transactional_id=None, timeout_ms=1000):
    return k.ProduceRequest(
        acks=acks, timeout_ms=timeout_ms, transactional_id=transactional_id,
        topic_data=[{"name": name, "partition_data": [{"index": p, "records": BATCH}
                                                      for p in parts]}
                    for name, parts in topics],
    )


def serve(req, snapshot, log_nodes=None, purgatory=None, **options):
    log_nodes = log_nodes or FakeLogNodes()
    purgatory = purgatory or FakePurgatory()
    api = ProduceApi(cache_of(snapshot), log_nodes, purgatory, **options)
    return asyncio.run(api.handle(req, CONTEXT)), log_nodes, purgatory


def outcome(response):
    return [(t.name, p.index, p.error_code, p.base_offset)
            for t in response.responses for p in t.partition_responses]


def test_appends_go_to_each_leader_once_and_offsets_come_back():
    snapshot = cluster(topic("t", 3, leaders=[0, 1, 0]), topic("u", 1, leaders=[1]),
                       nodes=(0, 1))
    log_nodes = FakeLogNodes()
    log_nodes.put("t", 2, [b"x"])
    response, log_nodes, _ = serve(request(("t", [0, 1, 2]), ("u", [0])), snapshot, log_nodes)
    assert outcome(response) == [("t", 0, 0, 0), ("t", 1, 0, 0), ("t", 2, 0, 1), ("u", 0, 0, 0)]
    calls = sorted((node, sorted((a.topic, a.partition) for a in appends))
                   for kind, node, appends in log_nodes.calls if kind == "append")
    assert calls == [(0, [("t", 0), ("t", 2)]), (1, [("t", 1), ("u", 0)])]
    assert all(p.log_start_offset == 0 for p in response.responses[0].partition_responses)


@pytest.mark.parametrize("acks", [2, -2, 3])
def test_invalid_acks_fail_every_partition_and_append_nothing(acks):
    response, log_nodes, _ = serve(request(("t", [0]), ("u", [0, 1]), acks=acks),
                                   cluster(topic("t")))
    assert [p.error_code for t in response.responses for p in t.partition_responses] == [21, 21, 21]
    assert log_nodes.calls == []


def transactional(producer_id=7, epoch=2):
    return build_batch([b"v"], attributes=TRANSACTIONAL_BIT, producer_id=producer_id,
                       producer_epoch=epoch, base_sequence=0)


def txn_request(*partitions, version_batches=None, transactional_id="tx"):
    return k.ProduceRequest(acks=1, timeout_ms=1000, transactional_id=transactional_id,
                            topic_data=[{"name": "t", "partition_data": [
                                {"index": p, "records": (version_batches or {}).get(
                                    p, transactional())} for p in partitions]}])


class Verifier:
    """The transaction coordinator's verification: an answer per partition, or a failure."""

    def __init__(self, answers=None, failure=None):
        self.answers = answers or {}
        self.failure = failure
        self.asked = []

    async def verify(self, transactional_id, producer_id, epoch, partitions):
        self.asked.append((transactional_id, producer_id, epoch, sorted(partitions)))
        if self.failure is not None:
            raise self.failure
        return {tp: self.answers.get(tp, 0) for tp in partitions}


def test_transactional_records_need_a_transactional_id_and_one_producer():
    response, log_nodes, _ = serve(txn_request(0, transactional_id=None), cluster(topic("t")))
    assert outcome(response) == [("t", 0, 53, -1)]
    response, log_nodes, _ = serve(
        txn_request(0, 1, version_batches={1: transactional(producer_id=8)}),
        cluster(topic("t", 2)))
    assert outcome(response) == [("t", 0, 49, -1), ("t", 1, 49, -1)]
    assert log_nodes.calls == []


def test_a_partition_the_leader_wants_verified_is_appended_again_with_its_guard():
    log_nodes = FakeLogNodes()
    log_nodes.guards[("t", 1)] = 12345
    verifier = Verifier()
    response, log_nodes, _ = serve(txn_request(0, 1), cluster(topic("t", 2)), log_nodes,
                                   transactions=verifier)
    assert outcome(response) == [("t", 0, 0, 0), ("t", 1, 0, 0)]
    assert verifier.asked == [("tx", 7, 2, [("t", 1)])]
    appends = [a for kind, _, appends in log_nodes.calls if kind == "append" for a in appends]
    assert [(a.partition, a.verification_guard) for a in appends] == [(0, 0), (1, 0), (1, 12345)]


@pytest.mark.parametrize(("answer", "version", "code", "message"), [
    (120, 11, 120, None),  # TRANSACTION_ABORTABLE
    (120, 10, 48, "Partition was not added to the transaction"),
    (90, 11, 47, None),  # PRODUCER_FENCED as INVALID_PRODUCER_EPOCH
    (49, 11, 49, None),  # INVALID_PRODUCER_ID_MAPPING
    (51, 9, 19, "Unable to verify the partition has been added to the transaction. "
                "Underlying error: CONCURRENT_TRANSACTIONS"),
])
def test_a_partition_not_in_the_transaction_is_answered_as_kafka_does(answer, version, code,
                                                                     message):
    log_nodes = FakeLogNodes()
    log_nodes.guards[("t", 0)] = 5
    api = ProduceApi(cache_of(cluster(topic("t"))), log_nodes, FakePurgatory(),
                     transactions=Verifier({("t", 0): answer}))
    context = RequestContext(advertised_host="localhost", advertised_port=9092,
                             api_version=version)
    response = asyncio.run(api.handle(txn_request(0), context))
    [partition] = response.responses[0].partition_responses
    assert (partition.error_code, partition.base_offset) == (code, -1)
    assert (partition.error_message if partition.HasField("error_message") else None) == message
    assert len([c for c in log_nodes.calls if c[0] == "append"]) == 1


def test_a_coordinator_that_cannot_answer_means_retry():
    log_nodes = FakeLogNodes()
    log_nodes.guards[("t", 0)] = 5
    response, _, _ = serve(txn_request(0), cluster(topic("t")), log_nodes,
                           transactions=Verifier(failure=CoordinatorError(15)))
    assert outcome(response) == [("t", 0, 19, -1)]


def test_unknown_partitions_and_dead_leaders():
    snapshot = cluster(topic("t", 2, leaders=[0, 1]), nodes=(0,), dead=(1,))
    response, _, _ = serve(request(("t", [0, 1, 9]), ("nope", [0])), snapshot)
    assert outcome(response) == [("t", 0, 0, 0), ("t", 1, 6, -1), ("t", 9, 3, -1),
                                 ("nope", 0, 3, -1)]


def test_unreachable_leader_versus_unknown_outcome():
    snapshot = cluster(topic("t", 2, leaders=[0, 1]), nodes=(0, 1))
    log_nodes = FakeLogNodes()
    log_nodes.failures = {0: UnreachableError("refused"), 1: OutcomeUnknownError("deadline")}
    response, _, _ = serve(request(("t", [0, 1])), snapshot, log_nodes)
    assert [p.error_code for p in response.responses[0].partition_responses] == [6, 7]


def test_an_idempotent_append_of_unknown_outcome_leaves_the_request_unanswered():
    """No answer is safe for it: the frontend closes the connection instead, so the client
    resends in order under the same sequence numbers."""
    snapshot = cluster(topic("t", 2, leaders=[0, 1]), nodes=(0, 1))
    log_nodes = FakeLogNodes()
    log_nodes.failures = {1: OutcomeUnknownError("deadline")}
    idempotent = record_batch([b"a"], producer_id=7)
    req = k.ProduceRequest(acks=-1, timeout_ms=1000, topic_data=[{"name": "t", "partition_data": [
        {"index": 0, "records": idempotent}, {"index": 1, "records": idempotent}]}])
    with pytest.raises(RequestOutcomeUnknownError, match="t-1"):
        serve(req, snapshot, log_nodes)
    # Unreachable means nothing was appended: answered, so the client looks the leader up.
    log_nodes.failures = {1: UnreachableError("refused")}
    response, _, _ = serve(req, snapshot, log_nodes)
    assert [p.error_code for p in response.responses[0].partition_responses] == [0, 6]


def test_log_node_errors_pass_through_and_unknown_partitions_mean_not_leader():
    class Rejecting(FakeLogNodes):
        async def append(self, node, request, time_limit, records=None):
            return log_pb2.AppendResponse(results=[log_pb2.PartitionAppendResult(
                topic=a.topic, partition=a.partition, error_code=2 if a.partition == 0 else 3,
                error_message="bad crc" if a.partition == 0 else None)
                for a in request.partitions])

    response, _, _ = serve(request(("t", [0, 1])), cluster(topic("t", 2)), Rejecting())
    first, second = response.responses[0].partition_responses
    assert (first.error_code, first.error_message, first.base_offset) == (2, "bad crc", -1)
    # The leader does not host a partition the metadata gives it: not (yet) its leader.
    assert second.error_code == 6


def test_acks_all_needs_no_wait_when_the_leader_commits_at_once():
    # A leader alone in its ISR answers its append with the high watermark at the log end.
    response, _, purgatory = serve(request(("t", [0]), acks=-1), cluster(topic("t")))
    assert outcome(response) == [("t", 0, 0, 0)]
    assert purgatory.waits == []


def test_acks_all_awaits_the_high_watermark_in_the_purgatory():
    log_nodes = FakeLogNodes()
    log_nodes.lagging_high_watermark = True
    snapshot = cluster(topic("t", 3))
    purgatory = FakePurgatory(wait_result(False, {"t-0": 3, "t-1": 1, "t-2": 0}, {"t-2": 6}))
    response, _, purgatory = serve(request(("t", [0, 1, 2]), acks=-1, timeout_ms=1234),
                                   snapshot, log_nodes, purgatory)
    assert [p.error_code for p in response.responses[0].partition_responses] == [0, 7, 6]
    ((kind, thresholds, require_all, timeout_ms),) = purgatory.waits
    assert kind == purgatory_pb2.OPERATION_KIND_PRODUCE
    assert thresholds == {"t-0": 3, "t-1": 3, "t-2": 3}
    assert require_all
    assert timeout_ms == 1234


def test_acks_all_without_a_purgatory_times_out():
    log_nodes = FakeLogNodes()
    log_nodes.lagging_high_watermark = True
    response, _, _ = serve(request(("t", [0]), acks=-1), cluster(topic("t")), log_nodes,
                           FakePurgatory(UnreachableError("down")))
    assert outcome(response) == [("t", 0, 7, -1)]


def test_a_partition_is_appended_only_at_the_broker_that_leads_it():
    """Sent to broker 0, t-1 (led by 1) is NOT_LEADER_OR_FOLLOWER and not appended, as a Kafka
    broker answers; t-0 (led by 0) is appended. Without a broker id (a port that names none)
    both are routed to their leaders."""
    snapshot = cluster(topic("t", 2, leaders=[0, 1]), nodes=(0, 1))
    api_context = RequestContext(advertised_host="localhost", advertised_port=9092, broker_id=0)
    log_nodes = FakeLogNodes()
    api = ProduceApi(cache_of(snapshot), log_nodes, FakePurgatory())
    response = asyncio.run(api.handle(request(("t", [0, 1])), api_context))
    assert [(p.index, p.error_code) for p in response.responses[0].partition_responses] == [
        (0, 0), (1, 6)]
    assert "broker 1 is" in response.responses[0].partition_responses[1].error_message
    appended = [(a.topic, a.partition) for kind, _, appends in log_nodes.calls
                if kind == "append" for a in appends]
    assert appended == [("t", 0)]
    response, _, _ = serve(request(("t", [0, 1])), snapshot)
    assert [p.error_code for p in response.responses[0].partition_responses] == [0, 0]


def spooled(directory, batches):
    """``batches`` left in a frontend's spool file in ``directory``, as the frontend names
    them to the handler."""
    path = directory / f"kbroker-records-{os.getpid()}-{os.urandom(8).hex()}.spool"
    path.write_bytes(b"".join(batches))
    inode, position, found = os.stat(path).st_ino, 0, []
    for batch in batches:
        found.append(SpooledRecords(batch[:HEADER_SIZE], str(path), inode, position,
                                    len(batch)))
        position += len(batch)
    return path, found


def serve_spooled(req, snapshot, payloads, log_nodes, api=None):
    context = dataclasses.replace(CONTEXT, record_payloads=payloads)
    api = api or ProduceApi(cache_of(snapshot), log_nodes, FakePurgatory())
    return asyncio.run(api.handle(req, context))


def test_spooled_batches_are_named_to_the_leader_which_reads_them(tmp_path):
    batches = [BATCH, record_batch([b"d", b"e"])]
    _, payloads = spooled(tmp_path, batches)
    log_nodes = FakeLogNodes()
    response = serve_spooled(request(("t", [0, 1])), cluster(topic("t", 2)), payloads,
                             log_nodes)
    assert outcome(response) == [("t", 0, 0, 0), ("t", 1, 0, 0)]
    (sent,) = log_nodes.append_requests
    assert sent.local_reader
    assert [(a.file_records.position, a.file_records.size) for a in sent.partitions] == [
        (0, len(BATCH)), (len(BATCH), len(batches[1]))]
    assert [log_nodes.partition("t", p).batches for p in (0, 1)] == [[b] for b in batches]


def test_a_leader_on_another_host_gets_the_spooled_batches_carried(tmp_path):
    batches = [BATCH, record_batch([b"d", b"e"])]
    _, payloads = spooled(tmp_path, batches)
    log_nodes = FakeLogNodes()
    log_nodes.spool_elsewhere = True
    response = serve_spooled(request(("t", [0, 1])), cluster(topic("t", 2)), payloads,
                             log_nodes)
    assert outcome(response) == [("t", 0, 0, 0), ("t", 1, 0, 0)]
    named, carried = log_nodes.append_requests
    assert named.local_reader and all(a.HasField("file_records") for a in named.partitions)
    assert not carried.local_reader
    assert [a.records for a in carried.partitions] == batches
    assert not any(a.HasField("file_records") for a in carried.partitions)
    assert [log_nodes.partition("t", p).batches for p in (0, 1)] == [[b] for b in batches]
    # That leader is then sent them carried at once.
    snapshot = cluster(topic("t", 2))
    api = ProduceApi(cache_of(snapshot), log_nodes, FakePurgatory())
    serve_spooled(request(("t", [0, 1])), snapshot, payloads, log_nodes, api)
    log_nodes.append_requests.clear()
    response = serve_spooled(request(("t", [0, 1])), snapshot, payloads, log_nodes, api)
    assert outcome(response) == [("t", 0, 0, 6), ("t", 1, 0, 4)]
    (carried,) = log_nodes.append_requests
    assert [a.records for a in carried.partitions] == batches


def test_spooled_batches_gone_fail_their_partitions_and_store_nothing(tmp_path):
    path, payloads = spooled(tmp_path, [BATCH])
    path.unlink()  # the frontend gave the request up
    log_nodes = FakeLogNodes()
    log_nodes.spool_elsewhere = True
    response = serve_spooled(request(("t", [0])), cluster(topic("t")), payloads, log_nodes)
    assert outcome(response) == [("t", 0, 56, -1)]  # KAFKA_STORAGE_ERROR: retriable
    assert log_nodes.partition("t", 0).batches == []


def test_the_checks_of_a_spooled_batch_look_at_its_header(tmp_path):
    _, payloads = spooled(tmp_path, [transactional()])
    log_nodes = FakeLogNodes()
    response = serve_spooled(txn_request(0, transactional_id=None), cluster(topic("t")),
                             payloads, log_nodes)
    assert outcome(response) == [("t", 0, 53, -1)]
    assert log_nodes.calls == []
