"""The consumer group protocol of KIP-848 with librdkafka's ``group.protocol=consumer``
(confluent-kafka) against the shared cluster: a regular expression subscription picks up a
topic created later, admin clients see the group's type in ListGroups and describe it with
ConsumerGroupDescribe; a classic group is upgraded online as its members restart with the
consumer protocol; static members come back to their partitions; a crashed member's
partitions move at its session timeout. Committed progress is checked exactly throughout:
each record processed (its commit accepted) once, committed offsets at the end of every
partition."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import time

from confluent_kafka import Consumer, ConsumerGroupType
from confluent_kafka import TopicPartition as CkTopicPartition
from confluent_kafka.admin import AdminClient

from .test_consumer_groups import (
    PARTITIONS,
    SESSION_TIMEOUT_MS,
    SETTLE_S,
    GroupMember,
    create_topic,
    produce,
    settle,
    split,
    start,
)


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


def _committed(bootstrap: str, group: str, topic: str) -> list[int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        return [tp.offset for tp in consumer.committed(
            [CkTopicPartition(topic, p) for p in range(PARTITIONS)], timeout=30)]
    finally:
        consumer.close()


def _group_type(bootstrap: str, group: str) -> ConsumerGroupType:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    return admin.describe_consumer_groups([group])[group].result(30).type


def _wait_processed(members: list[GroupMember], count: int) -> None:
    deadline = time.monotonic() + SETTLE_S
    while sum(len(m.processed) for m in members) < count:
        for m in members:
            if m.error is not None:
                raise m.error
        assert time.monotonic() < deadline, [len(m.processed) for m in members]
        time.sleep(0.05)


def test_an_online_upgrade_neither_loses_nor_repeats_committed_progress(cluster, topic_name):
    """Two classic members are restarted one by one with group.protocol=consumer while they
    consume: the classic group becomes a consumer group (with a classic member in between),
    every record is processed (its commit accepted) exactly once, and the committed offsets
    end at the end of every partition."""
    create_topic(cluster.bootstrap, topic_name)
    total = 600
    produce(cluster.bootstrap, topic_name, total)
    group = f"upgrade-{topic_name}"

    def member(protocol: str) -> GroupMember:
        return GroupMember("confluent", cluster.bootstrap, group, topic_name, delay_s=0.01,
                           protocol=protocol)

    members = start(member("classic"), member("classic"))
    try:
        _wait_processed(members, 100)
        assert _group_type(cluster.bootstrap, group) == ConsumerGroupType.CLASSIC
        members[0].stop()
        members += start(member("consumer"))
        _wait_processed(members, 300)
        # One consumer protocol member joined: the group is a consumer group now, its other
        # member still a classic one.
        assert _group_type(cluster.bootstrap, group) == ConsumerGroupType.CONSUMER
        members[1].stop()
        members += start(member("consumer"))
        _wait_processed(members, total)
        time.sleep(1.0)  # anything processed twice would show up by now
    finally:
        for m in members:
            if m.is_alive():
                m.stop()
    seen = collections.Counter(p for m in members for p in m.processed)
    assert {p: n for p, n in seen.items() if n > 1} == {}
    assert set(seen) == {(i % PARTITIONS, i // PARTITIONS) for i in range(total)}
    assert all(m.processed for m in members), [len(m.processed) for m in members]
    assert _committed(cluster.bootstrap, group, topic_name) == [total // PARTITIONS] * PARTITIONS
    assert _group_type(cluster.bootstrap, group) == ConsumerGroupType.CONSUMER


def test_a_static_member_restarting_keeps_its_partitions_without_a_rebalance(
        cluster, topic_name):
    """group.protocol=consumer with group.instance.id: a member that closes and comes back
    with the same instance id within the session timeout gets its partitions back and the
    other member sees no rebalance at all; one that does not come back loses them at the
    session timeout."""
    create_topic(cluster.bootstrap, topic_name)
    group = f"static-{topic_name}"

    def member(instance: str) -> GroupMember:
        return GroupMember("confluent", cluster.bootstrap, group, topic_name,
                           protocol="consumer", instance_id=instance)

    first, other = start(member("first"), member("other"))
    again = None
    try:
        held = settle([first, other], split(3, 3), "two static members")[0]
        before = list(other.rebalances)
        first.stop()  # leaves as a static member (epoch -2): its place is kept
        left_at = time.monotonic()
        again = start(member("first"))[0]
        settle([again, other], split(3, 3), "the static member came back")
        assert time.monotonic() - left_at < SESSION_TIMEOUT_MS / 1000
        assert again.assigned == held
        # Past the session timeout of the first incarnation: still no rebalance.
        time.sleep(max(0.0, SESSION_TIMEOUT_MS / 1000 + 1 - (time.monotonic() - left_at)))
        assert other.rebalances == before and again.assigned == held
        again.stop()
        gone_at = time.monotonic()
        settle([other], split(6), "the static member stayed away")
        assert time.monotonic() - gone_at > SESSION_TIMEOUT_MS / 1000 / 2
    finally:
        for m in (first, other, again):
            if m is not None and m.is_alive():
                m.stop()


COMMITTING_CONSUMER = """
import sys, time
from confluent_kafka import Consumer
consumer = Consumer({"bootstrap.servers": sys.argv[1], "group.id": sys.argv[2],
                     "client.id": "doomed", "group.protocol": "consumer",
                     "enable.auto.commit": False, "auto.offset.reset": "earliest"})
