"""Client telemetry (KIP-714) end to end, on a cluster of its own whose handler subscribes
clients to producer and consumer metrics every second: the error cases as raw Kafka frames
through the frontend, librdkafka (confluent-kafka) pushing its metrics by itself, the handler
exposing them as Prometheus text and through Metrics/Snapshot (the Spark data source), and the
latency report's table and chart of the clients' request latency.

One handler, so the per-handler push-rate state of the wire checks is the one every request
reaches."""

from __future__ import annotations

import socket
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.get_telemetry_subscriptions.v0.request import GetTelemetrySubscriptionsRequest
from kio.schema.push_telemetry.v0.request import PushTelemetryRequest
from kio.static.primitive import i8, i32
from opentelemetry.proto.metrics.v1 import metrics_pb2 as otlp
from prometheus_client.parser import text_string_to_metric_families

from services.common.records.compression import ZSTD, compress
from services.local_cluster import ClusterSpec, LocalCluster
from spark.discovery import cluster_endpoints
from spark.jobs.latency_report import client_latency, write_chart
from tests.e2e.wire import encode_request, read_response

SUBSCRIBED = "org.apache.kafka.producer.,org.apache.kafka.consumer."
INTERVAL_MS = 1000
MAX_BYTES = 8192
PRODUCER_LATENCY = "kbroker_client_producer_node_request_latency_avg_seconds"
CONSUMER_LATENCY = "kbroker_client_consumer_node_request_latency_avg_seconds"


@pytest.fixture(scope="module")
def telemetry_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    spec = ClusterSpec(
        data_dir=tmp_path_factory.mktemp("telemetry"), kafka_port=0, base_port=0, handlers=1,
        log_nodes=1, service_flags={"handler": {
            "client_telemetry_metrics": SUBSCRIBED,
            "client_telemetry_push_interval_ms": INTERVAL_MS,
            "client_telemetry_max_bytes": MAX_BYTES}})
    cluster = LocalCluster(spec)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


class Wire:
    def __init__(self, address: str) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.correlation = 0

    def call(self, request: object) -> object:
        self.correlation += 1
        self.sock.sendall(encode_request(request, self.correlation, client_id="wire"))
        correlation, response = read_response(self.sock, type(request))
        assert correlation == self.correlation
        return response

    def push(self, client: uuid.UUID | None, subscription: int, payload: bytes = b"",
             codec: int = 0, terminating: bool = False) -> int:
        response = self.call(PushTelemetryRequest(
            client_instance_id=client, subscription_id=i32(subscription),
            terminating=terminating, compression_type=i8(codec), metrics=payload))
        return int(response.error_code)  # type: ignore[attr-defined]


def gauge_push(value_ms: float) -> bytes:
    data = otlp.MetricsData()
    metric = data.resource_metrics.add().scope_metrics.add().metrics.add(
        name="org.apache.kafka.producer.record.queue.time.avg", unit="ms")
    metric.gauge.data_points.add(as_double=value_ms)
    return data.SerializeToString()


def test_wire_answers_and_errors_as_kafka(telemetry_cluster: LocalCluster) -> None:
    wire = Wire(telemetry_cluster.bootstrap)
    try:
        first = wire.call(GetTelemetrySubscriptionsRequest(client_instance_id=None))
        assert first.error_code == 0  # type: ignore[attr-defined]
        client = first.client_instance_id  # type: ignore[attr-defined]
        sub = int(first.subscription_id)  # type: ignore[attr-defined]
        assert client is not None
        assert list(first.accepted_compression_types) == [4, 3, 1, 2]  # type: ignore[attr-defined]
        assert first.push_interval.total_seconds() * 1000 == INTERVAL_MS  # type: ignore[attr-defined]
        assert first.telemetry_max_bytes == MAX_BYTES  # type: ignore[attr-defined]
        assert first.delta_temporality is True  # type: ignore[attr-defined]
        assert list(first.requested_metrics) == SUBSCRIBED.split(",")  # type: ignore[attr-defined]
        # Asking again at once is too early.
        again = wire.call(GetTelemetrySubscriptionsRequest(client_instance_id=client))
        assert again.error_code == 89  # type: ignore[attr-defined]  THROTTLING_QUOTA_EXCEEDED
        assert wire.push(None, sub) == 42  # INVALID_REQUEST: no client instance id
        assert wire.push(client, sub + 1) == 117  # UNKNOWN_SUBSCRIPTION_ID
        assert wire.push(client, sub) == 89  # that failed push used this interval's turn
        time.sleep(INTERVAL_MS / 1000)
        assert wire.push(client, sub, b"\x00" * (MAX_BYTES + 1)) == 118  # TELEMETRY_TOO_LARGE
        time.sleep(INTERVAL_MS / 1000)
        bomb = compress(ZSTD, b"\x00" * (20 * MAX_BYTES))
        assert wire.push(client, sub, bomb, codec=ZSTD) == 118  # too large once decompressed
        time.sleep(INTERVAL_MS / 1000)
        assert wire.push(client, sub, b"\x05", codec=7) == 76  # UNSUPPORTED_COMPRESSION_TYPE
        time.sleep(INTERVAL_MS / 1000)
        assert wire.push(client, sub, b"\xff\xff\xff\xff") == 87  # INVALID_RECORD
        time.sleep(INTERVAL_MS / 1000)
        assert wire.push(client, sub, compress(ZSTD, gauge_push(7.0)), codec=ZSTD) == 0
        assert wire.push(client, sub, gauge_push(8.0), terminating=True) == 0
        time.sleep(INTERVAL_MS / 1000)
        assert wire.push(client, sub, gauge_push(9.0)) == 42  # after the terminating push
    finally:
        wire.sock.close()
    samples = handler_samples(telemetry_cluster, "kbroker_client_producer_record_queue_time")
    assert [(s.labels["client_id"], s.value) for s in samples
            if s.labels["client_instance_id"] == str(client)] == [("wire", 0.008)]


