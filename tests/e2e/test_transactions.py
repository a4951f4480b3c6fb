"""Transactions with real clients against a real local cluster: confluent-kafka (librdkafka),
aiokafka and kafkajs transactional producers, read_committed and read_uncommitted consumers,
offsets committed inside transactions, and the errors Kafka gives for misuse (a timeout over
the broker's maximum, a fenced producer, a transaction the coordinator aborted on timeout).

What each test checks is what a Kafka user relies on: a read_committed consumer sees exactly
the records of committed transactions, in order, and never a record of an aborted one; it
stops at the first record of a transaction still open (the last stable offset); offsets sent to
a transaction become the group's committed offsets only when it commits.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import TopicPartition as AioTopicPartition
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from .test_confluent_kafka import create_topic

PARTITIONS = 3
JS_DIR = Path(__file__).resolve().parent.parent / "clients" / "js"


def transactional_producer(bootstrap: str, transactional_id: str, **config: object) -> Producer:
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id,
                         "linger.ms": 5, **config})
    producer.init_transactions(30)
    return producer


def produce_in_transaction(producer: Producer, topic: str, values: list[str], *,
                           commit: bool) -> None:
    producer.begin_transaction()
    for i, value in enumerate(values):
        producer.produce(topic, value.encode(), key=str(i).encode(), partition=i % PARTITIONS)
    if commit:
        producer.commit_transaction(30)
    else:
        producer.flush(30)
        producer.abort_transaction(30)


def read_all(bootstrap: str, topic: str, isolation: str, *, settle_s: float = 1.0,
             timeout_s: float = 30.0) -> dict[int, list[str]]:
    """Every value of the topic per partition, in offset order, as a consumer with manual
    assignment and the given isolation level reads it: until every partition reached its end
    (as the consumer's isolation level sees it) and nothing more came for ``settle_s``."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"read-{uuid.uuid4().hex}",
                         "isolation.level": isolation, "enable.auto.commit": False,
                         "enable.partition.eof": True, "auto.offset.reset": "earliest"})
    values: dict[int, list[str]] = {p: [] for p in range(PARTITIONS)}
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        eof: set[int] = set()
        deadline = time.monotonic() + timeout_s
        quiet_since = time.monotonic()
        while time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None:
                if len(eof) == PARTITIONS and time.monotonic() - quiet_since >= settle_s:
                    break
                continue
            quiet_since = time.monotonic()
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    eof.add(msg.partition())
                    continue
                raise KafkaException(msg.error())
            eof.discard(msg.partition())
            values[msg.partition()].append(msg.value().decode())
        else:
            raise AssertionError(f"{topic} not read to its end within {timeout_s} s: {eof}")
    finally:
        consumer.close()
    return values


def by_partition(values: list[str]) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {p: [] for p in range(PARTITIONS)}
    for i, value in enumerate(values):
        out[i % PARTITIONS].append(value)
    return out


def merged(*parts: dict[int, list[str]]) -> dict[int, list[str]]:
    return {p: [v for part in parts for v in part[p]] for p in range(PARTITIONS)}


def test_read_committed_sees_committed_transactions_only_and_in_order(cluster, topic_name):
    create_topic(cluster.bootstrap, topic_name, PARTITIONS)
    producer = transactional_producer(cluster.bootstrap, f"txn-{topic_name}")
    first = [f"first-{i}" for i in range(30)]
    aborted = [f"aborted-{i}" for i in range(30)]
    last = [f"last-{i}" for i in range(30)]
    produce_in_transaction(producer, topic_name, first, commit=True)
    produce_in_transaction(producer, topic_name, aborted, commit=False)
    produce_in_transaction(producer, topic_name, last, commit=True)
    producer.flush(10)

    committed = read_all(cluster.bootstrap, topic_name, "read_committed")
    assert committed == merged(by_partition(first), by_partition(last))
    # read_uncommitted returns the aborted records too (never the markers).
    everything = read_all(cluster.bootstrap, topic_name, "read_uncommitted")
    assert everything == merged(by_partition(first), by_partition(aborted), by_partition(last))


