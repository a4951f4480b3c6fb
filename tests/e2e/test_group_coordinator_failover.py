"""A long-lived librdkafka admin client keeps working with a group when the log node leading
the group's ``__consumer_offsets`` partition (its coordinator) is killed.

librdkafka caches the coordinator it found for a group and sends the group's requests there
for as long as its connection to that broker is up (``rd_kafka_coord_req_fsm``); a
NOT_COORDINATOR inside a DescribeGroups or OffsetFetch answer does not evict the entry, and
each use keeps it fresh. The frontend serves every broker's port, dead brokers' too, so the
connection stays up: the handlers serve group requests that reach a dead broker's port (any
handler can serve any group) instead of answering NOT_COORDINATOR there forever. A client
that looks the coordinator up again is sent to the new leader."""

from __future__ import annotations

import time

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException
from confluent_kafka import TopicPartition as CkTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

FAILOVER_S = 60.0


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


def wait_for_brokers(admin: AdminClient, count: int) -> None:
    """Until the cluster has ``count`` live brokers (an earlier test may have just restarted
    one)."""
    deadline = time.monotonic() + FAILOVER_S
    while len(admin.list_topics(timeout=10).brokers) < count:
        assert time.monotonic() < deadline, f"fewer than {count} live brokers"
        time.sleep(0.5)


def test_a_long_lived_admin_client_keeps_working_when_the_coordinator_dies(
        cluster, topic_name):
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    wait_for_brokers(admin, 3)
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
    wait_for_brokers(AdminClient({"bootstrap.servers": cluster.bootstrap}), 3)
