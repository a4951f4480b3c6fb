"""Dynamic broker configs: only the replication throttle rates change at runtime, validated as
Kafka validates them, per log node or cluster-wide, and resolved node first."""

from __future__ import annotations

from kbroker.replicator.v1 import replicator_pb2 as pb
from services.common.errors import ErrorCode
from services.replicator.controller.config_resources import (
    BROKER,
    alter,
    broker_config,
    with_configs,
)
from services.replicator.metadata import LogNode, MetadataImage, NodeId

RATE = "leader.replication.throttled.rate"
IMAGE = MetadataImage(cluster_id="c", version=1, log_nodes=tuple(
    LogNode(node_id=NodeId(n), address=f"h:{n}", alive=True) for n in (0, 1)))


def change(name: str, *changes: tuple[str, int, str], replace: bool = False
           ) -> pb.ConfigResourceChanges:
    return pb.ConfigResourceChanges(resource_type=BROKER, name=name, replace=replace, changes=[
        pb.ConfigChange(name=n, operation=op, value=v) for n, op, v in changes])


def test_rates_are_set_per_node_or_cluster_wide_and_resolved_node_first():
    changed, results = alter(IMAGE, [change("", (RATE, pb.ConfigChange.SET, "100")),
                                     change("1", (RATE, pb.ConfigChange.SET, "7"))])
    assert [r.error_code for r in results] == [0, 0]
    image = with_configs(IMAGE, changed)
    assert broker_config(image, 0, RATE) == "100" and broker_config(image, 1, RATE) == "7"
    changed, _ = alter(image, [change("1", (RATE, pb.ConfigChange.DELETE, ""))])
    image = with_configs(image, changed)
    assert broker_config(image, 1, RATE) == "100"
    assert (BROKER, "1") not in image.config_resources


def test_kafkas_errors():
    cases = [
        (change("", ("num.partitions", pb.ConfigChange.SET, "3")), ErrorCode.invalid_request),
        (change("", (RATE, pb.ConfigChange.SET, "-1")), ErrorCode.invalid_config),
        (change("", (RATE, pb.ConfigChange.SET, "fast")), ErrorCode.invalid_config),
        (change("", (RATE, pb.ConfigChange.APPEND, "1")), ErrorCode.invalid_config),
        (change("9", (RATE, pb.ConfigChange.SET, "1")), ErrorCode.invalid_request),
        (change("x", (RATE, pb.ConfigChange.SET, "1")), ErrorCode.invalid_request),
    ]
    for request, code in cases:
        changed, [result] = alter(IMAGE, [request])
        assert (changed, result.error_code) == ({}, code.value), request
    _, results = alter(IMAGE, [change("0"), change("0")])
    assert [r.error_code for r in results] == [0, ErrorCode.invalid_request.value]
