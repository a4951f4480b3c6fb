"""What each log node is sent to replicate: the replica.* settings, its throttle rates (its own
dynamic broker config, else the cluster-wide one; none: unlimited) and every node's address."""

from __future__ import annotations

from services.replicator.controller.config_resources import BROKER
from services.replicator.metadata import LogNode, MetadataImage, NodeId
from services.replicator.replication.settings import ReplicaSettings, node_settings


def image(resources: dict) -> MetadataImage:
    return MetadataImage(cluster_id="c", version=1,
                         log_nodes=tuple(LogNode(node_id=NodeId(n), address=f"h:{n}", alive=True)
                                         for n in (0, 1, 2)),
                         config_resources=resources)


def test_each_node_gets_its_own_rates_else_the_cluster_wide_ones():
    resources = {(BROKER, ""): {"leader.replication.throttled.rate": "1000"},
                 (BROKER, "2"): {"leader.replication.throttled.rate": "5",
                                 "follower.replication.throttled.rate": "7"}}
    replica = ReplicaSettings(lag_time_max_ms=600, fetch_wait_max_ms=200)
    one = node_settings(image(resources), NodeId(1), replica)
    assert dict(one.configs) == {
        "replica.lag.time.max.ms": "600", "replica.fetch.wait.max.ms": "200",
        "replica.fetch.max.bytes": "1048576", "replica.fetch.response.max.bytes": "10485760",
        "replica.fetch.backoff.ms": "200", "leader.replication.throttled.rate": "1000"}
    assert dict(one.log_nodes) == {0: "h:0", 1: "h:1", 2: "h:2"}
    two = node_settings(image(resources), NodeId(2), replica)
    assert (two.configs["leader.replication.throttled.rate"],
            two.configs["follower.replication.throttled.rate"]) == ("5", "7")
    assert "leader.replication.throttled.rate" not in node_settings(
        image({}), NodeId(0), replica).configs
