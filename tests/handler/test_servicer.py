"""The gRPC glue: APIs by RPC name, defaults for unset fields, request context, APIs this
handler does not serve answered UNSUPPORTED_VERSION, unexpected failures answered as
UNKNOWN_SERVER_ERROR, and requests without a safe answer failing their call."""

import asyncio
from types import SimpleNamespace

import grpc
import pytest

from kbroker.handler.v1 import handler_pb2
from kbroker.kafka.v1 import kafka_pb2 as k
from services.handler import servicer as glue
from services.handler.apis import cluster, fetch, metadata, offsets, produce, topics
from services.handler.collaborators import OutcomeUnknownError
from services.handler.config import HandlerConfig
from services.handler.exchange import ExchangeServicer

from .batches import record_batch
from .fakes import FakeController, FakeLogNodes, FakePurgatory, cache_of, topic
from .fakes import cluster as snapshot


class Context:
    """A plaintext call from a loopback peer (a frontend on the same host)."""

    def __init__(self, metadata=(), peer="ipv4:127.0.0.1:50000", auth=None):
        self._metadata = tuple(metadata)
        self._peer = peer
        self._auth = auth or {"transport_security_type": [b"insecure"]}

    def invocation_metadata(self):
        return self._metadata

    def peer(self):
        return self._peer

    def auth_context(self):
        return self._auth

    async def abort(self, code, details):
        raise AbortedError(code, details)


class AbortedError(Exception):
    """What grpc.aio's ServicerContext.abort raises, as this test sees it."""

    def __init__(self, code, details):
        super().__init__(details)
        self.code = code


def make_servicer(metadata_snapshot, log_nodes=None, controller=None, broker_ports=1):
    cache = cache_of(metadata_snapshot)
    log_nodes = log_nodes or FakeLogNodes()
    purgatory = FakePurgatory()
    controller = controller or FakeController(metadata_snapshot)
    apis = {
        "CreateTopics": topics.CreateTopicsApi(cache, controller),
        "DeleteTopics": topics.DeleteTopicsApi(cache, controller),
        "Produce": produce.ProduceApi(cache, log_nodes, purgatory),
        "Metadata": metadata.MetadataApi(cache, controller, True),
        "Fetch": fetch.FetchApi(cache, log_nodes, purgatory),
        "ListOffsets": offsets.ListOffsetsApi(cache, log_nodes),
        "DescribeCluster": cluster.DescribeClusterApi(cache),
    }
    return glue.KafkaHandlerServicer(
        HandlerConfig(advertised="default.host:9000", broker_ports=broker_ports), apis)


def test_unset_fields_take_kafka_defaults():
    metadata_snapshot = snapshot(topic("t"))
    controller = FakeController(metadata_snapshot)
    servicer = make_servicer(metadata_snapshot, controller=controller)
    request = k.CreateTopicsRequest(topics=[
        k.CreateTopicsRequest.CreatableTopic(name="a", configs=[
            k.CreateTopicsRequest.CreatableTopicConfig(name="x")])])
    response = asyncio.run(servicer.CreateTopics(request, Context()))
    # No partition count: the broker default; a config without a value: INVALID_CONFIG.
    assert [(t.name, t.error_code) for t in response.topics] == [("a", 40)]
    request = k.CreateTopicsRequest(topics=[k.CreateTopicsRequest.CreatableTopic(name="a")])
    asyncio.run(servicer.CreateTopics(request, Context()))
    ((sent, _),) = controller.created
    assert (sent[0].num_partitions, sent[0].replication_factor) == (-1, -1)


def test_an_api_this_handler_does_not_serve_answers_unsupported_version():
    servicer = make_servicer(snapshot(topic("t")))
    request = k.OffsetCommitRequest(group_id="g", topics=[
        {"name": "t", "partitions": [{"partition_index": 0}, {"partition_index": 1}]}])
    response = asyncio.run(servicer.OffsetCommit(request, Context()))
    assert [(p.partition_index, p.error_code) for p in response.topics[0].partitions] == [
        (0, 35), (1, 35)]


def test_the_advertised_address_comes_from_the_frontend_or_the_config():
    servicer = make_servicer(snapshot(topic("t"), nodes=(0, 1)))

    async def main():
        request = k.MetadataRequest(topics_is_null=True)
        with_frontend = await servicer.Metadata(
            request, Context([("kafka-advertised", "front.example:19092"),
                              ("kafka-client-id", "me")]))
        without = await servicer.Metadata(request, Context())
        malformed = await servicer.Metadata(request, Context([("kafka-advertised", "junk")]))
        return with_frontend, without, malformed

    with_frontend, without, malformed = asyncio.run(main())
    assert {(b.host, b.port) for b in with_frontend.brokers} == {("front.example", 19092)}
    assert {(b.host, b.port) for b in without.brokers} == {("default.host", 9000)}
    assert {(b.host, b.port) for b in malformed.brokers} == {("default.host", 9000)}
    assert [b.node_id for b in without.brokers] == [0, 1]


