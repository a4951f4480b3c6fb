"""The consumer group protocol of KIP-848 with librdkafka's ``group.protocol=consumer``
(confluent-kafka) against the shared cluster: a regular expression subscription picks up a
topic created later, admin clients see the group's type in ListGroups and describe it with
ConsumerGroupDescribe."""

from __future__ import annotations

import time

from confluent_kafka import Consumer, ConsumerGroupType
from confluent_kafka.admin import AdminClient

from .test_consumer_groups import SETTLE_S, create_topic


def test_a_regex_subscription_picks_up_a_new_topic_and_admin_clients_see_its_type(
        cluster, topic_name):
    first, second = f"rx-{topic_name}-1", f"rx-{topic_name}-2"
    create_topic(cluster.bootstrap, first, partitions=2)
    group = f"regex-{topic_name}"
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": group,
                         "group.protocol": "consumer", "auto.offset.reset": "earliest"})
    consumer.subscribe([f"^rx-{topic_name}-.*"])
    try:
        deadline = time.monotonic() + SETTLE_S
        while {tp.topic for tp in consumer.assignment()} != {first}:
            assert time.monotonic() < deadline, consumer.assignment()
            consumer.poll(0.1)
        create_topic(cluster.bootstrap, second, partitions=2)
        # Kafka resolves regular expressions again at most every 10 s.
        while {tp.topic for tp in consumer.assignment()} != {first, second}:
            assert time.monotonic() < deadline + 15, consumer.assignment()
            consumer.poll(0.1)
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
        listed = {g.group_id: g for g in admin.list_consumer_groups().result(30).valid}
        assert listed[group].type == ConsumerGroupType.CONSUMER
        only_classic = admin.list_consumer_groups(
            types={ConsumerGroupType.CLASSIC}).result(30).valid
        assert group not in {g.group_id for g in only_classic}
        described = admin.describe_consumer_groups([group])[group].result(30)
        assert described.type == ConsumerGroupType.CONSUMER
        assert str(described.state).endswith("STABLE")
        [member] = described.members
        assert sorted((tp.topic, tp.partition) for tp in member.assignment.topic_partitions) \
            == [(t, p) for t in (first, second) for p in range(2)]
    finally:
        consumer.close()
