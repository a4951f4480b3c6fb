"""Replication throttles: only the replicas a topic names are held back, at the rate of the
log node (its own dynamic config, else the cluster-wide one), one second of burst."""

from __future__ import annotations

from services.replicator.controller.config_resources import BROKER
from services.replicator.metadata import (
    LogNode,
    MetadataImage,
    NodeId,
    PartitionRegistration,
    TopicName,
    TopicRegistration,
)
from services.replicator.replication.throttle import ReplicationThrottle, throttled_replicas


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def image(configs: dict[str, str], resources: dict) -> MetadataImage:
    topic = TopicRegistration(name=TopicName("t"), topic_id="id", configs=configs, partitions=(
        PartitionRegistration(partition=0, leader=NodeId(0), leader_epoch=0,
                              replicas=(NodeId(0), NodeId(1)), isr=(NodeId(0),)),))
    return MetadataImage(cluster_id="c", version=1, topics={topic.name: topic},
                         log_nodes=tuple(LogNode(node_id=NodeId(n), address=f"h:{n}", alive=True)
                                         for n in (0, 1, 2)),
                         config_resources=resources)


def test_the_throttled_replicas_of_a_topic():
    assert throttled_replicas("*") is None
    assert throttled_replicas("0:1, 2:3") == {(0, 1), (2, 3)}
    assert throttled_replicas("") == frozenset()


def test_a_throttled_copy_waits_for_its_bucket_and_others_never_do():
    clock = Clock()
    throttle = ReplicationThrottle(clock)
    throttle.update(image({"leader.replication.throttled.replicas": "0:0"},
                          {(BROKER, ""): {"leader.replication.throttled.rate": "1000"},
                           (BROKER, "2"): {"leader.replication.throttled.rate": "5"}}))
    assert throttle.rates == {("leader", 0): 1000, ("leader", 1): 1000, ("leader", 2): 5}
    key = ("t", 0)
    assert throttle.delay(key, NodeId(0), NodeId(1)) == 0
    throttle.record(key, NodeId(0), NodeId(1), 3000)  # a second's worth and two more
    assert 1.9 < throttle.delay(key, NodeId(0), NodeId(1)) < 2.1
    clock.now += 2.05
    assert throttle.delay(key, NodeId(0), NodeId(1)) == 0
    # Node 1 leading replica 0 is not named: not throttled.
    throttle.record(key, NodeId(1), NodeId(0), 10_000)
    assert throttle.delay(key, NodeId(1), NodeId(0)) == 0
    # No rate set anywhere: nothing is throttled.
    throttle.update(image({"leader.replication.throttled.replicas": "*"}, {}))
    throttle.record(key, NodeId(0), NodeId(1), 10**9)
    assert throttle.delay(key, NodeId(0), NodeId(1)) == 0
