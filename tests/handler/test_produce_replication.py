"""Produce with acks=-1 on replicated partitions: the purgatory wait for the high watermark and
min.insync.replicas (the leader checks it as it appends, NOT_ENOUGH_REPLICAS and nothing
stored; NOT_ENOUGH_REPLICAS_AFTER_APPEND when the ISR shrank meanwhile, by the leader's ISR
reported with the high watermark that satisfied the wait)."""

from __future__ import annotations

import asyncio

from kbroker.kafka.v1 import kafka_pb2 as k
from kbroker.purgatory.v1 import purgatory_pb2
from services.common.errors import ErrorCode
from services.handler.apis.produce import ProduceApi
from services.handler.metadata_cache import PartitionInfo, TopicInfo
from services.handler.request_context import RequestContext

from .batches import record_batch
from .fakes import FakeLogNodes, FakePurgatory, cache_of, cluster, wait_result

BATCH = record_batch([b"a", b"b"])


def replicated(name: str, isr: tuple[int, ...], min_insync: int | None = None) -> TopicInfo:
    configs = {} if min_insync is None else {"min.insync.replicas": str(min_insync)}
    return TopicInfo(name=name, topic_id=None, configs=configs, partitions={
        0: PartitionInfo(partition=0, leader=0, leader_epoch=2, replicas=(0, 1, 2), isr=isr)})


CONTEXT = RequestContext(advertised_host="localhost", advertised_port=9092)


def produce(acks: int = -1) -> k.ProduceRequest:
    return k.ProduceRequest(acks=acks, timeout_ms=500, topic_data=[
        {"name": "t", "partition_data": [{"index": 0, "records": BATCH}]}])


def errors(response) -> list[int]:
    return [p.error_code for t in response.responses for p in t.partition_responses]


def test_a_replicated_acks_all_write_waits_for_the_high_watermark():
    log_nodes = FakeLogNodes()
    log_nodes.lagging_high_watermark = True
    purgatory = FakePurgatory(wait_result(True, {"t-0": 2}))
    api = ProduceApi(cache_of(cluster(replicated("t", (0, 1, 2), 2), nodes=(0, 1, 2))),
                     log_nodes, purgatory)
    response = asyncio.run(api.handle(produce(), CONTEXT))
    assert errors(response) == [0]
    assert [(kind, thresholds) for kind, thresholds, _, _ in purgatory.waits] == [
        (purgatory_pb2.OPERATION_KIND_PRODUCE, {"t-0": 2})]


def test_the_leader_checks_min_insync_as_it_appends():
    log_nodes = FakeLogNodes()
    log_nodes.isr[("t", 0)] = (0,)
    api = ProduceApi(cache_of(cluster(replicated("t", (0,), 2), nodes=(0, 1, 2))),
                     log_nodes, FakePurgatory())
    response = asyncio.run(api.handle(produce(), CONTEXT))
    assert errors(response) == [ErrorCode.not_enough_replicas.value]
    [partition] = response.responses[0].partition_responses
    assert "min.isr requirement of 2" in partition.error_message
    [(_, _, [append])] = log_nodes.calls
    assert append.min_insync_replicas == 2
    assert log_nodes.partition("t", 0).batches == []
    # acks=1 does not care about the ISR size.
    response = asyncio.run(api.handle(produce(acks=1), CONTEXT))
    assert errors(response) == [0]
    assert log_nodes.calls[-1][2][0].min_insync_replicas == 0


def test_the_leaders_isr_decides_not_an_older_view_of_it_in_this_handler():
    # The handler's metadata (version 1) still has the ISR shrunk; the leader already has it
    # grown back (at version 5): neither before nor after the append is its older view used.
    log_nodes = FakeLogNodes()
    log_nodes.isr[("t", 0)] = (0, 2)
    log_nodes.partition_epoch = 5
    api = ProduceApi(cache_of(cluster(replicated("t", (0,), 2), nodes=(0, 1, 2), version=1)),
                     log_nodes, FakePurgatory())
    assert errors(asyncio.run(api.handle(produce(), CONTEXT))) == [0]
    # A newer view than the leader's (it appended before learning of the shrink): the write
    # is stored, but not acknowledged.
    log_nodes.isr[("t", 0)] = (0, 1, 2)
    log_nodes.partition_epoch = 0
    assert errors(asyncio.run(api.handle(produce(), CONTEXT))) == [
        ErrorCode.not_enough_replicas_after_append.value]
    assert len(log_nodes.partition("t", 0).batches) == 2
    # And the other way round: the leader's smaller ISR refuses what the handler would pass.
    log_nodes.isr[("t", 0)] = (0,)
    api = ProduceApi(cache_of(cluster(replicated("t", (0, 1, 2), 2), nodes=(0, 1, 2))),
                     log_nodes, FakePurgatory())
    assert errors(asyncio.run(api.handle(produce(), CONTEXT))) == [
        ErrorCode.not_enough_replicas.value]


def test_the_default_min_insync_is_one():
    api = ProduceApi(cache_of(cluster(replicated("t", (0,)), nodes=(0, 1, 2))),
                     FakeLogNodes(), FakePurgatory())
    assert errors(asyncio.run(api.handle(produce(), CONTEXT))) == [0]


def test_an_isr_that_shrank_during_the_wait_is_not_enough_after_append():
    log_nodes = FakeLogNodes()
    log_nodes.lagging_high_watermark = True
    cache = cache_of(cluster(replicated("t", (0, 1), 2), nodes=(0, 1, 2), version=1))

    class ShrinkingPurgatory(FakePurgatory):
        async def wait(self, kind, thresholds, require_all, timeout_ms):  # type: ignore[no-untyped-def]
            # The follower falls out of the ISR; the high watermark then moves without it.
            cache.install(cluster(replicated("t", (0,), 2), nodes=(0, 1, 2), version=2))
            return wait_result(True, thresholds)

    api = ProduceApi(cache, log_nodes, ShrinkingPurgatory())
    response = asyncio.run(api.handle(produce(), CONTEXT))
    assert errors(response) == [ErrorCode.not_enough_replicas_after_append.value]


