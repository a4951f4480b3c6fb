"""kafka-python against a real local cluster: every codec, keys, headers, timestamps."""

from __future__ import annotations

import time

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic

from .records import COMPRESSION_CODECS, Message, assert_same, make_messages

PARTITIONS = 3


@pytest.mark.parametrize("codec", COMPRESSION_CODECS)
def test_roundtrip_every_codec(cluster, topic_name, codec):
    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap)
    try:
        admin.create_topics([NewTopic(topic_name, PARTITIONS, 1)])
    finally:
        admin.close()
    sent = make_messages(codec, 200, PARTITIONS)
    producer = KafkaProducer(bootstrap_servers=cluster.bootstrap, linger_ms=5, acks=1,
                             compression_type=None if codec == "none" else codec)
    try:
        futures = [producer.send(topic_name, value=m.value, key=m.key, partition=m.partition,
                                 headers=list(m.headers), timestamp_ms=m.timestamp_ms)
                   for m in sent]
        producer.flush(30)
        for f in futures:
            f.get(timeout=10)
    finally:
        producer.close(timeout=10)

    consumer = KafkaConsumer(bootstrap_servers=cluster.bootstrap, enable_auto_commit=False,
                             auto_offset_reset="earliest", fetch_max_wait_ms=200)
    got: list[Message] = []
    try:
        consumer.assign([TopicPartition(topic_name, p) for p in range(PARTITIONS)])
        deadline = time.monotonic() + 30
        while len(got) < len(sent) and time.monotonic() < deadline:
            for tp, records in consumer.poll(timeout_ms=500).items():
                got.extend(Message(tp.partition, r.key, r.value, tuple(r.headers), r.timestamp)
                           for r in records)
    finally:
        consumer.close()
    assert_same(sent, got)
