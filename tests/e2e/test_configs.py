"""Topic configs and partition counts through librdkafka's AdminClient against a real local
cluster: DescribeConfigs, AlterConfigs, IncrementalAlterConfigs and CreatePartitions, with the
changes observed by producers and consumers."""

from __future__ import annotations

import time
import warnings

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    NewTopic,
)

TIMEOUT = 20


def admin_for(cluster) -> AdminClient:  # type: ignore[no-untyped-def]
    return AdminClient({"bootstrap.servers": cluster.bootstrap})


def create_topic(admin: AdminClient, name: str, partitions: int) -> None:
    futures = admin.create_topics([NewTopic(name, num_partitions=partitions,
                                            replication_factor=1)], request_timeout=15)
    futures[name].result(timeout=TIMEOUT)


def describe_topic(admin: AdminClient, name: str) -> dict[str, ConfigEntry]:
    resource = ConfigResource(ConfigResource.Type.TOPIC, name)
    return admin.describe_configs([resource], request_timeout=15)[resource].result(
        timeout=TIMEOUT)


def test_describe_configs_of_a_topic_and_a_broker(cluster, topic_name):
    admin = admin_for(cluster)
    create_topic(admin, topic_name, 1)
    configs = describe_topic(admin, topic_name)
    retention = configs["retention.ms"]
    assert retention.value == "604800000"
    assert retention.source == ConfigSource.DEFAULT_CONFIG.value
    assert not retention.is_read_only and not retention.is_sensitive
    assert configs["cleanup.policy"].value == "delete"

    broker = ConfigResource(ConfigResource.Type.BROKER, "0")
    entries = admin.describe_configs([broker], request_timeout=15)[broker].result(
        timeout=TIMEOUT)
    assert entries["broker.id"].value == "0" and entries["broker.id"].is_read_only
    assert entries["log.retention.ms"].value == "604800000"

    missing = ConfigResource(ConfigResource.Type.TOPIC, f"{topic_name}-missing")
    with pytest.raises(KafkaException) as info:
        admin.describe_configs([missing], request_timeout=15)[missing].result(timeout=TIMEOUT)
    assert info.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART


def test_alter_and_incremental_alter_configs(cluster, topic_name):
    admin = admin_for(cluster)
    create_topic(admin, topic_name, 1)
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic_name,
                              set_config={"retention.ms": "3600000", "segment.ms": "600000"})
    with warnings.catch_warnings():
        # Deprecated in favour of the incremental API, but still what older tools send.
        warnings.simplefilter("ignore", DeprecationWarning)
        admin.alter_configs([resource], request_timeout=15)[resource].result(timeout=TIMEOUT)
    configs = describe_topic(admin, topic_name)
    assert configs["retention.ms"].value == "3600000"
    assert configs["retention.ms"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert configs["segment.ms"].value == "600000"

    incremental = ConfigResource(ConfigResource.Type.TOPIC, topic_name, incremental_configs=[
        ConfigEntry("segment.ms", None, incremental_operation=AlterConfigOpType.DELETE),
        ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.APPEND),
        ConfigEntry("max.message.bytes", "300", incremental_operation=AlterConfigOpType.SET),
    ])
    admin.incremental_alter_configs([incremental], request_timeout=15)[incremental].result(
        timeout=TIMEOUT)
    configs = describe_topic(admin, topic_name)
    assert configs["retention.ms"].value == "3600000"
    assert configs["segment.ms"].source == ConfigSource.DEFAULT_CONFIG.value
    assert configs["cleanup.policy"].value == "delete,compact"
    assert configs["max.message.bytes"].value == "300"

    # The log node enforces the new limit at once.
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "message.max.bytes": 100_000,
                         "retries": 0})
    errors: list[KafkaError] = []
    producer.produce(topic_name, value=b"x" * 2000, key=b"k",
                     on_delivery=lambda err, _msg: errors.append(err))
    assert producer.flush(30) == 0
    assert errors and errors[0] is not None
    assert errors[0].code() == KafkaError.MSG_SIZE_TOO_LARGE

    bad = ConfigResource(ConfigResource.Type.TOPIC, topic_name, incremental_configs=[
        ConfigEntry("retention.ms", "forever", incremental_operation=AlterConfigOpType.SET)])
    with pytest.raises(KafkaException) as info:
        admin.incremental_alter_configs([bad], request_timeout=15)[bad].result(timeout=TIMEOUT)
    assert info.value.args[0].code() == KafkaError.INVALID_CONFIG
    append = ConfigResource(ConfigResource.Type.TOPIC, topic_name, incremental_configs=[
        ConfigEntry("retention.ms", "1", incremental_operation=AlterConfigOpType.APPEND)])
    with pytest.raises(KafkaException) as info:
        admin.incremental_alter_configs([append], request_timeout=15)[append].result(
            timeout=TIMEOUT)
    assert info.value.args[0].code() == KafkaError.INVALID_CONFIG
    assert describe_topic(admin, topic_name)["retention.ms"].value == "3600000"


def test_create_partitions_and_use_them(cluster, topic_name):
    admin = admin_for(cluster)
    create_topic(admin, topic_name, 1)
    futures = admin.create_partitions([NewPartitions(topic_name, 3)], request_timeout=15)
    futures[topic_name].result(timeout=TIMEOUT)

    deadline = time.monotonic() + TIMEOUT
    while len(admin.list_topics(topic_name, timeout=10).topics[topic_name].partitions) < 3:
        assert time.monotonic() < deadline
        time.sleep(0.1)

    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all",
                         "topic.metadata.refresh.interval.ms": 500})
    failures: list[str] = []
    for partition in range(3):
        producer.produce(topic_name, value=f"v{partition}".encode(), partition=partition,
                         on_delivery=lambda err, _msg: err and failures.append(str(err)))
    assert producer.flush(30) == 0
    assert failures == []

    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": f"g-{topic_name}",
                         "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic_name, p, 0) for p in range(3)])
        got: dict[int, bytes] = {}
        deadline = time.monotonic() + 30
        while len(got) < 3 and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            got[msg.partition()] = msg.value()
    finally:
        consumer.close()
    assert got == {0: b"v0", 1: b"v1", 2: b"v2"}

    shrink = admin.create_partitions([NewPartitions(topic_name, 2)], request_timeout=15)
    with pytest.raises(KafkaException) as info:
        shrink[topic_name].result(timeout=TIMEOUT)
    assert info.value.args[0].code() == KafkaError.INVALID_PARTITIONS
    missing = f"{topic_name}-missing"
    unknown = admin.create_partitions([NewPartitions(missing, 2)], request_timeout=15)
    with pytest.raises(KafkaException) as info:
        unknown[missing].result(timeout=TIMEOUT)
    assert info.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART
