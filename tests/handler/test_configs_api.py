"""DescribeConfigs, AlterConfigs and IncrementalAlterConfigs through a handler against the real
replicator and log nodes."""

from __future__ import annotations

import asyncio
from pathlib import Path

from kbroker.kafka.v1 import kafka_pb2 as k

from .batches import record_batch
from .harness import CALL_TIMEOUT, Cluster, running_cluster

TOPIC, BROKER = 2, 4
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3
TOPIC_CONFIG, STATIC_BROKER_CONFIG, DEFAULT_CONFIG = 1, 4, 5

Describe = k.DescribeConfigsRequest.DescribeConfigsResource
Alter = k.AlterConfigsRequest.AlterConfigsResource
Incremental = k.IncrementalAlterConfigsRequest.AlterConfigsResource


async def describe(cluster: Cluster, *resources: Describe, synonyms: bool = False,
                   documentation: bool = False) -> k.DescribeConfigsResponse:
    return await cluster.stub.DescribeConfigs(
        k.DescribeConfigsRequest(resources=resources, include_synonyms=synonyms,
                                 include_documentation=documentation), timeout=CALL_TIMEOUT)


async def incremental(cluster: Cluster, *resources: Incremental, validate_only: bool = False
                      ) -> k.IncrementalAlterConfigsResponse:
    return await cluster.stub.IncrementalAlterConfigs(
        k.IncrementalAlterConfigsRequest(resources=resources, validate_only=validate_only),
        timeout=CALL_TIMEOUT)


def op(name: str, operation: int, value: str | None = None
       ) -> k.IncrementalAlterConfigsRequest.AlterableConfig:
    config = k.IncrementalAlterConfigsRequest.AlterableConfig(name=name,
                                                              config_operation=operation)
    if value is not None:
        config.value = value
    return config


async def topic_configs(cluster: Cluster, name: str) -> dict[str, tuple[str, int]]:
    response = await describe(cluster, Describe(resource_type=TOPIC, resource_name=name,
                                                configuration_keys_is_null=True))
    (result,) = response.results
    assert result.error_code == 0, result
    return {c.name: (c.value, c.config_source) for c in result.configs}


def test_describe_topic_and_broker_configs(tmp_path: Path) -> None:
    async def scenario(tmp_path: Path) -> None:
        async with running_cluster(tmp_path) as cluster:
            await cluster.create_topic("t")
            response = await describe(
                cluster,
                Describe(resource_type=TOPIC, resource_name="t", configuration_keys_is_null=True),
                Describe(resource_type=TOPIC, resource_name="missing",
                         configuration_keys_is_null=True),
                Describe(resource_type=BROKER, resource_name="0",
                         configuration_keys=["log.retention.ms", "broker.id"]),
                Describe(resource_type=99, resource_name="x", configuration_keys_is_null=True),
                synonyms=True, documentation=True)
            topic, missing, broker, unknown = response.results
            assert topic.error_code == 0
            configs = {c.name: c for c in topic.configs}
            retention = configs["retention.ms"]
            assert (retention.value, retention.config_source, retention.read_only,
                    retention.is_sensitive, retention.config_type) == (
                "604800000", DEFAULT_CONFIG, False, False, 5)
            assert retention.documentation
            assert [(s.name, s.source) for s in retention.synonyms] == [
                ("log.retention.ms", DEFAULT_CONFIG)]
            assert configs["cleanup.policy"].config_type == 7
            assert (missing.error_code, missing.resource_name) == (3, "missing")
            assert broker.error_code == 0
            assert {c.name: (c.value, c.read_only, c.config_source) for c in broker.configs} == {
                "log.retention.ms": ("604800000", False, DEFAULT_CONFIG),
                "broker.id": ("0", True, STATIC_BROKER_CONFIG)}
            assert unknown.error_code == 42  # INVALID_REQUEST

    asyncio.run(scenario(tmp_path))


