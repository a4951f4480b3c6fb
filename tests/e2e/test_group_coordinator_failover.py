"""Long-lived librdkafka clients keep working with a group when the log node leading the
group's ``__consumer_offsets`` partition (its coordinator) is killed: an admin client, and a
transactional producer sending a consumer's offsets to its transactions.

librdkafka caches the coordinator it found for a group and sends the group's requests there
for as long as its connection to that broker is up (``rd_kafka_coord_req_fsm``); a
NOT_COORDINATOR inside a DescribeGroups or OffsetFetch answer does not evict the entry, and
each use keeps it fresh. The frontend serves every broker's port, dead brokers' too, so the
connection stays up: the handlers serve group requests that reach a dead broker's port (any
handler can serve any group) instead of answering NOT_COORDINATOR there forever. A client
that looks the coordinator up again is sent to the new leader.

librdkafka also drops a broker that a Metadata answer no longer lists, while its coordinator
cache may still name it; a request waiting for that coordinator then waits for a connection
that never comes, and ``send_offsets_to_transaction`` never returns
(confluentinc/librdkafka#5511). So a dead log node stays a broker in the metadata (the
frontend still serves its port): TxnOffsetCommit sent there gets NOT_COORDINATOR and the
producer looks the group up again."""

from __future__ import annotations

import threading
import time

import grpc
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, KafkaException, Producer
from confluent_kafka import TopicPartition as CkTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from kbroker.replicator.v1 import replicator_pb2, replicator_pb2_grpc
from services.handler.coordinator.placement import partition_for
from services.local_cluster import LocalCluster

FAILOVER_S = 60.0
# Twice the time limit the stuck call was given (librdkafka does not keep that limit:
# confluentinc/librdkafka#5456).
STUCK_S = 30.0
OFFSETS_TOPIC = "__consumer_offsets"
TRANSACTION_STATE = "__transaction_state"


def describe(admin: AdminClient, group: str) -> tuple[int | None, str]:
    """(coordinator id, '') or (None, the error) of one DescribeConsumerGroups."""
    try:
        description = admin.describe_consumer_groups(
            [group], request_timeout=10)[group].result(timeout=15)
    except KafkaException as exc:
        return None, exc.args[0].name()
    return description.coordinator.id, ""


def committed(admin: AdminClient, group: str) -> list[tuple[int, int]]:
    listed = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[
        group].result(timeout=30)
    return [(tp.partition, tp.offset) for tp in listed.topic_partitions]


def replicator_metadata(cluster: LocalCluster, *topics: str) -> replicator_pb2.ClusterMetadata:
    with grpc.insecure_channel(cluster.services["replicator"].grpc_address) as channel:
        return replicator_pb2_grpc.ReplicatorStub(channel).GetMetadata(
            replicator_pb2.GetMetadataRequest(topics=list(topics)), timeout=10)


def wait_for_log_nodes(cluster: LocalCluster) -> None:
    """Until every log node is alive and back in the ISR of every partition of the internal
    topics (an earlier test may have just restarted one)."""
    deadline = time.monotonic() + FAILOVER_S
    while True:
        metadata = replicator_metadata(cluster)
        if all(n.alive for n in metadata.log_nodes) and all(
                sorted(p.isr) == sorted(p.replicas) for t in metadata.topics
                if t.name in (OFFSETS_TOPIC, TRANSACTION_STATE) for p in t.partitions):
            return
        assert time.monotonic() < deadline, f"log nodes not all back: {metadata.log_nodes}"
        time.sleep(0.2)


def coordinator_node(cluster: LocalCluster, topic: str, key: str) -> int:
    """The log node leading ``key``'s partition of an internal topic, as the replicator has
    it."""
    (described,) = replicator_metadata(cluster, topic).topics
    index = partition_for(key, len(described.partitions))
    return next(p.leader for p in described.partitions if p.partition == index)


