"""Replication end to end, on a cluster of its own (3 log nodes, replica.lag.time.max.ms
shortened): confluent-kafka with acks=all on RF=3 topics, every replica holding the leader's
batches byte for byte, consumers never shown what is not committed, and a stopped follower
(SIGSTOP) leaving the ISR - so that min.insync.replicas=3 refuses acks=all writes with
NOT_ENOUGH_REPLICAS - then coming back into it."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import grpc
import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from kbroker.handler.v1 import kafka_handler_pb2_grpc
from kbroker.kafka.v1 import kafka_pb2 as k
from kbroker.log.v1 import log_pb2, log_pb2_grpc
from kbroker.replicator.v1 import replicator_pb2, replicator_pb2_grpc
from services.common.records.record_batch import iter_batches
from services.local_cluster import ClusterSpec, LocalCluster

from .records import assert_same, make_messages
from .test_confluent_kafka import consume_all

LAG_MS = 1500
PARTITIONS = 2


@pytest.fixture(scope="module")
def replicated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    spec = ClusterSpec(
        data_dir=tmp_path_factory.mktemp("replicated"), kafka_port=0, base_port=0, handlers=1,
        log_nodes=3, num_partitions=PARTITIONS, default_replication_factor=3,
        replica_lag_time_max_ms=LAG_MS,
        log_level=os.environ.get("KBROKER_TEST_LOG_LEVEL", "INFO"),
    )
    cluster = LocalCluster(spec)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def create_topic(bootstrap: str, name: str, **configs: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(name, num_partitions=PARTITIONS,
                                            replication_factor=3, config=configs)],
                                  request_timeout=15)
    futures[name].result(timeout=20)


def partition_metadata(cluster: LocalCluster, topic: str,
                       partition: int = 0) -> replicator_pb2.PartitionMetadata:
    with grpc.insecure_channel(cluster.services["replicator"].grpc_address) as channel:
        stub = replicator_pb2_grpc.ReplicatorStub(channel)
        metadata = stub.GetMetadata(replicator_pb2.GetMetadataRequest(topics=[topic]),
                                    timeout=5)
    return metadata.topics[0].partitions[partition]


def replica_bytes(cluster: LocalCluster, node: int, topic: str, partition: int) -> bytes:
    """Everything the node's replica holds, read up to its log end."""
    with grpc.insecure_channel(cluster.services[f"log-{node}"].grpc_address) as channel:
        stub = log_pb2_grpc.LogServiceStub(channel)
        out, offset = b"", 0
        for _ in range(10_000):
            result = stub.Read(log_pb2.ReadRequest(
                limit=log_pb2.READ_LIMIT_LOG_END, partitions=[log_pb2.PartitionRead(
                    topic=topic, partition=partition, offset=offset, max_bytes=1 << 20)]),
                timeout=5).results[0]
            assert result.error_code == 0, result
            if not result.records:
                return out
            out += result.records
            offset = [b.header.next_offset for b in iter_batches(result.records)][-1]
        raise AssertionError("the read never ended")


def end_offset(cluster: LocalCluster, topic: str, current_epoch: int, epoch: int
               ) -> k.OffsetForLeaderEpochResponse.EpochEndOffset:
    """OffsetForLeaderEpoch for partition 0, asked of a handler directly."""
    with grpc.insecure_channel(cluster.services["handler-0"].grpc_address) as channel:
        stub = kafka_handler_pb2_grpc.KafkaHandlerStub(channel)
        response = stub.OffsetForLeaderEpoch(k.OffsetForLeaderEpochRequest(topics=[
            k.OffsetForLeaderEpochRequest.OffsetForLeaderTopic(topic=topic, partitions=[
                k.OffsetForLeaderEpochRequest.OffsetForLeaderPartition(
                    partition=0, current_leader_epoch=current_epoch, leader_epoch=epoch)])]),
            timeout=10)
    return response.topics[0].partitions[0]


def wait_until(condition, within: float = 20.0, message: str = "condition") -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, f"{message} not reached within {within}s"
        time.sleep(0.1)


def produce(bootstrap: str, topic: str, messages, **settings) -> list[KafkaError | None]:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5,
                         **settings})
    outcomes: list[KafkaError | None] = []
    for m in messages:
        producer.produce(topic, value=m.value, key=m.key, partition=m.partition,
                         headers=list(m.headers), timestamp=m.timestamp_ms,
                         on_delivery=lambda err, _msg: outcomes.append(err))
    assert producer.flush(30) == 0
    return outcomes