def test_each_broker_id_gets_a_port_of_its_own_when_the_frontend_serves_one():
    async def main(servicer, metadata=()):
        response = await servicer.Metadata(k.MetadataRequest(topics_is_null=True),
                                           Context(metadata))
        return [(b.node_id, b.host, b.port) for b in response.brokers]

    nodes = snapshot(topic("t"), nodes=(0, 1, 2))
    from_frontend = asyncio.run(main(make_servicer(nodes), [
        ("kafka-advertised", "front.example:19092"), ("kafka-broker-ports", "3")]))
    assert from_frontend == [(0, "front.example", 19092), (1, "front.example", 19093),
                             (2, "front.example", 19094)]
    # Brokers beyond the frontend's ports share its first port.
    two_ports = asyncio.run(main(make_servicer(nodes), [
        ("kafka-advertised", "front.example:19092"), ("kafka-broker-ports", "2")]))
    assert [port for _, _, port in two_ports] == [19092, 19093, 19092]
    # Called directly (grpcurl): the handler's own configuration.
    direct = asyncio.run(main(make_servicer(nodes, broker_ports=3)))
    assert direct == [(0, "default.host", 9000), (1, "default.host", 9001),
                      (2, "default.host", 9002)]


def test_unexpected_failures_become_unknown_server_error_per_item():
    class Broken(FakeLogNodes):
        async def append(self, node, request, time_limit, records=None):
            raise RuntimeError("boom")

        async def list_offsets(self, node, request, time_limit):
            return SimpleNamespace(results=[None])  # a malformed answer

    class BrokenController(FakeController):
        async def create_topics(self, request, time_limit):
            raise RuntimeError("boom")

    servicer = make_servicer(snapshot(topic("t")), Broken(),
                             BrokenController(snapshot(topic("t"))))

    async def main():
        produced = await servicer.Produce(k.ProduceRequest(acks=1, topic_data=[
            k.ProduceRequest.TopicProduceData(name="t", partition_data=[
                k.ProduceRequest.PartitionProduceData(index=0, records=b"x")])]), Context())
        listed = await servicer.ListOffsets(k.ListOffsetsRequest(topics=[
            k.ListOffsetsRequest.ListOffsetsTopic(name="t", partitions=[
                k.ListOffsetsRequest.ListOffsetsPartition(partition_index=0, timestamp=-1)])]),
            Context())
        created = await servicer.CreateTopics(k.CreateTopicsRequest(topics=[
            k.CreateTopicsRequest.CreatableTopic(name="n")]), Context())
        return produced, listed, created

    produced, listed, created = asyncio.run(main())
    assert produced.responses[0].partition_responses[0].error_code == -1
    assert listed.topics[0].partitions[0].error_code == -1
    assert [(t.name, t.error_code) for t in created.topics] == [("n", -1)]


def test_a_produce_without_a_safe_answer_fails_its_call_on_both_paths():
    """An idempotent append whose outcome is unknown: DEADLINE_EXCEEDED, over a unary call and
    over the stream, which the frontend answers by closing the client's connection."""
    class Unknown(FakeLogNodes):
        async def append(self, node, request, time_limit, records=None):
            raise OutcomeUnknownError("the log node's stream broke")

    servicer = make_servicer(snapshot(topic("t")), Unknown())
    request = k.ProduceRequest(acks=-1, timeout_ms=1000, topic_data=[
        k.ProduceRequest.TopicProduceData(name="t", partition_data=[
            k.ProduceRequest.PartitionProduceData(
                index=0, records=record_batch([b"a"], producer_id=3))])])

    async def main():
        with pytest.raises(AbortedError) as unary:
            await servicer.Produce(request, Context())
        assert unary.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
        call = handler_pb2.HandlerCall(call_id=5, method="Produce",
                                       request=request.SerializeToString())
        reply = handler_pb2.HandlerReply.FromString(
            await ExchangeServicer(servicer).serve_one(call.SerializeToString(),
                                                        "ipv4:127.0.0.1:50000"))
        assert (reply.call_id, reply.status_code) == (
            5, grpc.StatusCode.DEADLINE_EXCEEDED.value[0])
        assert "t-0" in reply.status_details

    asyncio.run(main())