def test_a_long_lived_admin_client_keeps_working_when_the_coordinator_dies(
        cluster, topic_name):
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    wait_for_log_nodes(cluster)
    admin.create_topics([NewTopic(topic_name, num_partitions=1, replication_factor=3)])[
        topic_name].result(timeout=30)
    group = f"admin-{topic_name}"
    offsets = ConsumerGroupTopicPartitions(group, [CkTopicPartition(topic_name, 0, 7)])
    admin.alter_consumer_group_offsets([offsets])[group].result(timeout=30)
    coordinator, error = describe(admin, group)
    assert coordinator is not None, error
    assert describe(admin, group)[0] == coordinator  # from librdkafka's coordinator cache
    victim = f"log-{coordinator}"
    cluster.kill(victim)
    try:
        # Until the failover (a few seconds) errors are expected; after it, the old client's
        # requests to the dead coordinator's port are answered again.
        errors: list[str] = []
        deadline = time.monotonic() + FAILOVER_S
        while True:
            moved, error = describe(admin, group)
            if moved is not None:
                assert time.monotonic() < deadline
                break
            errors.append(error)
            assert time.monotonic() < deadline, (
                f"no answer after {FAILOVER_S} s: {errors[-5:]}")
            time.sleep(0.5)
        assert committed(admin, group) == [(0, 7)]
        for _ in range(3):  # and it stays so
            assert describe(admin, group) == (moved, "")
        # A client that looks the coordinator up finds the new leader.
        fresh = AdminClient({"bootstrap.servers": cluster.bootstrap})
        found, error = describe(fresh, group)
        assert found is not None and found != coordinator, (found, error)
        assert committed(fresh, group) == [(0, 7)]
    finally:
        cluster.start_service(victim)
    wait_for_log_nodes(cluster)


def test_send_offsets_to_transaction_finds_the_new_group_coordinator(cluster, topic_name):
    """The producer caches the group's coordinator with a first transaction; that coordinator's
    log node is killed and the producer reads the metadata after the failover, as it does
    whenever a partition's leader moves; the next send_offsets_to_transaction must reach the
    new coordinator. Its group is led by another log node than its transactional id, so the
    transaction coordinator is not in the way."""
    wait_for_log_nodes(cluster)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(topic_name, num_partitions=1, replication_factor=3)])[
        topic_name].result(timeout=30)
    producer = Producer({"bootstrap.servers": cluster.bootstrap,
                         "transactional.id": f"offsets-{topic_name}",
                         "transaction.timeout.ms": 60_000, "message.timeout.ms": 60_000})
    producer.init_transactions(30)
    transaction_node = coordinator_node(cluster, TRANSACTION_STATE, f"offsets-{topic_name}")
    describe(admin, f"warm-{topic_name}")  # __consumer_offsets exists from here on
    group = next(g for g in (f"g{i}-{topic_name}" for i in range(1000))
                 if coordinator_node(cluster, OFFSETS_TOPIC, g) != transaction_node)
    victim = coordinator_node(cluster, OFFSETS_TOPIC, group)
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": group})
    member = consumer.consumer_group_metadata()

    def transaction(offset: int) -> None:
        producer.begin_transaction()
        producer.produce(topic_name, b"x", partition=0)
        producer.send_offsets_to_transaction([CkTopicPartition(topic_name, 0, offset)],
                                             member, 15)
        producer.commit_transaction(30)

    transaction(1)
    cluster.kill(f"log-{victim}")
    try:
        deadline = time.monotonic() + FAILOVER_S
        while coordinator_node(cluster, OFFSETS_TOPIC, group) == victim or not next(
                n.fenced for n in replicator_metadata(cluster).log_nodes
                if n.node_id == victim):
            assert time.monotonic() < deadline, "the group's partition did not move"
            time.sleep(0.1)
        index = partition_for(group, len(producer.list_topics(
            OFFSETS_TOPIC, timeout=10).topics[OFFSETS_TOPIC].partitions))
        while producer.list_topics(OFFSETS_TOPIC, timeout=10).topics[
                OFFSETS_TOPIC].partitions[index].leader == victim:
            assert time.monotonic() < deadline, "the producer never saw the new leader"
            time.sleep(0.1)
        producer.list_topics(timeout=10)  # and the fence, the change after the move
        outcome: list[BaseException | None] = []

        def second() -> None:
            try:
                transaction(2)
                outcome.append(None)
            except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
                outcome.append(exc)

        worker = threading.Thread(target=second, name="second-transaction", daemon=True)
        worker.start()
        worker.join(STUCK_S)
        assert outcome, (f"the second transaction is stuck {STUCK_S} s after the group's "
                         f"coordinator (log node {victim}) was killed")
        assert outcome == [None]
        assert [(tp.partition, tp.offset) for tp in consumer.committed(
            [CkTopicPartition(topic_name, 0)], timeout=30)] == [(0, 2)]
    finally:
        cluster.start_service(f"log-{victim}")
        consumer.close()
    wait_for_log_nodes(cluster)
