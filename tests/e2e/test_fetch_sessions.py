"""Fetch sessions (KIP-227) with a real client that uses them (kafka-python): after its first
full fetch the consumer sends incremental ones, and reads every record of every partition, in
order, while producers keep writing; the frontend's gauges show the session it holds."""

from __future__ import annotations

import time

from confluent_kafka import Producer
from kafka import KafkaConsumer
from kafka import TopicPartition as KafkaTopicPartition

from .test_confluent_kafka import create_topic
from .test_request_metrics import scrape, value

PARTITIONS = 8
TIMEOUT = 60


def produce(bootstrap: str, topic: str, first: int, count: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(first, first + count):
        producer.produce(topic, value=b"%d" % i, partition=i % PARTITIONS)
    assert producer.flush(TIMEOUT) == 0


def test_kafka_python_reads_everything_through_an_incremental_session(cluster, topic_name):
    create_topic(cluster.bootstrap, topic_name, partitions=PARTITIONS)
    produce(cluster.bootstrap, topic_name, 0, 400)
    consumer = KafkaConsumer(bootstrap_servers=cluster.bootstrap, auto_offset_reset="earliest",
                             enable_auto_commit=False, fetch_max_wait_ms=100,
                             max_partition_fetch_bytes=4096, request_timeout_ms=30000)
    got: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
    try:
        consumer.assign([KafkaTopicPartition(topic_name, p) for p in range(PARTITIONS)])
        deadline = time.monotonic() + TIMEOUT
        produced_more = False
        while sum(map(len, got.values())) < 800:
            assert time.monotonic() < deadline, f"read {sum(map(len, got.values()))} of 800"
            for records in consumer.poll(timeout_ms=200).values():
                for record in records:
                    got[record.partition].append(int(record.value))
            if not produced_more and sum(map(len, got.values())) >= 200:
                produce(cluster.bootstrap, topic_name, 400, 400)
                produced_more = True
        # Idle fetches (each waits 100 ms for data that does not come): incremental ones
        # that name no partition and are answered with none.
        for _ in range(10):
            assert not consumer.poll(timeout_ms=200)
        epochs = [h.next_metadata.epoch for h in consumer._fetcher._session_handlers.values()]
        sessions = value(scrape(cluster, "frontend"), "kbroker_frontend_fetch_sessions")
        cached = value(scrape(cluster, "frontend"), "kbroker_frontend_fetch_session_partitions")
    finally:
        consumer.close()
    for partition, values in got.items():
        assert values == list(range(partition, 800, PARTITIONS)), f"partition {partition}"
    # Many fetches went by in one session (epochs count them), not a full fetch each.
    assert max(epochs) > 5, epochs
    assert sessions >= 1 and cached >= PARTITIONS