def test_an_open_transaction_holds_read_committed_consumers_at_its_first_record(
        cluster, topic_name):
    create_topic(cluster.bootstrap, topic_name, PARTITIONS)
    before = [f"before-{i}" for i in range(6)]
    plain = Producer({"bootstrap.servers": cluster.bootstrap, "linger.ms": 1})
    for i, value in enumerate(before):
        plain.produce(topic_name, value.encode(), partition=i % PARTITIONS)
    plain.flush(30)

    producer = transactional_producer(cluster.bootstrap, f"txn-{topic_name}")
    producer.begin_transaction()
    open_values = [f"open-{i}" for i in range(6)]
    for i, value in enumerate(open_values):
        producer.produce(topic_name, value.encode(), partition=i % PARTITIONS)
    producer.flush(30)
    # Records after the open transaction's first one wait for it, even non-transactional ones.
    after = [f"after-{i}" for i in range(6)]
    for i, value in enumerate(after):
        plain.produce(topic_name, value.encode(), partition=i % PARTITIONS)
    plain.flush(30)

    assert read_all(cluster.bootstrap, topic_name, "read_committed") == by_partition(before)
    assert read_all(cluster.bootstrap, topic_name, "read_uncommitted") == merged(
        by_partition(before), by_partition(open_values), by_partition(after))
    # ListOffsets under read_committed answers the last stable offset.
    watcher = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "lso-watch",
                        "isolation.level": "read_committed"})
    try:
        assert [watcher.get_watermark_offsets(TopicPartition(topic_name, p), timeout=10)[1]
                for p in range(PARTITIONS)] == [2, 2, 2]
    finally:
        watcher.close()

    producer.commit_transaction(30)
    assert read_all(cluster.bootstrap, topic_name, "read_committed") == merged(
        by_partition(before), by_partition(open_values), by_partition(after))


def _group_offsets(bootstrap: str, group: str, topic: str) -> list[int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "isolation.level": "read_committed"})
    try:
        committed = consumer.committed([TopicPartition(topic, p) for p in range(PARTITIONS)],
                                       timeout=30)
    finally:
        consumer.close()
    return [tp.offset for tp in committed]


def test_offsets_sent_to_a_transaction_count_only_when_it_commits(cluster, topic_name):
    source, sink = f"{topic_name}-in", f"{topic_name}-out"
    create_topic(cluster.bootstrap, source, PARTITIONS)
    create_topic(cluster.bootstrap, sink, PARTITIONS)
    plain = Producer({"bootstrap.servers": cluster.bootstrap})
    for i in range(30):
        plain.produce(source, f"in-{i}".encode(), partition=i % PARTITIONS)
    plain.flush(30)
    group = f"g-{topic_name}"
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": group,
                         "enable.auto.commit": False, "auto.offset.reset": "earliest",
                         "isolation.level": "read_committed"})
    producer = transactional_producer(cluster.bootstrap, f"txn-{topic_name}")
    try:
        consumer.assign([TopicPartition(source, p, 0) for p in range(PARTITIONS)])
        got: list[str] = []
        deadline = time.monotonic() + 30
        while len(got) < 15 and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and not msg.error():
                got.append(msg.value().decode())
        assert len(got) >= 15
        positions = consumer.position([TopicPartition(source, p) for p in range(PARTITIONS)])

        # Aborted: the offsets stay where they were (nothing committed yet).
        producer.begin_transaction()
        producer.produce(sink, b"derived")
        producer.send_offsets_to_transaction(positions, consumer.consumer_group_metadata(), 30)
        producer.abort_transaction(30)
        assert _group_offsets(cluster.bootstrap, group, source) == [-1001] * PARTITIONS

        # Committed: the group's offsets are the positions sent.
        producer.begin_transaction()
        producer.produce(sink, b"derived")
        producer.send_offsets_to_transaction(positions, consumer.consumer_group_metadata(), 30)
        producer.commit_transaction(30)
        assert _group_offsets(cluster.bootstrap, group, source) == [
            tp.offset for tp in positions]
    finally:
        consumer.close()
    assert sum(map(len, read_all(cluster.bootstrap, sink, "read_committed").values())) == 1


def test_a_transaction_timeout_over_the_maximum_is_refused(cluster):
    producer = Producer({"bootstrap.servers": cluster.bootstrap,
                         "transactional.id": f"too-long-{uuid.uuid4().hex[:8]}",
                         "transaction.timeout.ms": 900_001})
    with pytest.raises(KafkaException) as raised:
        producer.init_transactions(30)
    assert raised.value.args[0].code() == KafkaError.INVALID_TRANSACTION_TIMEOUT


