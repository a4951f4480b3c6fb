"""The capacity plan on given numbers (growth, retention, skew, moves, log nodes to add), and the
capacity report against the shared local cluster while a producer writes: its sizes equal the
log nodes' gauges, growth shows where the records go, and its tables, chart and summary are
written."""

from __future__ import annotations

import threading
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from prometheus_client.parser import text_string_to_metric_families

from services.local_cluster import LocalCluster
from spark.capacity import (
    DAY_S,
    NodeDisk,
    PartitionPlacement,
    ReplicaSample,
    partition_capacity,
    plan,
)
from spark.discovery import cluster_endpoints
from spark.jobs.capacity_report import run

MIB = 2**20


def replica(node: int, topic: str, partition: int, size: float, grew: float = 0.0
            ) -> ReplicaSample:
    return ReplicaSample(node, topic, partition, size - grew, size, 0.0, grew / 100)


def test_retention_holds_a_partition_where_its_limits_meet_its_growth() -> None:
    placement = PartitionPlacement("t", 0, 1, (1, 2), {"retention.ms": "3600000"})
    # 10 MiB now, 1 KiB/s on the leader (node 1; the follower's catch-up does not count).
    part = partition_capacity(placement, [replica(1, "t", 0, 10 * MIB, 10 * 1024),
                                          replica(2, "t", 0, 5 * MIB, 5 * MIB)], 10.0)
    assert part.growth_bytes_per_s == 1024
    assert part.retained_bytes == pytest.approx(max(10 * MIB, 1024 * 3600))
    assert part.headroom_bytes is None
    capped = PartitionPlacement("t", 0, 1, (1,), {"retention.bytes": str(20 * MIB),
                                                  "retention.ms": "-1"})
    part = partition_capacity(capped, [replica(1, "t", 0, 10 * MIB, 10 * 1024)], 10.0)
    assert part.retained_bytes == 20 * MIB and part.headroom_bytes == 10 * MIB
    unbounded = PartitionPlacement("t", 0, 1, (1,), {"retention.ms": "-1"})
    assert partition_capacity(unbounded, [replica(1, "t", 0, MIB, 1024)],
                              1.0).retained_bytes is None
    compacted = PartitionPlacement("t", 0, 1, (1,), {"cleanup.policy": "compact"})
    assert partition_capacity(compacted, [replica(1, "t", 0, MIB, 1024)],
                              1.0).retained_bytes == MIB


def test_skewed_nodes_get_moves_that_even_them_out() -> None:
    # Node 0 holds three big partitions, nodes 1 and 2 one small one each.
    placements = [PartitionPlacement("big", p, 0, (0,)) for p in range(3)] + [
        PartitionPlacement("small", p, p + 1, (p + 1,)) for p in range(2)]
    samples = [replica(0, "big", p, 100 * MIB) for p in range(3)] + [
        replica(p + 1, "small", p, 10 * MIB) for p in range(2)]
    disks = [NodeDisk(n, 10_000 * MIB, 9_000 * MIB) for n in range(3)]
    result = plan(placements, samples, disks, [0, 1, 2], 10.0)
    assert [n.skew for n in result.nodes][0] == pytest.approx(300 / (320 / 3))
    assert [(m.topic, m.from_node) for m in result.moves] == [("big", 0), ("big", 0)]
    assert {m.to_node for m in result.moves} == {1, 2}
    after = {0: 300.0, 1: 10.0, 2: 10.0}
    for move in result.moves:
        after[move.from_node] -= move.bytes / MIB
        after[move.to_node] += move.bytes / MIB
    assert max(after.values()) == 110
    assert result.add_log_nodes == 0
    # A move never lands where the partition already has a replica.
    shared = [PartitionPlacement("r", 0, 0, (0, 1)), PartitionPlacement("s", 0, 2, (2,))]
    two = plan(shared, [replica(0, "r", 0, 100 * MIB), replica(1, "r", 0, 100 * MIB),
                        replica(2, "s", 0, MIB)], disks, [0, 1, 2], 10.0)
    assert all(m.to_node == 2 for m in two.moves)


