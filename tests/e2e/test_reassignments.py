"""Partition reassignments with a real admin client (kafka-python's
alter_partition_reassignments and list_partition_reassignments) against three log nodes: a
partition moved off its only log node onto two others has its records copied, is listed while
a target node is down, completes once both targets are in sync (the old replica's data then
deleted), and still holds every record; a cancelled reassignment goes back to the original
replica; errors are Kafka's. ``kbroker spread`` evens six partitions piled on one log node out
over three, then empties one, the records all still there."""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewTopic,
    ResourceType,
)
from kafka import KafkaAdminClient
from kafka import TopicPartition as KTopicPartition
from kafka.errors import (
    InvalidReplicationAssignmentError,
    NoReassignmentInProgressError,
    UnknownTopicOrPartitionError,
)

from services.local_cluster import LocalCluster

from .test_recovery import cluster, wait_until

__all__ = ["cluster"]  # the module's cluster fixture

TOPIC = "moving"
RECORDS = 3000


def replicator_partitions(cluster: LocalCluster) -> dict[int, tuple[list[int], list[int], int]]:
    """Each partition of TOPIC: (replicas, isr, leader), as the admin client's metadata has
    them (None entries while not known)."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    topic = admin.list_topics(TOPIC, timeout=10).topics[TOPIC]
    return {p.id: (list(p.replicas), list(p.isrs), p.leader) for p in topic.partitions.values()}


def produce(cluster: LocalCluster, partition: int, count: int) -> None:
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all",
                         "linger.ms": 5})
    for i in range(count):
        producer.produce(TOPIC, value=f"{partition}:{i}".encode() * 20, partition=partition)
        if i % 500 == 0:
            producer.poll(0)
    assert producer.flush(30) == 0


def read_all(cluster: LocalCluster, partition: int) -> list[bytes]:
    from confluent_kafka import TopicPartition
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "verify",
                         "enable.auto.commit": False})
    values: list[bytes] = []
    try:
        consumer.assign([TopicPartition(TOPIC, partition, 0)])
        deadline = time.monotonic() + 30
        while len(values) < RECORDS and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error():
                values.append(msg.value())
    finally:
        consumer.close()
    return values


def test_a_partition_moves_to_other_log_nodes_with_its_records(cluster: LocalCluster):
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(TOPIC, num_partitions=2, replica_assignment=[[0], [0]])],
                        request_timeout=15)[TOPIC].result(20)
    produce(cluster, 0, RECORDS)
    produce(cluster, 1, 10)
    client = KafkaAdminClient(bootstrap_servers=cluster.bootstrap, request_timeout_ms=30000)
    p0, p1 = KTopicPartition(TOPIC, 0), KTopicPartition(TOPIC, 1)
    cluster.kill("log-2")
    try:
        # A target node is down: both reassignments start and stay under way.
        assert client.alter_partition_reassignments({p0: [1, 2], p1: [2]}) == {
            p0: None, p1: None}
        listed = client.list_partition_reassignments()
        assert {tp: (r["replicas"], r["adding_replicas"], r["removing_replicas"])
                for tp, r in listed.items()} == {
            p0: ([1, 2, 0], [1, 2], [0]), p1: ([2, 0], [2], [0])}
        # Node 1 catches up meanwhile, but node 2 is missing: not done.
        wait_until(cluster, lambda: 1 in replicator_partitions(cluster)[0][1], 20,
                   "log node 1 in the ISR of partition 0")
        assert replicator_partitions(cluster)[0][0] == [1, 2, 0]
        # Cancel one; errors as Kafka's.
        answers = client.alter_partition_reassignments({
            p1: None, KTopicPartition(TOPIC, 9): [1], KTopicPartition("nowhere", 0): [1]})
        assert answers == {p1: None, KTopicPartition(TOPIC, 9): UnknownTopicOrPartitionError,
                           KTopicPartition("nowhere", 0): UnknownTopicOrPartitionError}
        assert client.alter_partition_reassignments({p1: None}) == {
            p1: NoReassignmentInProgressError}
        assert client.alter_partition_reassignments({p1: [1, 1]}) == {
            p1: InvalidReplicationAssignmentError}
        assert list(client.list_partition_reassignments()) == [p0]
        assert replicator_partitions(cluster)[1][0] == [0]
    finally:
        cluster.start_service("log-2")
    wait_until(cluster, lambda: replicator_partitions(cluster)[0][0] == [1, 2], 30,
               "the reassignment of partition 0 done")
    replicas, isr, leader = replicator_partitions(cluster)[0]
    assert sorted(isr) == [1, 2] and leader in (1, 2)
    assert client.list_partition_reassignments() == {}
    # Every record is there, read from the new replicas, and the old one is deleted.
    values = read_all(cluster, 0)
    assert values == [f"0:{i}".encode() * 20 for i in range(RECORDS)]
    old = Path(cluster.data_dir) / "log-0" / f"{TOPIC}-0"
    wait_until(cluster, lambda: not old.exists(), 20, "the old replica deleted")
    assert (Path(cluster.data_dir) / "log-0" / f"{TOPIC}-1").exists()
    client.close()


def spread(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "services.cli", "spread", "--replicator",
         cluster.services["replicator"].grpc_address, "--topic", "piled", *args],
        capture_output=True, text=True, timeout=120, check=False)


def test_kbroker_spread_evens_out_the_log_nodes_and_empties_one_before_removal(
        cluster: LocalCluster):
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic("piled", num_partitions=6, replica_assignment=[[0]] * 6)],
                        request_timeout=15)["piled"].result(20)
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
    for p in range(6):
        for i in range(50):
            producer.produce("piled", value=f"{p}:{i}".encode(), partition=p)
    assert producer.flush(30) == 0

    def replicas() -> dict[int, list[int]]:
        topic = admin.list_topics("piled", timeout=10).topics["piled"]
        return {p.id: list(p.replicas) for p in topic.partitions.values()}

    dry = spread(cluster)
    assert dry.returncode == 0, dry.stderr
    assert "node 0: 6 replicas" in dry.stdout and "node 1: 2 replicas" in dry.stdout
    assert all(r == [0] for r in replicas().values())  # a plan changes nothing

    done = spread(cluster, "--execute", "--wait", "--timeout", "60")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "every reassignment is done" in done.stdout
    assert sorted(Counter(r[0] for r in replicas().values()).values()) == [2, 2, 2]

    emptied = spread(cluster, "--exclude", "2", "--execute", "--wait", "--timeout", "60")
    assert emptied.returncode == 0, emptied.stdout + emptied.stderr
    after = replicas()
    assert all(2 not in r for r in after.values())
    assert sorted(Counter(r[0] for r in after.values()).values()) == [3, 3]

    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "piled-check",
                         "auto.offset.reset": "earliest"})
    seen: set[bytes] = set()
    try:
        consumer.subscribe(["piled"])
        deadline = time.monotonic() + 30
        while len(seen) < 300 and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error():
                seen.add(msg.value())
    finally:
        consumer.close()
    assert len(seen) == 300


def test_a_reassignment_is_held_to_the_replication_throttle(cluster: LocalCluster):
    """kafka-reassign-partitions --throttle, by hand: the rate as a dynamic broker config of
    the leader's log node, the moving partition's replicas as the topic's throttled
    replicas."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    rate = 512 * 1024
    admin.create_topics([NewTopic("throttled", num_partitions=1, replica_assignment=[[0]],
                                  config={"leader.replication.throttled.replicas": "*"})],
                        request_timeout=15)["throttled"].result(20)
    # The leader's rate, as a dynamic config of log node 0.
    leader = ConfigResource(ResourceType.BROKER, "0", incremental_configs=[ConfigEntry(
        "leader.replication.throttled.rate", str(rate),
        incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([leader], request_timeout=15)[leader].result(20)
    broker = ConfigResource(ResourceType.BROKER, "0")
    entry = admin.describe_configs([broker], request_timeout=15)[broker].result(20)[
        "leader.replication.throttled.rate"]
    assert (entry.value, entry.source) == (str(rate), ConfigSource.DYNAMIC_BROKER_CONFIG.value)
    static = ConfigResource(ResourceType.BROKER, "0", incremental_configs=[ConfigEntry(
        "num.partitions", "3", incremental_operation=AlterConfigOpType.SET)])
    with pytest.raises(KafkaException) as refused:
        admin.incremental_alter_configs([static], request_timeout=15)[static].result(20)
    assert refused.value.args[0].code() == KafkaError.INVALID_REQUEST

    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all",
                         "linger.ms": 20})
    payload = b"x" * 1000
    for i in range(3000):  # about 3 MB: nearly six seconds at the rate
        producer.produce("throttled", value=payload, partition=0)
        if i % 500 == 0:
            producer.poll(0)
    assert producer.flush(30) == 0

    client = KafkaAdminClient(bootstrap_servers=cluster.bootstrap, request_timeout_ms=30000)
    started = time.monotonic()
    assert client.alter_partition_reassignments({KTopicPartition("throttled", 0): [1]}) == {
        KTopicPartition("throttled", 0): None}
    wait_until(cluster, lambda: client.list_partition_reassignments() == {}, 60,
               "the throttled reassignment done")
    took = time.monotonic() - started
    client.close()
    # At most one second of the rate goes at once, and the last copy (up to 1 MiB) is paid
    # for after it is made: the rest goes at the rate. Unthrottled, the move takes under a
    # second.
    assert took >= (3e6 - rate - (1 << 20)) / rate, took
    # Its one new replica leads it: acks=all writes are taken and committed there.
    failed: list[object] = []
    for _ in range(10):
        producer.produce("throttled", value=payload, partition=0,
                         on_delivery=lambda err, _msg: err is not None and failed.append(err))
    assert producer.flush(30) == 0 and failed == []
    assert read_count(cluster, "throttled") == 3010


def read_count(cluster: LocalCluster, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": f"{topic}-count",
                         "auto.offset.reset": "earliest"})
    count = 0
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 30
        idle = 0
        while time.monotonic() < deadline and idle < 6:
            msg = consumer.poll(0.5)
            if msg is None:
                idle += 1 if count else 0
                continue
            if not msg.error():
                count += 1
                idle = 0
    finally:
        consumer.close()
    return count