def test_a_second_producer_with_the_same_id_fences_the_first(cluster, topic_name):
    create_topic(cluster.bootstrap, topic_name, PARTITIONS)
    transactional_id = f"txn-{topic_name}"
    zombie = transactional_producer(cluster.bootstrap, transactional_id)
    zombie.begin_transaction()
    zombie.produce(topic_name, b"zombie", partition=0)
    zombie.flush(30)

    successor = transactional_producer(cluster.bootstrap, transactional_id)
    produce_in_transaction(successor, topic_name, ["successor"], commit=True)

    with pytest.raises(KafkaException) as raised:
        zombie.produce(topic_name, b"zombie-again", partition=0)
        zombie.commit_transaction(30)
    error = raised.value.args[0]
    assert error.fatal(), error
    assert error.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED,
                            KafkaError.INVALID_PRODUCER_EPOCH), error
    assert read_all(cluster.bootstrap, topic_name, "read_committed") == {
        0: ["successor"], 1: [], 2: []}


def test_a_transaction_past_its_timeout_is_aborted_by_the_coordinator(cluster, topic_name):
    create_topic(cluster.bootstrap, topic_name, PARTITIONS)
    transactional_id = f"txn-{topic_name}"
    producer = transactional_producer(cluster.bootstrap, transactional_id,
                                      **{"transaction.timeout.ms": 2000})
    producer.begin_transaction()
    for i in range(6):
        producer.produce(topic_name, f"late-{i}".encode(), partition=i % PARTITIONS)
    producer.flush(30)
    # The coordinator aborts it (and fences the epoch) once 2 s have passed: the markers free
    # read_committed consumers without the producer doing anything.
    deadline = time.monotonic() + 30
    plain = Producer({"bootstrap.servers": cluster.bootstrap})
    plain.produce(topic_name, b"after", partition=0)
    plain.flush(30)
    while time.monotonic() < deadline:
        if read_all(cluster.bootstrap, topic_name, "read_committed", settle_s=0.3) == {
                0: ["after"], 1: [], 2: []}:
            break
        time.sleep(0.5)
    else:
        raise AssertionError("the timed-out transaction was never aborted")
    with pytest.raises(KafkaException):
        producer.commit_transaction(30)
    # The transactional id is usable again.
    successor = transactional_producer(cluster.bootstrap, transactional_id)
    produce_in_transaction(successor, topic_name, ["ok-0", "ok-1", "ok-2"], commit=True)
    assert read_all(cluster.bootstrap, topic_name, "read_committed") == {
        0: ["after", "ok-0"], 1: ["ok-1"], 2: ["ok-2"]}


async def _aiokafka_transactions(bootstrap: str, topic: str) -> dict[int, list[str]]:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap,
                                transactional_id=f"aio-{topic}", enable_idempotence=True)
    await producer.start()
    try:
        async with producer.transaction():
            for i in range(9):
                await producer.send(topic, f"kept-{i}".encode(), partition=i % PARTITIONS)
        await producer.begin_transaction()
        for i in range(9):
            await producer.send(topic, f"dropped-{i}".encode(), partition=i % PARTITIONS)
        await producer.abort_transaction()
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed",
                                enable_auto_commit=False, auto_offset_reset="earliest")
    await consumer.start()
    got: dict[int, list[str]] = {p: [] for p in range(PARTITIONS)}
    try:
        consumer.assign([AioTopicPartition(topic, p) for p in range(PARTITIONS)])
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 20
        while sum(map(len, got.values())) < 9 and loop.time() < deadline:
            for tp, records in (await consumer.getmany(timeout_ms=300)).items():
                got[tp.partition].extend(r.value.decode() for r in records)
        # Nothing more arrives (the aborted records never do).
        for tp, records in (await consumer.getmany(timeout_ms=1000)).items():
            got[tp.partition].extend(r.value.decode() for r in records)
    finally:
        await consumer.stop()
    return got


def test_aiokafka_commits_and_aborts(cluster, topic_name):
    create_topic(cluster.bootstrap, topic_name, PARTITIONS)
    got = asyncio.run(_aiokafka_transactions(cluster.bootstrap, topic_name))
    assert got == by_partition([f"kept-{i}" for i in range(9)])


def test_kafkajs_commits_aborts_and_sends_offsets(cluster, topic_name):
    node = shutil.which("node")
    assert node, "node is required for the kafkajs tests"
    create_topic(cluster.bootstrap, topic_name, PARTITIONS)
    group = f"js-{topic_name}"
    done = subprocess.run(
        [node, "transactions.js", cluster.bootstrap, topic_name, group, f"js-{topic_name}"],
        cwd=JS_DIR, capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "KAFKAJS_NO_PARTITIONER_WARNING": "1"})
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["committed"] == 9 and report["aborted"] == 9
    assert read_all(cluster.bootstrap, topic_name, "read_committed") == by_partition(
        [f"js-kept-{i}" for i in range(9)])
    assert _group_offsets(cluster.bootstrap, group, topic_name) == [3, 3, 3]