def test_full_disks_ask_for_log_nodes() -> None:
    placements = [PartitionPlacement("t", p, p, (p,)) for p in range(2)]
    # 1 MiB/s into each partition kept 7 days by default: ~590 GiB per node, on 500 GiB disks.
    samples = [replica(p, "t", p, 10 * MIB, 10 * MIB) for p in range(2)]
    disks = [NodeDisk(n, 500 * 2**30, 400 * 2**30) for n in range(2)]
    result = plan(placements, samples, disks, [0, 1], 10.0)
    assert result.add_log_nodes == 2  # ~1.2 TiB at 80% of 500 GiB disks: 3 nodes -> 4
    assert result.nodes[0].days_to_full == pytest.approx(400 * 2**30 / MIB / DAY_S)
    assert "add 2 log node(s)" in result.advice[0]


def log_gauges(cluster: LocalCluster, topic: str) -> dict[tuple[str, int], float]:
    """kbroker_log_partition_size_bytes of ``topic`` per (log node, partition)."""
    out = {}
    for name, svc in cluster.services.items():
        if svc.kind != "log":
            continue
        url = f"http://127.0.0.1:{svc.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as reply:
            for family in text_string_to_metric_families(reply.read().decode()):
                for sample in family.samples:
                    if (sample.name == "kbroker_log_partition_size_bytes"
                            and sample.labels["topic"] == topic):
                        out[(name, int(sample.labels["partition"]))] = sample.value
    return out


def test_capacity_report_on_a_live_cluster(cluster: LocalCluster, spark,
                                           tmp_path: Path) -> None:
    topic = f"capacity-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=3, replication_factor=2,
                                  config={"retention.bytes": str(64 * MIB)})],
                        request_timeout=15)[topic].result(timeout=20)
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all",
                         "linger.ms": 5})
    stop = threading.Event()

    def write() -> None:
        # Partition 0 only: it grows, the others do not.
        while not stop.is_set():
            for _ in range(20):
                producer.produce(topic, b"x" * 1000, partition=0)
            producer.flush(10)
            time.sleep(0.1)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        report = run(spark, {"endpoints": ",".join(cluster_endpoints(cluster))},
                     tmp_path / "capacity", window_s=2.0)
    finally:
        stop.set()
        writer.join(15)
        producer.flush(10)
    parts = {p.partition: p for p in report.plan.partitions if p.topic == topic}
    assert set(parts) == {0, 1, 2}
    assert parts[0].growth_bytes_per_s > 500 and parts[0].records_per_s > 0.5
    assert parts[1].growth_bytes_per_s == parts[2].growth_bytes_per_s == 0
    assert parts[0].retention_bytes == 64 * MIB
    assert parts[0].headroom_bytes == 64 * MIB - parts[0].size_bytes
    assert all(len(p.replicas.split(",")) == 2 for p in parts.values())
    # Sizes are the leaders' gauges, read over HTTP after the run (they only grow).
    gauges = log_gauges(cluster, topic)
    for p in parts.values():
        assert p.size_bytes <= gauges[(f"log-{p.leader}", p.partition)]
    assert parts[0].size_bytes > 0 and parts[1].size_bytes == parts[2].size_bytes == 0
    nodes = {n.node: n for n in report.plan.nodes}
    assert set(nodes) == {0, 1, 2}
    assert all(n.total_bytes and n.free_bytes for n in nodes.values())
    assert sum(n.skew for n in nodes.values()) == pytest.approx(3.0)
    # Partition 0's growth counts on both nodes holding a replica.
    assert sum(n.growth_bytes_per_s for n in nodes.values()) >= 2 * parts[0].growth_bytes_per_s
    for name in ("partitions", "topics", "nodes", "moves"):
        assert list((report.output / f"{name}.parquet").glob("*.parquet")), name
    assert spark.read.parquet(str(report.output / "nodes.parquet")).count() == 3
    assert (report.output / "capacity.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"| {topic} |" in (report.output / "report.md").read_text()
