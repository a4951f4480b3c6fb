"""DescribeLogDirs with a real admin client (kafka-python's describe_log_dirs, one request per
broker): each broker (log node) answers for its own data folder, with the size of every
replica it holds and its file system's total and usable bytes."""

from __future__ import annotations

import time

from confluent_kafka import Producer
from kafka import KafkaAdminClient

from .test_confluent_kafka import create_topic

PARTITIONS = 3


def test_each_broker_describes_its_log_dir_and_replica_sizes(cluster, topic_name):
    create_topic(cluster.bootstrap, topic_name, partitions=PARTITIONS)
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "linger.ms": 5})
    for i in range(300):
        producer.produce(topic_name, value=b"x" * 100, partition=i % PARTITIONS)
    assert producer.flush(30) == 0
    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap, request_timeout_ms=30000)
    try:
        deadline = time.monotonic() + 30
        while True:
            answers = admin.describe_log_dirs()
            sizes = {(t["name"], p["partition_index"]): p["partition_size"]
                     for a in answers for d in a["log_dirs"] for t in d["topics"]
                     if t["name"] == topic_name for p in t["partitions"]}
            if len(sizes) == PARTITIONS or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        only_mine = admin.describe_log_dirs({topic_name: [0]})
    finally:
        admin.close()
    assert sorted(a["broker"] for a in answers) == [0, 1, 2]
    for answer in answers:
        (log_dir,) = answer["log_dirs"]
        assert log_dir["error_code"] == 0
        assert log_dir["log_dir"].endswith(f"log-{answer['broker']}"), log_dir["log_dir"]
        assert 0 < log_dir["usable_bytes"] <= log_dir["total_bytes"]
    # Replication factor 1 here: each partition lives on one broker, 100 records of 100 bytes.
    assert sorted(sizes) == [(topic_name, p) for p in range(PARTITIONS)]
    assert all(size > 100 * 100 for size in sizes.values()), sizes
    named = [t for a in only_mine for d in a["log_dirs"] for t in d["topics"]]
    assert [(t["name"], [p["partition_index"] for p in t["partitions"]]) for t in named] == [
        (topic_name, [0])]
