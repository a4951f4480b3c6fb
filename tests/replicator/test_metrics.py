"""Replicator metrics from metadata images: partition health gauges and ISR changes counted
between successive images; follower lag only where it is measured."""

from __future__ import annotations

from prometheus_client import REGISTRY

from services.replicator import metrics
from services.replicator.metadata import (
    LogNode,
    MetadataImage,
    NodeId,
    PartitionRegistration,
    TopicName,
    TopicRegistration,
)


def image(version: int, isr: tuple[int, ...], alive: tuple[int, ...] = (1, 2, 3)
          ) -> MetadataImage:
    nodes = tuple(LogNode(node_id=NodeId(n), address=f"h:{n}", alive=n in alive)
                  for n in (1, 2, 3))
    partition = PartitionRegistration(
        partition=0, leader=NodeId(isr[0]) if isr else NodeId(-1), leader_epoch=0,
        replicas=(NodeId(1), NodeId(2), NodeId(3)), isr=tuple(NodeId(n) for n in isr))
    topic = TopicRegistration(name=TopicName("metrics-isr"), topic_id="id", configs={},
                              partitions=(partition,))
    return MetadataImage(cluster_id="c", version=version, log_nodes=nodes,
                         topics={topic.name: topic})


def value(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


def test_isr_changes_and_partition_health_follow_the_images() -> None:
    shrinks, expands = (value("kbroker_replicator_isr_shrinks_total"),
                        value("kbroker_replicator_isr_expands_total"))
    metrics.observe(image(1, (1, 2, 3)))
    assert value("kbroker_replicator_under_replicated_partitions") == 0
    metrics.observe(image(2, (1, 2, 3)))  # unchanged: nothing counted
    metrics.observe(image(3, (1, 2), alive=(1, 2)))  # node 3 dropped out
    assert value("kbroker_replicator_under_replicated_partitions") == 1
    assert value("kbroker_replicator_isr_shrinks_total") - shrinks == 1
    metrics.observe(image(4, (1, 3)))  # 2 out, 3 back: one of each
    metrics.observe(image(5, (1, 2, 3)))
    assert value("kbroker_replicator_isr_shrinks_total") - shrinks == 2
    assert value("kbroker_replicator_isr_expands_total") - expands == 2
    assert value("kbroker_replicator_under_replicated_partitions") == 0
    metrics.observe(image(6, ()))
    assert value("kbroker_replicator_offline_partitions") == 1

