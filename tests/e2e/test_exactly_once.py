"""Exactly once across crashes: a consume-transform-produce loop (confluent-kafka, a
read_committed consumer, a transactional producer sending the consumer's positions with each
transaction) copies every input record to an output topic while a handler and then the log
node leading the transaction coordinator's partition are killed with SIGKILL and restarted.
At the end a read_committed consumer sees every input record's copy exactly once.

The loop does what an exactly-once application does on errors: an abortable error aborts the
transaction and rewinds the consumer to the group's committed offsets; a fatal one (a fenced or
unusable producer) replaces the producer, whose init fences the old one, and rewinds too.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from services.handler.coordinator.placement import partition_for
from services.local_cluster import ClusterSpec, LocalCluster

from .test_confluent_kafka import consume_all
from .test_replication_faults import (
    all_in_sync,
    create_topic,
    logs_of,
    topic_metadata,
    wait_until,
)

PARTITIONS = 3
RECORDS = 1200
TRANSACTION_STATE = "__transaction_state"


@pytest.fixture(scope="module")
def crashing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    spec = ClusterSpec(data_dir=tmp_path_factory.mktemp("eos-cluster"), kafka_port=0,
                       base_port=0, handlers=2, log_nodes=3, num_partitions=PARTITIONS,
                       default_replication_factor=3)
    cluster = LocalCluster(spec)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


class CopyLoop:
    """Copies ``source`` to ``sink`` in transactions of up to ``batch`` records, committing at
    most ``allowed`` transactions in all (None: no limit), so that a test's phases each see
    transactions of their own however fast the copying goes."""

    def __init__(self, bootstrap: str, source: str, sink: str, group: str,
                 transactional_id: str, batch: int = 25) -> None:
        self.bootstrap, self.source, self.sink = bootstrap, source, sink
        self.transactional_id, self.batch = transactional_id, batch
        self.consumer = Consumer({
            "bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
            "auto.offset.reset": "earliest", "isolation.level": "read_committed"})
        self.partitions = [TopicPartition(source, p) for p in range(PARTITIONS)]
        self.producer: Producer | None = None
        self.stop = threading.Event()
        self.committed_transactions = 0
        self.aborted_transactions = 0
        self.new_producers = 0
        # Input records whose copies are committed: the group's offsets, summed, as the loop
        # last committed or read them (kept by the loop's thread: a consumer serves one
        # thread at a time, and a busy loop would starve another thread's calls).
        self.copied = 0
        self.errors: list[str] = []
        self.allowed: int | None = None

    def _new_producer(self) -> None:
        self.producer = Producer({
            "bootstrap.servers": self.bootstrap, "transactional.id": self.transactional_id,
            "transaction.timeout.ms": 30_000, "linger.ms": 2, "message.timeout.ms": 30_000})
        self.producer.init_transactions(60)
        self.new_producers += 1

    def _rewind(self) -> None:
        committed = self.consumer.committed(self.partitions, timeout=60)
        self.copied = sum(max(tp.offset, 0) for tp in committed)
        for tp in committed:
            self.consumer.seek(TopicPartition(
                tp.topic, tp.partition, tp.offset if tp.offset >= 0 else 0))

    def run(self) -> None:
        self.consumer.assign([TopicPartition(self.source, p, 0) for p in range(PARTITIONS)])
        while not self.stop.is_set():
            if self.allowed is not None and self.committed_transactions >= self.allowed:
                time.sleep(0.05)
                continue
            try:
                if self.producer is None:
                    self._new_producer()
                    self._rewind()
                self._one_transaction()
            except KafkaException as exc:
                error = exc.args[0]
                self.errors.append(str(error))
                if error.fatal() or self.producer is None:
                    self.producer = None
                    continue
                try:
                    self.producer.abort_transaction(60)
                    self.aborted_transactions += 1
                    self._rewind()
                except KafkaException as abort_error:
                    self.errors.append(f"abort: {abort_error.args[0]}")
                    self.producer = None
        self.consumer.close()

    def _one_transaction(self) -> None:
        assert self.producer is not None
        messages = [m for m in self.consumer.consume(self.batch, 0.5) if not m.error()]
        if not messages:
            return
        self.producer.begin_transaction()
        for message in messages:
            self.producer.produce(self.sink, b"copy-" + message.value(),
                                  partition=message.partition())
        positions = self.consumer.position(self.partitions)
        self.producer.send_offsets_to_transaction(
            positions, self.consumer.consumer_group_metadata(), 60)
        self.producer.commit_transaction(60)
        self.committed_transactions += 1
        self.copied = sum(max(tp.offset, 0) for tp in positions)

    def done(self) -> bool:
        return self.copied >= RECORDS

    def reaches(self, condition: Callable[[], bool], within: float, what: str,
                cluster: LocalCluster) -> None:
        """Wait for ``condition``; on timeout fail with the loop's errors as they are then."""
        deadline = time.monotonic() + within
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{what}: not reached within {within}s (transactions committed "
                    f"{self.committed_transactions}, aborted {self.aborted_transactions}, "
                    f"records copied {self.copied}, errors: {self.errors[-5:]})\n"
                    f"{logs_of(cluster)}")
            time.sleep(0.1)


