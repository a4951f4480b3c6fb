"""kafkajs (node) against a real local cluster: create a topic and produce with every codec
(none, gzip, snappy, lz4, zstd), with keys, headers and timestamps; everything is read back
exactly, in order per partition."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from .records import Message, assert_same
from .test_confluent_kafka import consume_all

JS_DIR = Path(__file__).resolve().parent.parent / "clients" / "js"


def test_kafkajs_produce_every_codec(cluster, topic_name):
    node = shutil.which("node")
    assert node, "node is required for the kafkajs tests"
    done = subprocess.run(
        [node, "produce.js", cluster.bootstrap, topic_name, "3", "60",
         "none", "gzip", "snappy", "lz4", "zstd"],
        cwd=JS_DIR, capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "KAFKAJS_NO_PARTITIONER_WARNING": "1"},
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["created"] is True
    sent = [Message(m["partition"], m["key"].encode(), m["value"].encode(),
                    (("origin", m["headers"]["origin"].encode()),), m["timestamp"])
            for m in report["sent"]]
    assert_same(sent, consume_all(cluster.bootstrap, topic_name, len(sent)))


def test_kafkajs_consumes_through_a_consumer_group(cluster, topic_name):
    from confluent_kafka import Consumer
    from confluent_kafka import TopicPartition as CkTopicPartition

    from .test_consumer_groups import create_topic as create_topic_of
    from .test_consumer_groups import produce as produce_values

    node = shutil.which("node")
    assert node, "node is required for the kafkajs tests"
    create_topic_of(cluster.bootstrap, topic_name, partitions=3)
    produce_values(cluster.bootstrap, topic_name, 90, partitions=3)
    group = f"js-{topic_name}"
    done = subprocess.run(
        [node, "consume_group.js", cluster.bootstrap, topic_name, group, "90"],
        cwd=JS_DIR, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    # Each message once its commit succeeded: one handed out again after a rejoin (a commit
    # refused while the group rebalanced or its coordinator moved) counts once.
    got = sorted((m["partition"], m["offset"], m["value"]) for m in report["processed"])
    assert got == sorted((i % 3, i // 3, str(i)) for i in range(90)), (
        report["joins"], report["warnings"])
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": group})
    try:
        committed = consumer.committed([CkTopicPartition(topic_name, p) for p in range(3)],
                                       timeout=30)
    finally:
        consumer.close()
    assert [tp.offset for tp in committed] == [30, 30, 30]
