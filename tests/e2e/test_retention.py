"""Retention seen by real clients against a real local cluster: with a small retention.ms or
retention.bytes and small segments, old segments go in the background (every 500 ms in the
test cluster, see tests/conftest.py), ListOffsets earliest moves forward, and a consumer asking
for offset 0 gets OFFSET_OUT_OF_RANGE and, with auto.offset.reset=earliest, starts again at the
new log start offset."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

TIMEOUT = 60


def create_topic(bootstrap: str, name: str, configs: dict[str, str]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(name, num_partitions=1, replication_factor=1,
                                            config=configs)], request_timeout=15)
    futures[name].result(timeout=20)


def produce_rounds(bootstrap: str, topic: str, rounds: int, per_round: int) -> list[int]:
    """Records in rounds a little more than segment.ms apart (so segments roll); returns the
    offsets delivered."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    offsets: list[int] = []
    errors: list[str] = []

    def on_delivery(err, msg) -> None:  # type: ignore[no-untyped-def]
        if err is not None:
            errors.append(str(err))
        else:
            offsets.append(msg.offset())

    for round_ in range(rounds):
        for i in range(per_round):
            producer.produce(topic, value=b"%d-%d" % (round_, i) * 10, on_delivery=on_delivery)
        assert producer.flush(30) == 0
        time.sleep(0.12)
    assert errors == []
    return sorted(offsets)


def earliest_offset(bootstrap: str, topic: str) -> int:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    partition = TopicPartition(topic, 0)
    result = admin.list_offsets({partition: OffsetSpec.earliest()}, request_timeout=10)
    return result[partition].result(timeout=15).offset


@pytest.mark.parametrize("configs", [
    {"retention.ms": "1500", "segment.ms": "100"},
    {"retention.bytes": "1200", "segment.bytes": "1000", "retention.ms": "-1"},
], ids=["retention.ms", "retention.bytes"])
def test_a_consumer_at_offset_zero_restarts_at_the_new_log_start(cluster, topic_name, configs):
    create_topic(cluster.bootstrap, topic_name, configs)
    offsets = produce_rounds(cluster.bootstrap, topic_name, rounds=8, per_round=10)
    assert offsets == list(range(80))

    deadline = time.monotonic() + TIMEOUT
    while earliest_offset(cluster.bootstrap, topic_name) == 0:
        assert time.monotonic() < deadline, "retention never deleted a segment"
        time.sleep(0.2)
    # Let retention finish with what is old enough, so the log start stays put while reading.
    time.sleep(2.5)
    start = earliest_offset(cluster.bootstrap, topic_name)
    assert 0 < start < 80

    consumer = Consumer({"bootstrap.servers": cluster.bootstrap,
                         "group.id": f"g-{uuid.uuid4().hex}", "enable.auto.commit": False,
                         "auto.offset.reset": "earliest", "fetch.wait.max.ms": 50})
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic_name, 0), timeout=10)
        assert high == 80 and low >= start
        consumer.assign([TopicPartition(topic_name, 0, 0)])  # no longer in the log
        got: list[int] = []
        deadline = time.monotonic() + 30
        while (not got or got[-1] < 79) and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert not msg.error() or msg.error().code() == KafkaError._PARTITION_EOF
            if not msg.error():
                got.append(msg.offset())
    finally:
        consumer.close()
    # Reset to the earliest offset still in the log, then everything after it in order.
    assert got and got[0] >= start > 0
    assert got == list(range(got[0], 80))