def coordinator_node(cluster: LocalCluster, transactional_id: str) -> int:
    partitions = topic_metadata(cluster, TRANSACTION_STATE)
    assert partitions, "no __transaction_state yet"
    index = partition_for(transactional_id, len(partitions))
    return next(p.leader for p in partitions if p.partition == index)


def test_every_input_is_copied_exactly_once_across_kills(crashing, topic_name):
    source, sink = f"{topic_name}-in", f"{topic_name}-out"
    for topic in (source, sink):
        create_topic(crashing.bootstrap, topic, PARTITIONS)
        wait_until(crashing, lambda t=topic: all_in_sync(crashing, t), 30, f"{topic} in sync")
    plain = Producer({"bootstrap.servers": crashing.bootstrap, "acks": "all",
                      "enable.idempotence": True})
    for i in range(RECORDS):
        plain.produce(source, f"{i:05d}".encode(), partition=i % PARTITIONS)
    assert plain.flush(60) == 0

    transactional_id = f"copier-{topic_name}"
    loop = CopyLoop(crashing.bootstrap, source, sink, f"g-{topic_name}", transactional_id)
    # 5 transactions per phase, of the 48 or more the input makes: input is left for each.
    loop.allowed = 5
    thread = threading.Thread(target=loop.run, name="copy-loop", daemon=True)
    thread.start()
    try:
        loop.reaches(lambda: loop.committed_transactions >= 5, 60,
                     "transactions before any kill", crashing)
        crashing.kill("handler-0")
        loop.allowed = 10
        loop.reaches(lambda: loop.committed_transactions >= 10, 60,
                     "transactions with a handler down", crashing)
        crashing.start_service("handler-0")
        victim = coordinator_node(crashing, transactional_id)
        before = loop.committed_transactions
        crashing.kill(f"log-{victim}")
        loop.allowed = before + 5
        loop.reaches(lambda: loop.committed_transactions >= before + 5, 90,
                     f"transactions after the coordinator's log node {victim} was killed",
                     crashing)
        crashing.start_service(f"log-{victim}")
        loop.allowed = None
        loop.reaches(loop.done, 180, "every record copied", crashing)
    finally:
        loop.stop.set()
        thread.join(120)
    assert not thread.is_alive(), "the copy loop did not stop"

    copies = [m.value for m in consume_all(crashing.bootstrap, sink, RECORDS, PARTITIONS,
                                           isolation="read_committed", within=60)]
    expected = sorted(b"copy-" + f"{i:05d}".encode() for i in range(RECORDS))
    duplicates = len(copies) - len(set(copies))
    assert duplicates == 0, f"{duplicates} records copied twice"
    assert sorted(copies) == expected, f"{RECORDS - len(set(copies))} records never copied"
