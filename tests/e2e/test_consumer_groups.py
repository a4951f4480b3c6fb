"""Consumer groups with real clients against a real cluster: three clients (confluent-kafka,
kafka-python, aiokafka) share six partitions evenly; members joining, leaving and crashing
(killed, found out by the session timeout) rebalance the group; with committed offsets no
record is lost or processed twice across rebalances; and committed offsets survive a restart
of the whole cluster.

The group tests run with both group protocols (``protocol``): classic, and the consumer
protocol of KIP-848, where the confluent-kafka members use ``group.protocol=consumer`` and the
kafka-python and aiokafka members, which only speak the classic protocol, are classic members
of the consumer group (as Kafka 4 lets them be).

Each consumer runs in a thread of its own (a process for the one that crashes) and reports what
it holds and what it processed; the tests wait for the group to settle with bounded polls."""

from __future__ import annotations

import asyncio
import collections
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition as AioTopicPartition
from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka import TopicPartition as CkTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer
from kafka import TopicPartition as KpTopicPartition
from kafka.structs import OffsetAndMetadata

from services.local_cluster import ClusterSpec, LocalCluster

PARTITIONS = 6
SESSION_TIMEOUT_MS = 6000
HEARTBEAT_MS = 500
SETTLE_S = 60.0


@pytest.fixture(params=["classic", "consumer"])
def protocol(request: pytest.FixtureRequest) -> str:
    """The group protocol the confluent-kafka members speak."""
    return str(request.param)


def create_topic(bootstrap: str, name: str, partitions: int = PARTITIONS) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, num_partitions=partitions,
                                  replication_factor=1)])[name].result(timeout=30)


def produce(bootstrap: str, topic: str, count: int, partitions: int = PARTITIONS,
            start: int = 0) -> None:
    # Idempotent: a retry across a leader failover must not store a batch twice (the
    # offsets are checked exactly).
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5,
                         "enable.idempotence": True})
    for i in range(start, start + count):
        producer.produce(topic, value=str(i).encode(), partition=i % partitions)
    assert producer.flush(30) == 0