def handler_samples(cluster: LocalCluster, prefix: str) -> list:
    port = cluster.services["handler-0"].metrics_port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return [s for family in text_string_to_metric_families(text) for s in family.samples
            if s.name.startswith(prefix)]


def test_librdkafka_pushes_its_metrics_and_the_report_shows_them(
        telemetry_cluster: LocalCluster, spark, tmp_path: Path) -> None:
    bootstrap = telemetry_cluster.bootstrap
    topic = f"telemetry-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)],
                        request_timeout=15)[topic].result(timeout=20)
    producer = Producer({"bootstrap.servers": bootstrap, "client.id": "telemetry-producer",
                         "linger.ms": 5, "enable.metrics.push": True})
    consumer = Consumer({"bootstrap.servers": bootstrap, "client.id": "telemetry-consumer",
                         "group.id": f"g-{topic}", "fetch.wait.max.ms": 100})
    consumer.assign([TopicPartition(topic, 0, 0)])
    stop = threading.Event()

    def traffic() -> None:
        while not stop.is_set():
            producer.produce(topic, b"x" * 100)
            producer.poll(0)
            consumer.poll(0.05)
        producer.flush(10)

    worker = threading.Thread(target=traffic, daemon=True)
    worker.start()
    try:
        # Clients push every second once subscribed: wait for both kinds of client.
        deadline = time.monotonic() + 30
        while True:
            pushed = {s.labels["client_id"] for s in handler_samples(
                telemetry_cluster, "kbroker_client_") if "client_id" in s.labels}
            if {"telemetry-producer", "telemetry-consumer"} <= pushed:
                break
            assert time.monotonic() < deadline, f"no pushes from librdkafka: {pushed}"
            time.sleep(0.3)
        producer_latency = [s for s in handler_samples(telemetry_cluster, PRODUCER_LATENCY)
                            if s.labels["client_id"] == "telemetry-producer"]
        assert producer_latency and all(s.labels["node_id"] == "0" for s in producer_latency)
        assert all(0 < s.value < 10 for s in producer_latency)  # seconds, not milliseconds
        # The latency report's client table, from the data source (the whole report runs in
        # test_report.py; here only what telemetry adds).
        raw = (spark.read.format("kbroker_metrics")
               .option("endpoints", ",".join(cluster_endpoints(telemetry_cluster)))
               .option("prefixes", "kbroker_client_,kbroker_handler_client_").load())
        rows = [r.asDict() for r in client_latency(raw).collect()]
    finally:
        stop.set()
        worker.join(15)
        consumer.close()
    clients = {(r["metric"], r["client_id"]): r for r in rows}
    produced = clients[("producer_node_request_latency_avg_seconds", "telemetry-producer")]
    assert produced["node_id"] == "0" and 0 < produced["latency_seconds"] < 10
    assert ("consumer_fetch_manager_fetch_latency_avg_seconds", "telemetry-consumer") in clients
    assert all(r["latency_seconds"] >= 0 for r in rows)
    write_chart([], tmp_path / "latency.png", rows)
    assert (tmp_path / "latency.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The handler counted the pushes as requests answered without error.
    answered = handler_samples(telemetry_cluster, "kbroker_handler_requests_total")
    assert any(s.labels["api"] == "PushTelemetry" and s.labels["error_code"] == "0"
               and s.value > 0 for s in answered)
