"""Partition reassignments under load, as an operator moves replicas onto a new log node:
every partition of the workload's topic gets one replica replaced by the log node it did not
have (for some partitions the leader's own replica, so leadership moves when the reassignment
completes), all at once, while idempotent acks=all producers (RF=3, min.insync.replicas=2) and
a consumer group run. The new replicas copy the partitions from their leaders, join the ISRs,
the old replicas are dropped, and: no acknowledged record is lost or stored twice, no delivery
report fails, the group reads everything, and each partition ends on exactly its target
replicas.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from kafka import KafkaAdminClient
from kafka import TopicPartition as KTopicPartition

from services.local_cluster import LocalCluster
from tests.chaos.checker import findings_by_fault
from tests.chaos.faults import FaultSettings
from tests.chaos.harness import ChaosRun, ChaosSettings

pytestmark = pytest.mark.processes

LOG_NODES = 4


def placement(cluster: LocalCluster, topic: str) -> dict[int, tuple[list[int], int]]:
    """Each partition's (replicas, leader) as the replicator has them."""
    from kbroker.replicator.v1 import replicator_pb2, replicator_pb2_grpc

    with cluster.health_channel("replicator") as channel:
        metadata = replicator_pb2_grpc.ReplicatorStub(channel).GetMetadata(
            replicator_pb2.GetMetadataRequest(topics=[topic]), timeout=5)
    return {p.partition: (list(p.replicas), p.leader) for p in metadata.topics[0].partitions}


def targets(current: dict[int, tuple[list[int], int]]) -> dict[int, list[int]]:
    """Replace one replica of each partition by the node it lacks: the leader's own replica
    for even partitions (its leadership must move), a follower's for odd ones."""
    moves = {}
    for partition, (replicas, leader) in current.items():
        missing = next(n for n in range(LOG_NODES) if n not in replicas)
        leaving = leader if partition % 2 == 0 else next(r for r in replicas if r != leader)
        moves[partition] = [missing if r == leaving else r for r in replicas]
    return moves


def test_replicas_moved_under_load_lose_nothing_and_fail_no_produce(tmp_path: Path) -> None:
    settings = ChaosSettings(log_nodes=LOG_NODES, stuck_after=12.0, settle_timeout=45.0,
                             rate=60.0, links=(), faults=FaultSettings(heal_timeout=45.0))
    with ChaosRun(tmp_path, settings) as run:
        assert run.workload is not None and run.injector is not None
        run.injector.hold(5.0)  # records for the new replicas to copy
        wanted = targets(placement(run.cluster, run.topic))
        client = KafkaAdminClient(bootstrap_servers=run.cluster.bootstrap,
                                  request_timeout_ms=30000)
        try:
            started = time.monotonic()
            answers = client.alter_partition_reassignments(
                {KTopicPartition(run.topic, p): replicas for p, replicas in wanted.items()})
            assert set(answers.values()) == {None}, answers
            deadline = time.monotonic() + 60
            while client.list_partition_reassignments():
                assert time.monotonic() < deadline, (
                    f"reassignments not done within 60 s: {placement(run.cluster, run.topic)}"
                    f"\n{run.logs()}")
                time.sleep(0.2)
            print(f"\nreassignments done in {time.monotonic() - started:.1f}s")
        finally:
            client.close()
        run.settle(since=time.monotonic(), what="the reassignments")
        run.injector.hold(3.0)  # and production on the new replicas
        final = placement(run.cluster, run.topic)
        report = run.finish()
        print(report.describe())
        workload = run.workload
        assert report.ok, (f"{report.describe()}\nby fault: "
                           f"{findings_by_fault(report, workload.history)}\n{run.logs()}")
        assert report.lost == [] and report.duplicates == []
        assert report.failed_deliveries == 0, workload.history.failed[:5]
        assert [e for e in workload.errors if " produce: " in e] == []
        assert {p: sorted(r) for p, (r, _) in final.items()} == {
            p: sorted(r) for p, r in wanted.items()}
        assert all(leader in wanted[p] for p, (_, leader) in final.items()), final