class GroupMember(threading.Thread):
    """A consumer of some client library in a group: subscribes, polls, and after each record
    (optionally slowed down) commits its offset synchronously. A record counts as processed
    only once its commit succeeded, so a record is in ``processed`` exactly as often as the
    group handed it to a member that could commit it."""

    def __init__(self, client: str, bootstrap: str, group: str, topic: str,
                 delay_s: float = 0.0, protocol: str = "classic",
                 instance_id: str | None = None) -> None:
        super().__init__(name=f"{client}-{group}", daemon=True)
        self.client = client
        self.bootstrap = bootstrap
        self.group = group
        self.topic = topic
        self.delay_s = delay_s
        self.protocol = protocol
        self.instance_id = instance_id
        # Rebalance callbacks seen (confluent-kafka members): partitions handed over.
        self.rebalances: list[tuple[str, frozenset[int]]] = []
        self.stopping = threading.Event()
        self.assigned: frozenset[int] = frozenset()
        self.processed: list[tuple[int, int]] = []
        # Every record handed over, committed or not.
        self.consumed: list[tuple[int, int]] = []
        self.failed_commits = 0
        self.error: BaseException | None = None

    def stop(self, timeout: float = 30.0) -> None:
        """Leave the group (the client's close sends LeaveGroup) and wait for the thread."""
        self.stopping.set()
        self.join(timeout)
        assert not self.is_alive(), f"{self.name} did not stop"
        if self.error is not None:
            raise self.error

    def run(self) -> None:
        try:
            {"confluent": self._confluent, "kafka-python": self._kafka_python,
             "aiokafka": lambda: asyncio.run(self._aiokafka())}[self.client]()
        except BaseException as exc:  # noqa: BLE001 - reported by stop()
            self.error = exc

    def _processed(self, partition: int, offset: int, committed: bool) -> None:
        self.consumed.append((partition, offset))
        if committed:
            self.processed.append((partition, offset))
        else:
            self.failed_commits += 1
        if self.delay_s:
            time.sleep(self.delay_s)

    def _confluent(self) -> None:
        config = {
            "bootstrap.servers": self.bootstrap, "group.id": self.group,
            "client.id": self.name, "enable.auto.commit": False,
            "auto.offset.reset": "earliest"}
        if self.protocol == "consumer":  # session and heartbeat are the broker's settings
            config["group.protocol"] = "consumer"
        else:
            config.update({"session.timeout.ms": SESSION_TIMEOUT_MS,
                           "heartbeat.interval.ms": HEARTBEAT_MS})
        if self.instance_id is not None:
            config["group.instance.id"] = self.instance_id
        consumer = Consumer(config)

        def handed(kind: str) -> Callable[[object, list[CkTopicPartition]], None]:
            def record(_: object, partitions: list[CkTopicPartition]) -> None:
                self.rebalances.append((kind, frozenset(p.partition for p in partitions)))
            return record

        consumer.subscribe([self.topic], on_assign=handed("assign"),
                           on_revoke=handed("revoke"), on_lost=handed("lost"))
        try:
            while not self.stopping.is_set():
                message = consumer.poll(0.2)
                self.assigned = frozenset(tp.partition for tp in consumer.assignment())
                if message is None or message.error():
                    continue
                try:
                    consumer.commit(message=message, asynchronous=False)
                    committed = True
                except KafkaException:
                    committed = False
                self._processed(message.partition(), message.offset(), committed)
        finally:
            consumer.close()

    def _kafka_python(self) -> None:
        consumer = KafkaConsumer(
            self.topic, bootstrap_servers=self.bootstrap, group_id=self.group,
            client_id=self.name, enable_auto_commit=False, auto_offset_reset="earliest",
            session_timeout_ms=SESSION_TIMEOUT_MS, heartbeat_interval_ms=HEARTBEAT_MS)
        try:
            while not self.stopping.is_set():
                batches = consumer.poll(timeout_ms=200, max_records=1)
                self.assigned = frozenset(tp.partition for tp in consumer.assignment())
                for tp, records in batches.items():
                    for record in records:
                        try:
                            consumer.commit({KpTopicPartition(tp.topic, tp.partition):
                                             OffsetAndMetadata(record.offset + 1, "", -1)})
                            committed = True
                        except Exception:  # noqa: BLE001 - CommitFailedError and kin
                            committed = False
                        self._processed(tp.partition, record.offset, committed)
        finally:
            consumer.close()

    async def _aiokafka(self) -> None:
        consumer = AIOKafkaConsumer(
            self.topic, bootstrap_servers=self.bootstrap, group_id=self.group,
            client_id=self.name, enable_auto_commit=False, auto_offset_reset="earliest",
            session_timeout_ms=SESSION_TIMEOUT_MS, heartbeat_interval_ms=HEARTBEAT_MS)
        await consumer.start()
        try:
            while not self.stopping.is_set():
                batches = await consumer.getmany(timeout_ms=200, max_records=1)
                self.assigned = frozenset(tp.partition for tp in consumer.assignment())
                for tp, records in batches.items():
                    for record in records:
                        try:
                            await consumer.commit({AioTopicPartition(tp.topic, tp.partition):
                                                   record.offset + 1})
                            committed = True
                        except Exception:  # noqa: BLE001 - CommitFailedError and kin
                            committed = False
                        await asyncio.to_thread(self._processed, tp.partition,
                                                record.offset, committed)
        finally:
            await consumer.stop()


def settle(members: list[GroupMember], expected: Callable[[list[frozenset[int]]], bool],
           what: str, within: float = SETTLE_S) -> list[frozenset[int]]:
    """Wait until the members' assignments satisfy ``expected`` (and stay so for a moment)."""
    deadline = time.monotonic() + within
    while True:
        for m in members:
            if m.error is not None:
                raise m.error
        seen = [m.assigned for m in members]
        if expected(seen):
            time.sleep(1.0)
            if [m.assigned for m in members] == seen:
                return seen
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: assignments never settled, last {seen}")
        time.sleep(0.1)


