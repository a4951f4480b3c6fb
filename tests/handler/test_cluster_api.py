import asyncio

from services.handler.apis.cluster import (
    AUTHORIZED_OPERATIONS_OMITTED,
    CLUSTER_OPERATIONS,
    DescribeClusterApi,
    DescribeClusterRequest,
)
from services.handler.request_context import split_host_port

from .fakes import CONTEXT, cache_of, cluster


def describe(request, snapshot):
    return asyncio.run(DescribeClusterApi(cache_of(snapshot)).handle(request, CONTEXT))


def test_live_log_nodes_are_the_brokers_at_the_advertised_address():
    response = describe(DescribeClusterRequest(), cluster(nodes=(2, 0), dead=(1,), controller=1))
    assert response.error_code == 0
    assert [(b.node_id, b.host, b.port) for b in response.brokers] == [
        (0, "kafka.example", 9092), (2, "kafka.example", 9092)]
    assert response.cluster_id == "test-cluster"
    assert response.controller_id == 0
    assert response.cluster_authorized_operations == AUTHORIZED_OPERATIONS_OMITTED
    response = describe(DescribeClusterRequest(include_cluster_authorized_operations=True),
                        cluster())
    assert response.cluster_authorized_operations == CLUSTER_OPERATIONS


def test_endpoint_types():
    response = describe(DescribeClusterRequest(endpoint_type=2), cluster())
    assert (response.error_code, response.brokers) == (114, [])
    response = describe(DescribeClusterRequest(endpoint_type=9), cluster())
    assert response.error_code == 115
    assert response.error_message == "Unsupported endpoint type 9"


def test_advertised_addresses():
    assert split_host_port("kafka:9092") == ("kafka", 9092)
    assert split_host_port("[::1]:19092") == ("::1", 19092)
    for bad in ["kafka", ":9092", "kafka:", "kafka:99999", "kafka:x"]:
        try:
            split_host_port(bad)
        except ValueError:
            continue
        raise AssertionError(bad)