def handler_isr(bootstrap: str, topic: str, partition: int = 0) -> list[int]:
    """The ISR as the handlers' metadata (what min.insync.replicas is checked against) has it."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    metadata = admin.list_topics(topic, timeout=10)
    return list(metadata.topics[topic].partitions[partition].isrs)


def high_watermark(bootstrap: str, topic: str, partition: int) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"hw-{topic}"})
    try:
        _low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition),
                                                    timeout=10)
        return high
    finally:
        consumer.close()


def test_acks_all_writes_reach_every_replica_byte_for_byte(replicated, topic_name):
    create_topic(replicated.bootstrap, topic_name, **{"min.insync.replicas": "2"})
    sent = make_messages("rf3", 400, PARTITIONS)
    outcomes = produce(replicated.bootstrap, topic_name, sent, **{"enable.idempotence": True})
    assert outcomes == [None] * len(sent)
    assert_same(sent, consume_all(replicated.bootstrap, topic_name, len(sent), PARTITIONS))
    for partition in range(PARTITIONS):
        meta = partition_metadata(replicated, topic_name, partition)
        assert sorted(meta.isr) == [0, 1, 2]
        copies = {n: replica_bytes(replicated, n, topic_name, partition) for n in meta.replicas}
        assert copies[meta.leader], "the leader holds nothing"
        for node, data in copies.items():
            assert data == copies[meta.leader], f"log node {node} differs from the leader"


def test_a_stopped_follower_leaves_the_isr_and_comes_back(replicated, topic_name):
    create_topic(replicated.bootstrap, topic_name, **{"min.insync.replicas": "3"})
    first = make_messages("before", 20, PARTITIONS)
    assert produce(replicated.bootstrap, topic_name, first) == [None] * len(first)
    meta = partition_metadata(replicated, topic_name)
    follower = meta.replicas[-1]
    process = replicated.services[f"log-{follower}"].proc
    assert process is not None
    process.send_signal(signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        # acks=1 still appends, but nothing is committed while the stopped follower is in
        # the ISR: consumers do not see it.
        committed = high_watermark(replicated.bootstrap, topic_name, 0)
        one = make_messages("acks1", 2, 1)
        assert produce(replicated.bootstrap, topic_name, one, acks="1") == [None, None]
        if time.monotonic() - stopped < LAG_MS / 1000 * 0.8:
            assert high_watermark(replicated.bootstrap, topic_name, 0) == committed
        wait_until(lambda: follower not in handler_isr(replicated.bootstrap, topic_name),
                   message="the ISR shrinking")
        # Lag time counts from the follower's last catch-up, at most one fetch wait before.
        assert time.monotonic() - stopped >= (LAG_MS - 600) / 1000
        # Without the follower the ISR is too small for min.insync.replicas=3.
        refused = make_messages("refused", 3, 1)
        outcomes = produce(replicated.bootstrap, topic_name, refused, retries=0,
                           **{"message.timeout.ms": 5000})
        assert [e.code() if e else None for e in outcomes] == [
            KafkaError.NOT_ENOUGH_REPLICAS] * 3
        # The replicator shrinks the ISR, then moves the leader's high watermark: the acks=1
        # records become committed a moment after the ISR change is published.
        wait_until(lambda: high_watermark(replicated.bootstrap, topic_name, 0) == committed + 2,
                   within=10, message="the high watermark after the ISR shrank")
    finally:
        process.send_signal(signal.SIGCONT)
    wait_until(lambda: sorted(partition_metadata(replicated, topic_name).isr) == [0, 1, 2],
               message="the ISR expanding")
    after = make_messages("after", 20, PARTITIONS)
    assert produce(replicated.bootstrap, topic_name, after) == [None] * len(after)
    # The refused writes were never appended; everything acknowledged is there, in order.
    expected = first + one + after
    assert_same(expected, consume_all(replicated.bootstrap, topic_name, len(expected),
                                      PARTITIONS))
    assert replica_bytes(replicated, follower, topic_name, 0) == replica_bytes(
        replicated, meta.leader, topic_name, 0)


def test_killing_the_leader_loses_no_acknowledged_record(replicated, topic_name):
    create_topic(replicated.bootstrap, topic_name, **{"min.insync.replicas": "2"})
    before = partition_metadata(replicated, topic_name)
    victim = f"log-{before.leader}"
    sent = make_messages("failover", 3000, PARTITIONS)
    producer = Producer({"bootstrap.servers": replicated.bootstrap, "acks": "all",
                         "enable.idempotence": True, "linger.ms": 5,
                         "message.timeout.ms": 60000})
    errors: list[KafkaError] = []
    delivered = [0]

    def on_delivery(err, _msg) -> None:
        if err is not None:
            errors.append(err)
        else:
            delivered[0] += 1

    killed_at = None
    try:
        for i, m in enumerate(sent):
            producer.produce(topic_name, value=m.value, key=m.key, partition=m.partition,
                             headers=list(m.headers), timestamp=m.timestamp_ms,
                             on_delivery=on_delivery)
            producer.poll(0)
            if i % 100 == 99:
                producer.flush(30)
            if killed_at is None and delivered[0] >= len(sent) // 3:
                replicated.kill(victim)  # SIGKILL, mid-stream
                killed_at = time.monotonic()
        assert producer.flush(60) == 0
    finally:
        replicated.start_service(victim)
    assert killed_at is not None
    assert errors == [] and delivered[0] == len(sent)
    after = partition_metadata(replicated, topic_name)
    assert after.leader != before.leader and after.leader_epoch == before.leader_epoch + 1
    # OffsetForLeaderEpoch, as clients ask it: epoch 0 ended where epoch 1 began.
    first = end_offset(replicated, topic_name, after.leader_epoch, 0)
    current = end_offset(replicated, topic_name, after.leader_epoch, 1)
    assert first.leader_epoch == 0 and 0 < first.end_offset <= current.end_offset
    assert current.leader_epoch == 1 and current.error_code == 0
    assert_same(sent, consume_all(replicated.bootstrap, topic_name, len(sent), PARTITIONS))
    # The old leader is back as a follower holding exactly the new leader's log.
    wait_until(lambda: sorted(partition_metadata(replicated, topic_name).isr) == [0, 1, 2],
               within=30, message="the old leader rejoining the ISR")
    meta = partition_metadata(replicated, topic_name)
    leader_copy = replica_bytes(replicated, meta.leader, topic_name, 0)
    for node in meta.replicas:
        assert replica_bytes(replicated, node, topic_name, 0) == leader_copy