def split(*sizes: int) -> Callable[[list[frozenset[int]]], bool]:
    """Assignments of these sizes that together cover every partition once."""
    def check(assignments: list[frozenset[int]]) -> bool:
        union: set[int] = set()
        for a in assignments:
            union |= a
        return (sorted(len(a) for a in assignments) == sorted(sizes)
                and sum(len(a) for a in assignments) == PARTITIONS
                and union == set(range(PARTITIONS)))
    return check


def start(*members: GroupMember) -> list[GroupMember]:
    """Start the members; under the consumer protocol the first (a consumer protocol member)
    first, until it holds partitions: the group is then a consumer group that the classic
    members join. (Were they first, the consumer protocol member would convert their classic
    group mid-rebalance, and Kafka answers the JoinGroups in flight REBALANCE_IN_PROGRESS,
    which aiokafka does not retry.)"""
    first, rest = members[0], members[1:]
    first.start()
    if first.protocol == "consumer":
        deadline = time.monotonic() + SETTLE_S
        while not first.assigned:
            assert first.error is None, first.error
            assert time.monotonic() < deadline, "the first member never got partitions"
            time.sleep(0.05)
    for m in rest:
        m.start()
    return list(members)


def test_three_clients_share_six_partitions_evenly(cluster, topic_name, protocol):
    create_topic(cluster.bootstrap, topic_name)
    produce(cluster.bootstrap, topic_name, 60)
    group = f"mixed-{protocol}-{topic_name}"
    members = start(*(GroupMember(c, cluster.bootstrap, group, topic_name, protocol=protocol)
                      for c in ("confluent", "kafka-python", "aiokafka")))
    try:
        assignments = settle(members, split(2, 2, 2), "three clients")
        assert all(len(a) == 2 for a in assignments)
        # Every record is consumed, by whichever member holds its partition.
        deadline = time.monotonic() + SETTLE_S
        while sum(len(m.processed) for m in members) < 60:
            assert time.monotonic() < deadline, [len(m.processed) for m in members]
            time.sleep(0.2)
    finally:
        for m in members:
            m.stop()
    processed = sorted(p for m in members for p in m.processed)
    assert len(processed) == len(set(processed)) == 60
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    description = admin.describe_consumer_groups([group])[group].result(timeout=30)
    assert str(description.state).endswith("EMPTY")


CRASHING_CONSUMER = """
import sys, time
from confluent_kafka import Consumer
config = {"bootstrap.servers": sys.argv[1], "group.id": sys.argv[2], "client.id": "doomed",
          "enable.auto.commit": False}
if sys.argv[5] == "consumer":
    config["group.protocol"] = "consumer"
else:
    config.update({"session.timeout.ms": int(sys.argv[4]), "heartbeat.interval.ms": 500})
consumer = Consumer(config)
consumer.subscribe([sys.argv[3]])
while True:
    consumer.poll(0.2)
    if consumer.assignment():
        print("assigned", flush=True)
"""


