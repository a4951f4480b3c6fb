"""The cluster metadata lives in the metadata log on the log nodes, not on the replicator's
disk: on a cluster of its own, the replicator is killed (SIGKILL) and its data directory
deleted, and the restarted replicator still knows every topic with its leaders, leader
epochs and ISR (as a real client's Metadata shows them), and clients carry on producing and
consuming."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator

import grpc
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from kbroker.log.v1 import log_pb2, log_pb2_grpc
from kbroker.replicator.v1 import replicator_pb2, replicator_pb2_grpc
from services.local_cluster import ClusterSpec, LocalCluster

from .records import assert_same, make_messages
from .test_confluent_kafka import consume_all

PARTITIONS = 3


@pytest.fixture(scope="module")
def metadata_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    spec = ClusterSpec(
        data_dir=tmp_path_factory.mktemp("metadata-log"), kafka_port=0, base_port=0,
        handlers=1, log_nodes=3, num_partitions=PARTITIONS, default_replication_factor=3,
        replica_lag_time_max_ms=2000,
        log_level=os.environ.get("KBROKER_TEST_LOG_LEVEL", "INFO"),
    )
    cluster = LocalCluster(spec)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def wait_until(condition, within: float = 30.0, message: str = "condition") -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, f"{message} not reached within {within}s"
        time.sleep(0.2)


def replicator_metadata(cluster: LocalCluster) -> replicator_pb2.ClusterMetadata:
    with grpc.insecure_channel(cluster.services["replicator"].grpc_address) as channel:
        stub = replicator_pb2_grpc.ReplicatorStub(channel)
        return stub.GetMetadata(replicator_pb2.GetMetadataRequest(), timeout=10)


def replicator_topics(cluster: LocalCluster) -> dict[str, object]:
    """Every topic with its id, configs and partitions (leader, leader epoch, replicas, ISR)."""
    return {
        t.name: (t.topic_id, dict(t.configs), [
            (p.partition, p.leader, p.leader_epoch, list(p.replicas), sorted(p.isr))
            for p in t.partitions])
        for t in replicator_metadata(cluster).topics
    }


def client_topics(bootstrap: str, names: list[str]) -> dict[str, object]:
    """What a Kafka client's Metadata says: per topic and partition, leader, replicas, ISR."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    metadata = admin.list_topics(timeout=10)
    out = {}
    for name in names:
        topic = metadata.topics.get(name)
        if topic is None or topic.error is not None:
            out[name] = None
            continue
        out[name] = {p.id: (p.leader, list(p.replicas), sorted(p.isrs))
                     for p in topic.partitions.values()}
    return out


def produce(bootstrap: str, topic: str, messages) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5,
                         "enable.idempotence": True})
    failures: list[str] = []
    for m in messages:
        producer.produce(topic, value=m.value, key=m.key, partition=m.partition,
                         headers=list(m.headers), timestamp=m.timestamp_ms,
                         on_delivery=lambda err, _msg: failures.append(str(err)) if err else None)
    assert producer.flush(60) == 0
    assert failures == []


def metadata_log_ends(cluster: LocalCluster) -> list[int]:
    """Each log node's end offset of __cluster_metadata-0."""
    ends = []
    for i in range(cluster.spec.log_nodes):
        with grpc.insecure_channel(cluster.services[f"log-{i}"].grpc_address) as channel:
            stub = log_pb2_grpc.LogServiceStub(channel)
            reply = stub.DescribePartitions(log_pb2.DescribePartitionsRequest(partitions=[
                log_pb2.TopicPartition(topic="__cluster_metadata", partition=0)]), timeout=10)
            state = reply.partitions[0]
            assert state.error_code == 0, state
            ends.append(state.log_end_offset)
    return ends


def test_the_replicator_rebuilds_the_metadata_from_the_log_nodes(metadata_cluster, topic_name):
    cluster = metadata_cluster
    names = [f"{topic_name}-rf3", f"{topic_name}-rf1"]
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    futures = admin.create_topics([
        NewTopic(names[0], num_partitions=PARTITIONS, replication_factor=3,
                 config={"min.insync.replicas": "2", "retention.ms": "86400000"}),
        NewTopic(names[1], num_partitions=2, replication_factor=1)], request_timeout=15)
    for future in futures.values():
        future.result(timeout=20)
    first = make_messages("before", 300, PARTITIONS)
    produce(cluster.bootstrap, names[0], first)
    wait_until(lambda: all(len(p[4]) == 3 for p in replicator_topics(cluster)[names[0]][2]),
               message="full ISRs")
    before = replicator_topics(cluster)
    seen_by_client = client_topics(cluster.bootstrap, names)
    assert all(seen_by_client[n] for n in names), seen_by_client
    cluster_id = replicator_metadata(cluster).cluster_id
    assert all(end > 0 for end in metadata_log_ends(cluster))

    # Nothing of the metadata is on the replicator's disk; whatever its data directory
    # holds goes with it.
    assert not (cluster.data_dir / "replicator" / "metadata.json").exists()
    cluster.kill("replicator")
    shutil.rmtree(cluster.data_dir / "replicator", ignore_errors=True)
    cluster.start_service("replicator", wait=True, timeout=90)

    after = replicator_metadata(cluster)
    assert after.cluster_id == cluster_id
    assert replicator_topics(cluster) == before
    # Handlers follow the new replicator's metadata stream; clients see the same topics.
    wait_until(lambda: client_topics(cluster.bootstrap, names) == seen_by_client,
               message="clients seeing the same metadata")
    second = make_messages("after", 300, PARTITIONS)
    produce(cluster.bootstrap, names[0], second)
    assert_same(first + second, consume_all(cluster.bootstrap, names[0], 600, PARTITIONS))
    # The replicator still writes to the log: a new topic survives the next restart too.
    futures = admin.create_topics([NewTopic(f"{topic_name}-later", num_partitions=1,
                                            replication_factor=3)], request_timeout=15)
    futures[f"{topic_name}-later"].result(timeout=20)
    cluster.kill("replicator")
    shutil.rmtree(cluster.data_dir / "replicator", ignore_errors=True)
    cluster.start_service("replicator", wait=True, timeout=90)
    assert f"{topic_name}-later" in replicator_topics(cluster)
