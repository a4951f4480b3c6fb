"""librdkafka (confluent-kafka) against a real local cluster: admin, every compression codec,
keys, headers and timestamps, consumed back exactly and in order per partition."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

from .records import COMPRESSION_CODECS, Message, assert_same, make_messages

PARTITIONS = 3


def create_topic(bootstrap: str, name: str, partitions: int = PARTITIONS) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(name, num_partitions=partitions,
                                            replication_factor=1)], request_timeout=15)
    futures[name].result(timeout=20)


def produce(bootstrap: str, topic: str, messages: list[Message], codec: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "compression.codec": codec,
                         "linger.ms": 5, "acks": "all"})
    failures: list[str] = []

    def on_delivery(err, _msg) -> None:
        if err is not None:
            failures.append(str(err))

    for m in messages:
        producer.produce(topic, value=m.value, key=m.key, partition=m.partition,
                         headers=list(m.headers), timestamp=m.timestamp_ms,
                         on_delivery=on_delivery)
    assert producer.flush(30) == 0
    assert failures == []


def consume_all(bootstrap: str, topic: str, expected: int, partitions: int = PARTITIONS,
                isolation: str = "read_uncommitted", within: float = 30) -> list[Message]:
    """Every record of ``topic`` from the start: until ``expected`` records are read and every
    partition reached its end, or ``within`` seconds passed."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{topic}",
                         "enable.auto.commit": False, "enable.partition.eof": True,
                         "isolation.level": isolation})
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        got: list[Message] = []
        eof: set[int] = set()
        deadline = time.monotonic() + within
        while (len(got) < expected or len(eof) < partitions) and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    eof.add(msg.partition())
                    continue
                raise KafkaException(msg.error())
            eof.discard(msg.partition())
            _ts_type, ts = msg.timestamp()
            got.append(Message(msg.partition(), msg.key(), msg.value(),
                               tuple(msg.headers() or ()), ts))
        return got
    finally:
        consumer.close()


@pytest.mark.parametrize("codec", COMPRESSION_CODECS)
def test_roundtrip_every_codec(cluster, topic_name, codec):
    create_topic(cluster.bootstrap, topic_name)
    sent = make_messages(codec, 300, PARTITIONS)
    produce(cluster.bootstrap, topic_name, sent, codec)
    assert_same(sent, consume_all(cluster.bootstrap, topic_name, len(sent)))


def test_metadata_lists_brokers_and_topic(cluster, topic_name):
    create_topic(cluster.bootstrap, topic_name)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    md = admin.list_topics(timeout=10)
    assert sorted(md.brokers) == [0, 1, 2]
    # Each broker id has an address of its own: the frontend serves broker N on port + N.
    for broker_id, broker in md.brokers.items():
        assert (broker.host, broker.port) == ("127.0.0.1", cluster.kafka_port + broker_id)
    topic = md.topics[topic_name]
    assert topic.error is None
    assert sorted(topic.partitions) == [0, 1, 2]
    leaders = {p.leader for p in topic.partitions.values()}
    assert leaders <= {0, 1, 2}


def test_create_existing_topic_is_refused(cluster, topic_name):
    create_topic(cluster.bootstrap, topic_name)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    fut = admin.create_topics([NewTopic(topic_name, num_partitions=1, replication_factor=1)])
    with pytest.raises(KafkaException) as info:
        fut[topic_name].result(timeout=20)
    assert info.value.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS


def test_invalid_topic_requests(cluster, topic_name):
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    cases = {
        "bad name!": (NewTopic("bad name!", num_partitions=1, replication_factor=1),
                      KafkaError.TOPIC_EXCEPTION),
        f"{topic_name}-rf": (NewTopic(f"{topic_name}-rf", num_partitions=1,
                                      replication_factor=4),
                             KafkaError.INVALID_REPLICATION_FACTOR),
    }
    futures = admin.create_topics([c[0] for c in cases.values()], request_timeout=15)
    for name, (_, code) in cases.items():
        with pytest.raises(KafkaException) as info:
            futures[name].result(timeout=20)
        assert info.value.args[0].code() == code, name


def test_auto_create_on_produce(cluster, topic_name):
    sent = [Message(0, b"k", b"auto-created", (), 1_700_000_000_000)]
    produce(cluster.bootstrap, topic_name, sent, "none")
    assert consume_all(cluster.bootstrap, topic_name, 1, partitions=1) == sent


def test_delete_topic(cluster, topic_name):
    create_topic(cluster.bootstrap, topic_name)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.delete_topics([topic_name], request_timeout=15)[topic_name].result(timeout=20)
    deadline = time.monotonic() + 10
    while topic_name in admin.list_topics(timeout=10).topics:
        assert time.monotonic() < deadline
        time.sleep(0.2)


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_offsets_for_times_find_the_record_inside_a_batch(cluster, topic_name, compression):
    """Ten records in one batch, timestamps one second apart: offsets_for_times answers the
    record at or after each time, not the batch's first record, and the admin client's
    max-timestamp offset is the record carrying the largest timestamp."""
    create_topic(cluster.bootstrap, topic_name, partitions=1)
    base = 1_700_000_000_000
    stamps = [base + 1000 * i for i in (0, 1, 2, 3, 9, 4, 5, 6, 7, 8)]  # 9 s at offset 4
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "linger.ms": 1000,
                         "compression.type": compression})
    for i, stamp in enumerate(stamps):
        producer.produce(topic_name, value=b"v%d" % i, partition=0, timestamp=stamp)
    assert producer.flush(15) == 0
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "x"})
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    try:
        partition = TopicPartition(topic_name, 0)
        assert consumer.get_watermark_offsets(partition, timeout=10) == (0, 10)
        for target, offset in ((base, 0), (base + 2500, 3), (base + 4000, 4), (base + 8500, 4),
                               (base + 9000, 4), (base + 9001, -1)):
            found = consumer.offsets_for_times(
                [TopicPartition(topic_name, 0, target)], timeout=10)
            assert found[0].offset == offset, f"time {target - base} ms"
        answers = admin.list_offsets({partition: OffsetSpec.max_timestamp()},
                                     request_timeout=10)
        newest = answers[partition].result(timeout=15)
        assert (newest.offset, newest.timestamp) == (4, base + 9000)
    finally:
        consumer.close()


def test_offsets_for_times_and_watermarks(cluster, topic_name):
    create_topic(cluster.bootstrap, topic_name, partitions=1)
    sent = [Message(0, None, f"v{i}".encode(), (), 1_700_000_000_000 + 1000 * i)
            for i in range(10)]
    # One batch per message, so every timestamp starts a batch.
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "linger.ms": 0})
    for m in sent:
        producer.produce(topic_name, value=m.value, partition=0, timestamp=m.timestamp_ms)
        producer.flush(10)
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "x"})
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic_name, 0), timeout=10)
        assert (low, high) == (0, 10)
        found = consumer.offsets_for_times(
            [TopicPartition(topic_name, 0, 1_700_000_000_000 + 4500)], timeout=10)
        assert found[0].offset == 5
        beyond = consumer.offsets_for_times(
            [TopicPartition(topic_name, 0, 1_800_000_000_000)], timeout=10)
        assert beyond[0].offset == -1
    finally:
        consumer.close()