def test_incremental_alter_configs_reach_metadata_and_the_log_node(tmp_path: Path) -> None:
    async def scenario(tmp_path: Path) -> None:
        async with running_cluster(tmp_path) as cluster:
            await cluster.create_topic("t")
            response = await incremental(cluster, Incremental(
                resource_type=TOPIC, resource_name="t", configs=[
                    op("max.message.bytes", SET, "200"),
                    op("cleanup.policy", APPEND, "compact")]))
            assert [(r.error_code, r.resource_name) for r in response.responses] == [(0, "t")]
            configs = await topic_configs(cluster, "t")
            assert configs["max.message.bytes"] == ("200", TOPIC_CONFIG)
            assert configs["cleanup.policy"] == ("delete,compact", TOPIC_CONFIG)
            assert configs["retention.ms"] == ("604800000", DEFAULT_CONFIG)
            # The log node applies the new limit without a restart.
            big = await cluster.produce("t", 0, record_batch([b"x" * 500]))
            assert big.error_code == 10  # MESSAGE_TOO_LARGE

            response = await incremental(cluster, Incremental(
                resource_type=TOPIC, resource_name="t", configs=[
                    op("max.message.bytes", DELETE),
                    op("cleanup.policy", SUBTRACT, "delete")]))
            assert response.responses[0].error_code == 0
            configs = await topic_configs(cluster, "t")
            assert configs["max.message.bytes"] == ("1048588", DEFAULT_CONFIG)
            assert configs["cleanup.policy"] == ("compact", TOPIC_CONFIG)
            # A compacted topic takes keyed records only (INVALID_RECORD otherwise).
            keyless = await cluster.produce("t", 0, record_batch([b"x" * 500]))
            assert keyless.error_code == 87
            big = await cluster.produce("t", 0, record_batch([b"x" * 500], keys=[b"k"]))
            assert big.error_code == 0

    asyncio.run(scenario(tmp_path))


def test_alter_configs_replaces_the_set_and_errors_are_per_resource(tmp_path: Path) -> None:
    async def scenario(tmp_path: Path) -> None:
        async with running_cluster(tmp_path) as cluster:
            await cluster.create_topic("t")
            await incremental(cluster, Incremental(resource_type=TOPIC, resource_name="t",
                                                   configs=[op("retention.ms", SET, "1000")]))
            config = k.AlterConfigsRequest.AlterableConfig
            response = await cluster.stub.AlterConfigs(k.AlterConfigsRequest(resources=[
                Alter(resource_type=TOPIC, resource_name="t",
                      configs=[config(name="segment.ms", value="5000")]),
                Alter(resource_type=TOPIC, resource_name="missing",
                      configs=[config(name="segment.ms", value="5000")]),
            ], validate_only=False), timeout=CALL_TIMEOUT)
            assert [r.error_code for r in response.responses] == [0, 3]
            configs = await topic_configs(cluster, "t")
            assert configs["segment.ms"] == ("5000", TOPIC_CONFIG)
            assert configs["retention.ms"] == ("604800000", DEFAULT_CONFIG)

            response = await incremental(
                cluster,
                Incremental(resource_type=TOPIC, resource_name="t",
                            configs=[op("retention.ms", SET, "soon")]),
                Incremental(resource_type=TOPIC, resource_name="t2", configs=[]),
                Incremental(resource_type=TOPIC, resource_name="t2", configs=[]),
                Incremental(resource_type=32, resource_name="g", configs=[]),
            )
            codes = [r.error_code for r in response.responses]
            assert codes == [40, 42, 42, 42]
            assert "retention.ms" in response.responses[0].error_message
            response = await incremental(cluster, Incremental(
                resource_type=TOPIC, resource_name="t", configs=[op("segment.ms", APPEND, "1")]))
            assert response.responses[0].error_code == 40
            response = await incremental(cluster, Incremental(
                resource_type=TOPIC, resource_name="t",
                configs=[op("segment.ms", SET, "1"), op("segment.ms", DELETE)]))
            assert response.responses[0].error_code == 42
            # validate_only checks without changing anything.
            response = await incremental(cluster, Incremental(
                resource_type=TOPIC, resource_name="t", configs=[op("segment.ms", SET, "7")]),
                validate_only=True)
            assert response.responses[0].error_code == 0
            assert (await topic_configs(cluster, "t"))["segment.ms"] == ("5000", TOPIC_CONFIG)

    asyncio.run(scenario(tmp_path))

