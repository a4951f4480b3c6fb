"""The streaming health watch: its alert rules on given snapshots (purgatory growth judged
against the load), and a bounded run of the streaming query against a real local cluster with
consumers long-polling meanwhile, which must not alarm."""

from __future__ import annotations

import datetime as dt
import threading
import time
import urllib.request

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from prometheus_client.parser import text_string_to_metric_families

from services.local_cluster import LocalCluster
from spark.discovery import cluster_endpoints
from spark.jobs.health_stream import Alert, HealthState, newest_snapshot, watch

UNDER = "kbroker_replicator_under_replicated_partitions"
OFFLINE = "kbroker_replicator_offline_partitions"
PENDING = "kbroker_purgatory_pending_operations"
COMPLETED = "kbroker_purgatory_completed_total"
EXPIRED = "kbroker_purgatory_expired_total"
REQUESTS = "kbroker_frontend_requests_total"


def test_under_replicated_and_offline_take_the_max_over_replicators() -> None:
    state = HealthState()
    alerts = state.evaluate(0, [(UNDER, {}, 0.0), (UNDER, {}, 2.0), (OFFLINE, {}, 0.0)])
    assert alerts == [Alert(0, "under_replicated", "cluster", 2.0)]
    assert state.evaluate(1, [(UNDER, {}, 0.0), (OFFLINE, {}, 1.0)]) == [
        Alert(1, "offline", "cluster", 1.0)]


def purgatory(pending: float, left: float, fetches: float, produces: float = 0.0,
              kind: str = "fetch") -> list[tuple[str, dict[str, str], float]]:
    """One snapshot: a kind's pending operations (over two shards), its completed and expired
    counters, and the frontend's Fetch and Produce counters."""
    return [(PENDING, {"kind": kind}, pending / 2), (PENDING, {"kind": kind}, pending / 2),
            (COMPLETED, {"kind": kind}, left / 4), (EXPIRED, {"kind": kind}, 3 * left / 4),
            (REQUESTS, {"api": "Fetch"}, fetches), (REQUESTS, {"api": "Produce"}, produces)]


def test_long_polls_never_alarm_however_many_consumers() -> None:
    state = HealthState(min_growth=1)
    # 200 consumers long-polling with a 500 ms max wait, batches 5 s apart: about 200 parked
    # fetches at any time, 2,000 leaving per batch.
    assert state.evaluate(0, purgatory(190, 10_000, 10_000)) == []
    assert state.evaluate(1, purgatory(205, 12_000, 12_000)) == []
    # 150 more consumers start in one batch: +150 pending, but each sent fetches meanwhile.
    assert state.evaluate(2, purgatory(355, 14_600, 14_900)) == []
    assert state.evaluate(3, purgatory(340, 18_100, 18_400)) == []
    assert state.alerts == []


def test_a_stuck_purgatory_alarms_against_the_requests_that_park() -> None:
    state = HealthState()
    produce = "produce"
    assert state.evaluate(0, purgatory(4, 1000, 50, 1000, produce)) == []
    # Replication stops: every acks=all Produce parks and none leaves.
    assert state.evaluate(1, purgatory(304, 1000, 60, 1300, produce)) == [
        Alert(1, "purgatory_growth", produce, 304.0, 4.0)]
    # Under min_growth nothing alarms, whatever the ratio.
    assert HealthState(min_growth=10).evaluate(0, purgatory(0, 0, 0)) == []
    small = HealthState(min_growth=10)
    small.evaluate(0, purgatory(0, 0, 0))
    assert small.evaluate(1, purgatory(8, 0, 8)) == []
    # Counters back at zero (a purgatory restarted) count from zero, not as a negative rate.
    assert state.evaluate(2, purgatory(20, 30, 60, 1400, produce)) == []
    assert state.batches == 3 and len(state.alerts) == 1


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


def test_bounded_stream_reads_a_healthy_cluster_with_long_polling_consumers(
        cluster: LocalCluster, spark, topic_name: str) -> None:
    endpoints = [cluster.services[n].grpc_address for n in ("replicator", "purgatory",
                                                            "frontend")]
    assert set(endpoints) <= set(cluster_endpoints(cluster))
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(topic_name, num_partitions=1, replication_factor=1)],
                        request_timeout=15)[topic_name].result(timeout=20)
    stop = threading.Event()
    consumers = [Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": f"g-{i}",
                           "fetch.wait.max.ms": 100, "topic.metadata.refresh.interval.ms": 1000})
                 for i in range(4)]
    for consumer in consumers:
        consumer.assign([TopicPartition(topic_name, 0, 0)])

    def poll() -> None:
        while not stop.is_set():
            for consumer in consumers:
                consumer.poll(0.05)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    try:
        # Long polls going before the watch starts: their fetches park in the purgatory.
        deadline = time.monotonic() + 20
        while purgatory_fetches(cluster) == 0:
            assert time.monotonic() < deadline, "no consumer fetch parked"
            time.sleep(0.1)
        state = watch(spark, {"endpoints": ",".join(endpoints)}, interval=1.0, max_batches=3,
                      timeout=60, min_growth=1)
    finally:
        stop.set()
        poller.join(10)
        for consumer in consumers:
            consumer.close()
    assert state.batches >= 3
    assert state.latest[(UNDER, "cluster")] == 0
    assert state.latest[(OFFLINE, "cluster")] == 0
    assert state.alerts == []


def purgatory_fetches(cluster: LocalCluster) -> float:
    port = cluster.services["purgatory"].metrics_port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        for family in text_string_to_metric_families(reply.read().decode()):
            for sample in family.samples:
                if sample.name == PENDING and sample.labels.get("kind") == "fetch":
                    return sample.value
    return 0.0
