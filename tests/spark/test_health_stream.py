"""The streaming health watch: its alert rules on given snapshots, and a bounded run of the
streaming query against a real local cluster."""

from __future__ import annotations

import datetime as dt

from services.local_cluster import LocalCluster
from spark.discovery import cluster_endpoints
from spark.jobs.health_stream import Alert, HealthState, newest_snapshot, watch

UNDER = "kbroker_replicator_under_replicated_partitions"
OFFLINE = "kbroker_replicator_offline_partitions"
PENDING = "kbroker_purgatory_pending_operations"


def test_under_replicated_and_offline_take_the_max_over_replicators() -> None:
    state = HealthState()
    alerts = state.evaluate(0, [(UNDER, {}, 0.0), (UNDER, {}, 2.0), (OFFLINE, {}, 0.0)])
    assert alerts == [Alert(0, "under_replicated", "cluster", 2.0)]
    assert state.evaluate(1, [(UNDER, {}, 0.0), (OFFLINE, {}, 1.0)]) == [
        Alert(1, "offline", "cluster", 1.0)]


def test_purgatory_growth_is_flagged_against_the_previous_batch() -> None:
    state = HealthState(growth_threshold=5)
    fetch = {"kind": "fetch"}
    assert state.evaluate(0, [(PENDING, fetch, 3.0), (PENDING, fetch, 1.0)]) == []
    # Summed over purgatory shards: 4 -> 10 is +6.
    assert state.evaluate(1, [(PENDING, fetch, 6.0), (PENDING, fetch, 4.0)]) == [
        Alert(1, "purgatory_growth", "fetch", 10.0, 4.0)]
    assert state.evaluate(2, [(PENDING, fetch, 14.0)]) == []  # +4 < 5
    assert state.evaluate(3, [(PENDING, fetch, 0.0)]) == []
    assert state.batches == 4 and len(state.alerts) == 1


def test_a_batch_is_judged_by_each_endpoints_newest_snapshot() -> None:
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    t1 = t0 + dt.timedelta(seconds=1)
    rows = [
        ("a:1", t0, "p", 7, UNDER, {}, 3.0),
        ("a:1", t1, "p", 8, UNDER, {}, 0.0),
        # b restarted between its snapshots: sequence 2 of the new process is the newer one.
        ("b:1", t0, "old", 90, PENDING, {"kind": "fetch"}, 5.0),
        ("b:1", t1, "new", 2, PENDING, {"kind": "fetch"}, 1.0),
    ]
    assert newest_snapshot(rows) == [(UNDER, {}, 0.0), (PENDING, {"kind": "fetch"}, 1.0)]


def test_bounded_stream_reads_a_healthy_cluster(cluster: LocalCluster, spark) -> None:
    endpoints = [cluster.services[n].grpc_address for n in ("replicator", "purgatory")]
    assert set(endpoints) <= set(cluster_endpoints(cluster))
    state = watch(spark, {"endpoints": ",".join(endpoints)}, interval=0.5, max_batches=2,
                  timeout=60)
    assert state.batches >= 2
    assert state.latest[(UNDER, "cluster")] == 0
    assert state.latest[(OFFLINE, "cluster")] == 0
    assert [a for a in state.alerts if a.kind != "purgatory_growth"] == []