consumer.subscribe([sys.argv[3]])
while True:
    message = consumer.poll(0.2)
    if message is None or message.error():
        continue
    print("consumed", message.partition(), message.offset(), flush=True)
    consumer.commit(message=message, asynchronous=False)
    print("committed", message.partition(), message.offset(), flush=True)
    time.sleep(0.05)
"""


def test_a_crashed_member_loses_its_partitions_at_the_session_timeout_and_nothing_else(
        cluster, topic_name):
    """group.protocol=consumer: a member killed mid-stream (no leave) keeps its partitions
    until its session times out; then the survivor takes them from the crashed member's
    committed offsets: nothing it committed is processed again, nothing is skipped."""
    create_topic(cluster.bootstrap, topic_name)
    total = 180
    produce(cluster.bootstrap, topic_name, total)
    group = f"crash-{topic_name}"
    survivor = start(GroupMember("confluent", cluster.bootstrap, group, topic_name,
                                 delay_s=0.03, protocol="consumer"))[0]
    doomed = subprocess.Popen(
        [sys.executable, "-c", COMMITTING_CONSUMER, cluster.bootstrap, group, topic_name],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True, text=True)
    lines: list[str] = []
    try:
        settle([survivor], lambda s: len(s[0]) == 3, "a second member joined")
        assert doomed.stdout is not None
        while sum(line.startswith("committed") for line in lines) < 20:
            line = doomed.stdout.readline()
            assert line, "the second member stopped"
            lines.append(line)
        os.killpg(doomed.pid, signal.SIGKILL)  # no leave: only its session ends it
        killed_at = time.monotonic()
        lines += doomed.stdout.read().splitlines()
        doomed.wait(timeout=10)
        settle([survivor], split(6), "the crashed member's partitions moved")
        assert time.monotonic() - killed_at > SESSION_TIMEOUT_MS / 1000 / 2
        done = {(int(p), int(o)) for kind, p, o in map(str.split, lines) if kind == "committed"}
        # The crashed member's last record may have been committed or not.
        unsure = {(int(p), int(o)) for kind, p, o in map(str.split, lines)
                  if kind == "consumed"} - done
        deadline = time.monotonic() + SETTLE_S
        while len(done | set(survivor.processed)) < total - len(unsure):
            assert time.monotonic() < deadline, len(done | set(survivor.processed))
            time.sleep(0.1)
        time.sleep(1.0)
    finally:
        if doomed.poll() is None:
            os.killpg(doomed.pid, signal.SIGKILL)
            doomed.wait(timeout=10)
        survivor.stop()
    assert len(unsure) <= PARTITIONS
    processed = collections.Counter(survivor.processed)
    assert {p: n for p, n in processed.items() if n > 1} == {}
    assert set(processed) & done == set()
    everything = {(i % PARTITIONS, i // PARTITIONS) for i in range(total)}
    assert everything - set(processed) - done <= unsure
    assert _committed(cluster.bootstrap, group, topic_name) == [total // PARTITIONS] * PARTITIONS
