"""The batch latency report against a real local cluster after real client traffic: its request
counts per API equal the frontend's Prometheus counters read over HTTP, phase means add up to
the total, the consumer lag of a group equals its committed offsets against the partitions'
high watermarks, and it writes its Parquet tables, chart and summary."""

from __future__ import annotations

import time
import urllib.request
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from prometheus_client.parser import text_string_to_metric_families

from services.local_cluster import LocalCluster
from spark.discovery import cluster_endpoints
from spark.group_offsets import compute_lag
from spark.jobs.latency_report import run

MESSAGES = 200


def frontend_requests(cluster: LocalCluster) -> dict[str, int]:
    port = cluster.services["frontend"].metrics_port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    counts: dict[str, int] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "kbroker_frontend_requests_total":
                counts[sample.labels["api"]] = int(sample.value)
    return counts


def settled_requests(cluster: LocalCluster, timeout: float = 10.0) -> dict[str, int]:
    """The counters once they stop moving: a long-poll Fetch still parked when its consumer
    closed is counted when it answers (fetch.wait.max.ms = 500 ms later)."""
    deadline = time.monotonic() + timeout
    last = frontend_requests(cluster)
    while True:
        time.sleep(0.7)
        now = frontend_requests(cluster)
        if now == last:
            return now
        assert time.monotonic() < deadline, f"frontend counters still moving: {last} -> {now}"
        last = now


def client_traffic(bootstrap: str, topic: str) -> dict[int, tuple[int, int]]:
    """Produce and consume; commit offsets of group g-<topic> part-way. Returns the committed
    offset and high watermark per partition."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)],
                                  request_timeout=15)
    futures[topic].result(timeout=20)
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    failures: list[str] = []
    for i in range(MESSAGES):
        producer.produce(topic, value=b"v%d" % i, key=b"k%d" % (i % 7),
                         on_delivery=lambda err, _m: err and failures.append(str(err)))
    assert producer.flush(30) == 0
    assert failures == []
    # Assigned partitions, no group: this test is about request metrics, not the group protocol.
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{topic}",
                         "enable.auto.commit": False, "enable.partition.eof": True})
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(2)])
        got = 0
        deadline = time.monotonic() + 30
        while got < MESSAGES and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
                continue
            got += 1
        assert got == MESSAGES
        high = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in range(2)}
        committed = {p: high[p] // (p + 2) for p in range(2)}
        consumer.commit(offsets=[TopicPartition(topic, p, o) for p, o in committed.items()],
                        asynchronous=False)
        return {p: (committed[p], high[p]) for p in range(2)}
    finally:
        consumer.close()


def test_report_counts_equal_prometheus_counters(cluster, spark, tmp_path: Path) -> None:
    topic = f"spark-report-{uuid.uuid4().hex[:8]}"
    offsets = client_traffic(cluster.bootstrap, topic)
    before = settled_requests(cluster)
    report = run(spark, {"endpoints": ",".join(cluster_endpoints(cluster))}, tmp_path / "out")
    after = frontend_requests(cluster)
    assert before == after
    assert {"Produce", "Fetch", "CreateTopics", "Metadata"} <= set(before)

    assert {r["api"]: r["requests"] for r in report.requests} == before

    latency = {(r["api"], r["phase"]): r for r in report.latency}
    for phase in ("request_queue", "local", "remote", "response_queue", "response_send",
                  "total"):
        for api in ("Produce", "Fetch"):
            row = latency[(api, phase)]
            assert row["count"] == before[api]
            assert 0 <= row["p50_seconds"] <= row["p99_seconds"] <= row["p999_seconds"]
    # The phases of a request add up to its total: so do their means.
    for api in ("Produce", "Fetch"):
        phases = sum(latency[(api, p)]["mean_seconds"] for p in (
            "request_queue", "local", "remote", "response_queue", "response_send"))
        assert phases == pytest.approx(latency[(api, "total")]["mean_seconds"], rel=1e-6)
    # The consumer's fetches at the end of the data parked in the purgatory (remote time).
    assert latency[("Fetch", "remote")]["mean_seconds"] > 0
    assert latency[("Produce", "total")]["mean_seconds"] \
        >= latency[("Produce", "remote")]["mean_seconds"]

    topics = {r["topic"]: r for r in report.topics}
    row = topics[topic]
    assert row["appended_batches"] > 0
    assert row["read_bytes"] > 0
    # Replication factor 1: the frontend's bytes in are exactly the bytes the leaders appended,
    # and the consumer fetched every record once.
    assert row["bytes_in"] == row["appended_bytes"] > 0
    assert row["bytes_out"] >= row["bytes_in"]
    assert row["bytes_in_per_s"] > 0 and row["bytes_out_per_s"] > 0

    # No client telemetry subscription on this cluster (test_client_telemetry has one).
    assert report.client_latency == []
    assert "## Client-side latency" in (report.output / "report.md").read_text()
    lag = {(r["topic"], r["partition"]): r for r in report.consumer_lag
           if r["group"] == f"g-{topic}"}
    assert {p: (lag[(topic, p)]["committed_offset"], lag[(topic, p)]["high_watermark"])
            for p in range(2)} == offsets
    assert all(r["lag"] == r["high_watermark"] - r["committed_offset"] > 0
               for r in lag.values())

    out = report.output
    for name in ("metrics", "requests", "latency", "topics", "purgatory", "consumer_lag",
                 "client_latency"):
        assert list((out / f"{name}.parquet").glob("*.parquet")), name
    assert spark.read.parquet(str(out / "requests.parquet")).count() == len(before)
    assert (out / "latency.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = (out / "report.md").read_text()
    assert "| Produce |" in summary and "latency.png" in summary


def test_lag_rows_from_offsets() -> None:
    rows = compute_lag({"g": {("t", 0): 5, ("t", 1): -1, ("u", 0): 9}},
                       {("t", 0): 12, ("t", 1): 4})
    assert [(r.topic, r.partition, r.high_watermark, r.lag) for r in rows] == [
        ("t", 0, 12, 7), ("t", 1, 4, None), ("u", 0, None, None)]