def test_members_joining_leaving_and_crashing_rebalance_the_group(cluster, topic_name,
                                                                 protocol):
    create_topic(cluster.bootstrap, topic_name)
    group = f"churn-{protocol}-{topic_name}"
    a, b = start(GroupMember("confluent", cluster.bootstrap, group, topic_name,
                             protocol=protocol),
                 GroupMember("kafka-python", cluster.bootstrap, group, topic_name))
    doomed = None
    try:
        settle([a, b], split(3, 3), "two members")
        doomed = subprocess.Popen(
            [sys.executable, "-c", CRASHING_CONSUMER, cluster.bootstrap, group, topic_name,
             str(SESSION_TIMEOUT_MS), protocol],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
        # A third member joins: the others give up a partition each.
        settle([a, b], lambda s: sorted(map(len, s)) == [2, 2], "a member joined")
        os.killpg(doomed.pid, signal.SIGKILL)  # no LeaveGroup: only its session ends it
        doomed.wait(timeout=10)
        crashed_at = time.monotonic()
        settle([a, b], split(3, 3), "a member crashed")
        waited = time.monotonic() - crashed_at
        assert waited > SESSION_TIMEOUT_MS / 1000 / 2, waited
        b.stop()  # leaves the group
        settle([a], split(6), "a member left")
    finally:
        if doomed is not None and doomed.poll() is None:
            os.killpg(doomed.pid, signal.SIGKILL)
            doomed.wait(timeout=10)
        for m in (a, b):
            if m.is_alive():
                m.stop()


def test_no_record_is_lost_or_processed_twice_across_rebalances(cluster, topic_name,
                                                               protocol):
    create_topic(cluster.bootstrap, topic_name)
    total = 1200
    produce(cluster.bootstrap, topic_name, total)
    group = f"exactly-{protocol}-{topic_name}"
    members = start(GroupMember("confluent", cluster.bootstrap, group, topic_name,
                                delay_s=0.004, protocol=protocol))
    try:
        def processed() -> int:
            return sum(len(m.processed) for m in members)

        def wait_for(count: int) -> None:
            deadline = time.monotonic() + SETTLE_S
            while processed() < count:
                assert time.monotonic() < deadline, (processed(), count)
                time.sleep(0.05)

        wait_for(100)
        members += start(GroupMember("kafka-python", cluster.bootstrap, group, topic_name,
                                     delay_s=0.004))
        wait_for(400)
        members += start(GroupMember("aiokafka", cluster.bootstrap, group, topic_name,
                                     delay_s=0.004))
        wait_for(700)
        members[0].stop()  # the first member leaves mid-stream
        wait_for(total)
        time.sleep(2.0)  # anything processed twice would show up by now
    finally:
        for m in members:
            if m.is_alive():
                m.stop()
    # The work really moved between members (three rebalances happened mid-stream).
    assert all(m.processed for m in members), [len(m.processed) for m in members]
    seen = collections.Counter(p for m in members for p in m.processed)
    twice = {p: n for p, n in seen.items() if n > 1}
    assert twice == {}
    assert len(seen) == total
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": group})
    try:
        committed = consumer.committed([CkTopicPartition(topic_name, p)
                                        for p in range(PARTITIONS)], timeout=30)
    finally:
        consumer.close()
    assert [tp.offset for tp in committed] == [total // PARTITIONS] * PARTITIONS


def test_committed_offsets_survive_a_restart_of_the_whole_cluster(tmp_path: Path):
    cluster = LocalCluster(ClusterSpec(
        data_dir=tmp_path, kafka_port=0, base_port=0, handlers=2, log_nodes=2,
        group_initial_rebalance_delay_ms=300, offsets_topic_num_partitions=5,
        log_level=os.environ.get("KBROKER_TEST_LOG_LEVEL", "INFO")))
    cluster.start()
    try:
        topic, group = "restart", "survivor"
        create_topic(cluster.bootstrap, topic, partitions=2)
        produce(cluster.bootstrap, topic, 20, partitions=2)
        first = GroupMember("confluent", cluster.bootstrap, group, topic)
        first.start()
        deadline = time.monotonic() + SETTLE_S
        while len(first.processed) < 20:
            assert time.monotonic() < deadline, first.processed
            time.sleep(0.1)
        first.stop()
        produce(cluster.bootstrap, topic, 10, partitions=2, start=20)
        cluster.stop()
        cluster.start()
        after = GroupMember("aiokafka", cluster.bootstrap, group, topic)
        after.start()
        deadline = time.monotonic() + SETTLE_S
        while len(after.processed) < 10:
            assert time.monotonic() < deadline, after.processed
            time.sleep(0.1)
        time.sleep(1.0)
        after.stop()
        # Only what came after the commits is consumed again: offsets 10..14 of each partition.
        assert sorted(after.processed) == [(p, o) for p in (0, 1) for o in range(10, 15)]
    finally:
        cluster.stop()


def test_a_group_carries_on_when_a_handler_and_the_purgatory_are_killed(cluster, topic_name,
                                                                       protocol):
    create_topic(cluster.bootstrap, topic_name)
    group = f"survive-{protocol}-{topic_name}"
    members = start(GroupMember("confluent", cluster.bootstrap, group, topic_name,
                                protocol=protocol),
                    GroupMember("kafka-python", cluster.bootstrap, group, topic_name))
    total = 0
    try:
        settle(members, split(3, 3), "two members")
        for victim in ("handler-0", "purgatory"):
            produce(cluster.bootstrap, topic_name, 120, start=total)
            total += 120
            cluster.kill(victim)
            try:
                produce(cluster.bootstrap, topic_name, 120, start=total)
                total += 120
            finally:
                cluster.start_service(victim)
        produce(cluster.bootstrap, topic_name, 120, start=total)
        total += 120
        deadline = time.monotonic() + SETTLE_S
        while len({p for m in members for p in m.consumed}) < total:
            assert time.monotonic() < deadline, len({p for m in members for p in m.consumed})
            time.sleep(0.2)
        # The group is whole again and its commits reach the end of every partition.
        settle(members, split(3, 3), "after the restarts")
    finally:
        for m in members:
            m.stop()
    consumed = {p for m in members for p in m.consumed}
    assert consumed == {(i % PARTITIONS, i // PARTITIONS) for i in range(total)}
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": group})
    try:
        committed = consumer.committed([CkTopicPartition(topic_name, p)
                                        for p in range(PARTITIONS)], timeout=30)
    finally:
        consumer.close()
    assert [tp.offset for tp in committed] == [total // PARTITIONS] * PARTITIONS


def test_a_group_moves_with_its_coordinator_when_that_log_node_is_killed(cluster, topic_name):
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(topic_name, num_partitions=PARTITIONS,
                                  replication_factor=3)])[topic_name].result(timeout=30)
    group = f"moving-{topic_name}"
    members = start(GroupMember("confluent", cluster.bootstrap, group, topic_name),
                    GroupMember("aiokafka", cluster.bootstrap, group, topic_name))
    total = 0
    victim = None
    try:
        settle(members, split(3, 3), "two members")
        produce(cluster.bootstrap, topic_name, 120)
        total = 120
        description = admin.describe_consumer_groups([group])[group].result(timeout=30)
        victim = f"log-{description.coordinator.id}"
        deadline = time.monotonic() + SETTLE_S
        while len({p for m in members for p in m.consumed}) < total:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        cluster.kill(victim)
        produce(cluster.bootstrap, topic_name, 120, start=total)
        total += 120
        deadline = time.monotonic() + 2 * SETTLE_S
        while len({p for m in members for p in m.consumed}) < total:
            assert time.monotonic() < deadline, len({p for m in members for p in m.consumed})
            time.sleep(0.2)
        # A new admin client: librdkafka keeps asking a coordinator it found before, as long
        # as that broker's port (served by the frontend) still answers.
        fresh = AdminClient({"bootstrap.servers": cluster.bootstrap})
        moved = fresh.describe_consumer_groups([group])[group].result(timeout=30)
        assert f"log-{moved.coordinator.id}" != victim
    finally:
        for m in members:
            m.stop()
        if victim is not None:
            cluster.start_service(victim)
    consumed = {p for m in members for p in m.consumed}
    assert consumed == {(i % PARTITIONS, i // PARTITIONS) for i in range(total)}
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": group})
    try:
        committed = consumer.committed([CkTopicPartition(topic_name, p)
                                        for p in range(PARTITIONS)], timeout=30)
    finally:
        consumer.close()
    assert [tp.offset for tp in committed] == [total // PARTITIONS] * PARTITIONS