def test_the_isr_the_leader_reports_with_its_high_watermark_decides_after_the_append():
    """Kafka checks min.insync.replicas when the wait for a partition is satisfied, against
    the leader's ISR at that moment: a shrink that leaves the leader alone moves its high
    watermark at once, before any handler's metadata has the shrink."""
    log_nodes = FakeLogNodes()
    log_nodes.lagging_high_watermark = True
    # This handler's metadata still has both in sync: the leader's report decides.
    cache = cache_of(cluster(replicated("t", (0, 1), 2), nodes=(0, 1, 2), version=3))

    class Reporting(FakePurgatory):
        isr: tuple[int, ...] = ()

        async def wait(self, kind, thresholds, require_all, timeout_ms):  # type: ignore[no-untyped-def]
            return wait_result(True, thresholds, isr=self.isr)

    purgatory = Reporting()
    api = ProduceApi(cache, log_nodes, purgatory)
    purgatory.isr = (0,)
    [refused] = asyncio.run(api.handle(produce(), CONTEXT)).responses[0].partition_responses
    assert refused.error_code == ErrorCode.not_enough_replicas_after_append.value
    assert "ISR [0]" in refused.error_message and "min.isr requirement of 2" in (
        refused.error_message)
    assert len(log_nodes.partition("t", 0).batches) == 1  # stored, not acknowledged
    purgatory.isr = (0, 1)
    assert errors(asyncio.run(api.handle(produce(), CONTEXT))) == [0]
    # A view newer than the report (the ISR shrank after the high watermark had passed, as the
    # leader had it) does not take back what the report satisfied.
    cache.install(cluster(replicated("t", (0,), 2), nodes=(0, 1, 2), version=4))
    assert errors(asyncio.run(api.handle(produce(), CONTEXT))) == [0]
    # Without a report of the ISR, this handler's metadata decides as before.
    purgatory.isr = ()
    assert errors(asyncio.run(api.handle(produce(), CONTEXT))) == [
        ErrorCode.not_enough_replicas_after_append.value]


def test_an_acks_all_wait_is_keyed_by_the_leader_epoch_of_the_append():
    class EpochLogNodes(FakeLogNodes):
        async def append(self, node, request, time_limit,  # type: ignore[no-untyped-def]
                         records=None):
            response = await super().append(node, request, time_limit, records)
            for result in response.results:
                result.leader_epoch, result.topic_id = 4, "tid"
            return response

    log_nodes = EpochLogNodes()
    log_nodes.lagging_high_watermark = True
    # A later leader's report on the plain key does not answer; the epoch's key (with the topic
    # id the leader named) does.
    purgatory = FakePurgatory(wait_result(True, {"t-0@4@tid": 2}))
    api = ProduceApi(cache_of(cluster(replicated("t", (0, 1, 2)), nodes=(0, 1, 2))),
                     log_nodes, purgatory)
    assert errors(asyncio.run(api.handle(produce(), CONTEXT))) == [0]
    assert [thresholds for _, thresholds, _, _ in purgatory.waits] == [{"t-0@4@tid": 2}]


def test_a_leader_that_answers_committed_spares_the_purgatory_wait():
    log_nodes = FakeLogNodes()
    log_nodes.lagging_high_watermark = True
    log_nodes.commits_with = (0, 1, 2)
    purgatory = FakePurgatory()
    cache = cache_of(cluster(replicated("t", (0, 1, 2), 2), nodes=(0, 1, 2)))
    api = ProduceApi(cache, log_nodes, purgatory, leader_wait_ms=100)
    assert errors(asyncio.run(api.handle(produce(), CONTEXT))) == [0]
    assert purgatory.waits == []
    # The leader holds the answer for at most the wait, never past the produce's timeout.
    [(_, _, [append])] = log_nodes.calls
    assert append.min_insync_replicas == 2
    short = produce()
    short.timeout_ms = 40
    asyncio.run(api.handle(short, CONTEXT))
    assert [request.commit_wait_ms for request in log_nodes.append_requests] == [100, 40]
    # The ISR the leader committed with decides min.insync.replicas after the append.
    log_nodes.commits_with = (0,)
    [refused] = asyncio.run(api.handle(produce(), CONTEXT)).responses[0].partition_responses
    assert refused.error_code == ErrorCode.not_enough_replicas_after_append.value
    assert "ISR [0]" in refused.error_message
    assert purgatory.waits == []


def test_what_the_leader_did_not_commit_within_its_wait_waits_in_the_purgatory():
    log_nodes = FakeLogNodes()
    log_nodes.lagging_high_watermark = True
    purgatory = FakePurgatory(wait_result(True, {"t-0": 2}))
    api = ProduceApi(cache_of(cluster(replicated("t", (0, 1, 2), 2), nodes=(0, 1, 2))),
                     log_nodes, purgatory, leader_wait_ms=100)
    assert errors(asyncio.run(api.handle(produce(), CONTEXT))) == [0]
    assert [thresholds for _, thresholds, _, _ in purgatory.waits] == [{"t-0": 2}]
    # acks=1 asks no leader to wait.
    asyncio.run(api.handle(produce(acks=1), CONTEXT))
    assert [request.commit_wait_ms for request in log_nodes.append_requests] == [100, 0]

