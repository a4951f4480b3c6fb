import asyncio

from kbroker.kafka.v1 import kafka_pb2 as k
from services.handler.apis.cluster import (
    AUTHORIZED_OPERATIONS_OMITTED,
    CLUSTER_OPERATIONS,
    DescribeClusterApi,
)
from services.handler.metadata_cache import MetadataCache
from services.handler.request_context import split_host_port

from .fakes import CONTEXT, cache_of, cluster


def describe(request, snapshot):
    return asyncio.run(DescribeClusterApi(cache_of(snapshot)).handle(request, CONTEXT))


def test_every_log_node_is_a_broker_at_the_advertised_address():
    # endpoint_type unset (a hand-made request): brokers. Node 3 stopped answering but is not
    # fenced yet; node 1 is fenced: both are still brokers (the frontend serves their ports).
    response = describe(k.DescribeClusterRequest(),
                        cluster(nodes=(2, 0), dead=(3,), fenced=(1,), controller=1))
    assert response.error_code == 0
    assert [(b.broker_id, b.host, b.port, b.is_fenced) for b in response.brokers] == [
        (0, "kafka.example", 9092, False), (1, "kafka.example", 9092, False),
        (2, "kafka.example", 9092, False), (3, "kafka.example", 9092, False)]
    assert response.endpoint_type == 1
    assert response.cluster_id == "test-cluster"
    assert response.controller_id == 0
    assert response.cluster_authorized_operations == AUTHORIZED_OPERATIONS_OMITTED
    response = describe(k.DescribeClusterRequest(include_cluster_authorized_operations=True),
                        cluster())
    assert response.cluster_authorized_operations == CLUSTER_OPERATIONS


def test_endpoint_types():
    response = describe(k.DescribeClusterRequest(endpoint_type=2), cluster())
    assert (response.error_code, list(response.brokers), response.endpoint_type) == (114, [], 2)
    response = describe(k.DescribeClusterRequest(endpoint_type=9), cluster())
    assert (response.error_code, response.endpoint_type) == (115, 9)
    assert response.error_message == "Unsupported endpoint type 9"


def test_without_metadata_a_retriable_error():
    async def main():
        async def down():
            raise ConnectionError("no replicator")

        return await DescribeClusterApi(MetadataCache(down)).handle(
            k.DescribeClusterRequest(), CONTEXT)

    response = asyncio.run(main())
    assert response.error_code == 7 and response.HasField("error_message")
    assert list(response.brokers) == [] and response.controller_id == -1


def test_advertised_addresses():
    assert split_host_port("kafka:9092") == ("kafka", 9092)
    assert split_host_port("[::1]:19092") == ("::1", 19092)
    for bad in ["kafka", ":9092", "kafka:", "kafka:99999", "kafka:x"]:
        try:
            split_host_port(bad)
        except ValueError:
            continue
        raise AssertionError(bad)
