"""Client telemetry (KIP-714) in the handler: subscriptions as Kafka computes them, the checks
of every push in Kafka's order, decompression within the max bytes for every codec, and the
store of pushed OTLP metrics (deltas added up, gauges while fresh, names in base units, the
series bound, client instances forgotten after their expiry), with a clock the test moves."""

from __future__ import annotations

import uuid

import pytest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2 as otlp

from services.common.records.compression import GZIP, LZ4, NONE, SNAPPY, ZSTD, compress
from services.handler.client_metrics import (
    INVALID_RECORD,
    INVALID_REQUEST,
    NONE_CODE,
    TELEMETRY_TOO_LARGE,
    THROTTLING_QUOTA_EXCEEDED,
    UNKNOWN_SUBSCRIPTION_ID,
    UNSUPPORTED_COMPRESSION_TYPE,
    ClientMetricsManager,
    ClientMetricsStore,
    Subscription,
    TelemetryError,
    decompress,
    family_name,
    java_uuid_hash,
)

PRODUCER = "org.apache.kafka.producer."
INTERVAL_MS = 1000


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, ms: float) -> None:
        self.now += ms / 1000


def manager(metrics: str = PRODUCER, max_bytes: int = 4096, max_series: int = 100,
            ) -> tuple[ClientMetricsManager, Clock]:
    clock = Clock()
    subscription = Subscription.from_flags(metrics, INTERVAL_MS, max_bytes)
    return ClientMetricsManager(subscription, ClientMetricsStore(max_series), clock=clock,
                                wall_clock=clock), clock


def metrics_data(latency_ms: float = 12.5, connections: int = 3, node: int = 1,
                 name: str = "org.apache.kafka.producer.node.request.latency.avg") -> bytes:
    """What librdkafka pushes: a gauge per broker (node.id) in ms and a delta sum."""
    data = otlp.MetricsData()
    scope = data.resource_metrics.add().scope_metrics.add()
    gauge = scope.metrics.add(name=name, unit="ms")
    point = gauge.gauge.data_points.add(as_double=latency_ms, time_unix_nano=1)
    point.attributes.append(KeyValue(key="node.id", value=AnyValue(int_value=node)))
    total = scope.metrics.add(name="org.apache.kafka.producer.connection.creation.total",
                              unit="1")
    total.sum.is_monotonic = True
    total.sum.aggregation_temporality = otlp.AGGREGATION_TEMPORALITY_DELTA
    total.sum.data_points.add(as_int=connections, time_unix_nano=1)
    skipped = scope.metrics.add(name="org.apache.kafka.consumer.poll.idle.ratio.avg")
    skipped.gauge.data_points.add(as_double=0.5)
    return data.SerializeToString()


def exposed(m: ClientMetricsManager) -> dict[str, list[tuple[dict[str, str], float]]]:
    return {name: samples for name, _, _, samples in m.families()}


def subscribe(m: ClientMetricsManager) -> tuple[str, int]:
    answer = m.get_subscriptions("")
    assert answer.error_code == NONE_CODE
    return str(answer.client_instance_id), answer.subscription_id


def test_a_new_client_gets_an_id_and_kafkas_subscription() -> None:
    m, clock = manager(f"{PRODUCER}, org.apache.kafka.consumer.")
    answer = m.get_subscriptions("00000000-0000-0000-0000-000000000000")
    assert answer.error_code == NONE_CODE and answer.client_instance_id != uuid.UUID(int=0)
    assert answer.metrics == (PRODUCER, "org.apache.kafka.consumer.")
    assert (answer.push_interval_ms, answer.max_bytes) == (INTERVAL_MS, 4096)
    # Any handler computes the same id: a function of the subscription and the client.
    other, _ = manager(f"org.apache.kafka.consumer.,{PRODUCER}")
    assert other.subscription.subscription_id(answer.client_instance_id) == \
        answer.subscription_id
    assert manager("*")[0].subscription.metrics == ("*",)
    assert manager("")[0].get_subscriptions("").metrics == ()
    # Asking again within the push interval is throttled, after it answered.
    again = m.get_subscriptions(str(answer.client_instance_id))
    assert again.error_code == THROTTLING_QUOTA_EXCEEDED
    clock.advance(INTERVAL_MS)
    assert m.get_subscriptions(str(answer.client_instance_id)).error_code == NONE_CODE
    assert m.get_subscriptions("not-a-uuid").error_code == INVALID_REQUEST


def test_java_uuid_hash_matches_kafkas() -> None:
    # Kafka's Uuid(msb=1, lsb=2).hashCode(): h = 1 ^ 2 = 3, (int)(h ^ (h >>> 32)) = 3.
    assert java_uuid_hash(uuid.UUID(int=(1 << 64) | 2)) == 3
    assert java_uuid_hash(uuid.UUID(int=((2**63) << 64))) == -(2**31)


def test_push_errors_come_in_kafkas_order() -> None:
    m, clock = manager()
    client, sub = subscribe(m)
    payload = metrics_data()
    assert m.push("", sub, False, NONE, payload) == INVALID_REQUEST
    assert m.push(str(uuid.UUID(int=1)), sub, False, NONE, payload) == INVALID_REQUEST
    assert m.push(client, sub + 1, False, NONE, payload) == UNKNOWN_SUBSCRIPTION_ID
    # The failed push counted as the push of this interval: the next one is early.
    assert m.push(client, sub, False, NONE, payload) == THROTTLING_QUOTA_EXCEEDED
    clock.advance(INTERVAL_MS)
    assert m.push(client, sub, False, 9, payload) == UNSUPPORTED_COMPRESSION_TYPE
    clock.advance(INTERVAL_MS)
    assert m.push(client, sub, False, NONE, b"x" * 4097) == TELEMETRY_TOO_LARGE
    clock.advance(INTERVAL_MS)
    assert m.push(client, sub, False, NONE, b"\xff\xff\xff") == INVALID_RECORD
    clock.advance(INTERVAL_MS)
    assert m.push(client, sub, False, NONE, payload) == NONE_CODE
    # A terminating push is taken early; nothing after it is.
    assert m.push(client, sub, True, NONE, payload) == NONE_CODE
    clock.advance(INTERVAL_MS)
    assert m.push(client, sub, False, NONE, payload) == INVALID_REQUEST
    # A client new to this handler (its subscription answered elsewhere) pushes at once.
    stranger = uuid.uuid4()
    fresh, _ = manager()
    assert fresh.push(str(stranger), fresh.subscription.subscription_id(stranger), False,
                      NONE, payload) == NONE_CODE


@pytest.mark.parametrize("codec", [GZIP, SNAPPY, LZ4, ZSTD])
def test_every_codec_decompresses_within_the_limit(codec: int) -> None:
    payload = metrics_data()
    assert decompress(codec, compress(codec, payload), 4096) == payload
    if codec == SNAPPY:
        assert decompress(codec, compress(codec, payload, xerial=True), 4096) == payload
    bomb = compress(codec, b"\x00" * 50_000)
    assert len(bomb) < 4096
    with pytest.raises(TelemetryError) as caught:
        decompress(codec, bomb, 4096)
    assert caught.value.code == TELEMETRY_TOO_LARGE
    with pytest.raises(TelemetryError) as caught:
        decompress(codec, b"\x01\x02garbage" * 10, 4096)
    assert caught.value.code == INVALID_RECORD


def test_pushed_metrics_are_kept_in_base_units_deltas_added_gauges_while_fresh() -> None:
    m, clock = manager()
    client, sub = subscribe(m)
    assert m.push(client, sub, False, ZSTD, compress(ZSTD, metrics_data(12.5, 3)),
                  client_id="app") == NONE_CODE
    clock.advance(INTERVAL_MS)
    assert m.push(client, sub, False, LZ4, compress(LZ4, metrics_data(20.0, 2)),
                  client_id="app") == NONE_CODE
    families = exposed(m)
    latency = "kbroker_client_producer_node_request_latency_avg_seconds"
    assert families[latency] == [({"client_instance_id": client, "client_id": "app",
                                   "node_id": "1"}, 0.02)]
    assert families["kbroker_client_producer_connection_creation"][0][1] == 5
    # Not subscribed: the consumer metric was dropped.
    assert not any("consumer" in name for name in families)
    assert m.store.dropped == {"unsubscribed": 2}
    pushes = dict(families)["kbroker_handler_client_last_push_timestamp_seconds"]
    assert pushes == [({"client_instance_id": client, "client_id": "app"}, clock.now)]
    # 1.5 intervals later the gauge is no longer shown (a newer value may be elsewhere); the
    # counter stays until the client is forgotten, max(60 s, 3 intervals) after its last word.
    clock.advance(1.6 * INTERVAL_MS)
    families = exposed(m)
    assert latency not in families
    assert "kbroker_client_producer_connection_creation" in families
    clock.advance(60_000)
    m.get_subscriptions("")  # any request expires what is due
    assert m.instance_count == 1
    assert "kbroker_client_producer_connection_creation" not in exposed(m)
    assert m.store.series_count == 0


def test_series_beyond_the_bound_are_dropped() -> None:
    m, clock = manager(max_series=3)
    for node in range(3):
        client, sub = subscribe(m)
        assert m.push(client, sub, False, NONE, metrics_data(node=node)) == NONE_CODE
    assert m.store.series_count == 3
    assert m.store.dropped["series_limit"] == 3


def test_names_carry_base_units() -> None:
    assert family_name("org.apache.kafka.consumer.coordinator.rebalance.latency.total", "ms",
                       True) == ("kbroker_client_consumer_coordinator_rebalance_latency_seconds",
                                 1e-3)
    assert family_name("org.apache.kafka.producer.record.queue.time.max", "ms", False)[0] == \
        "kbroker_client_producer_record_queue_time_max_seconds"
    assert family_name("com.example.bytes.sent", "By", True) == (
        "kbroker_client_com_example_bytes_sent_bytes", 1.0)


def test_kafka_client_metrics_without_a_unit_are_milliseconds() -> None:
    # librdkafka and the Java client send no unit: Kafka's latencies and times are in ms.
    assert family_name("org.apache.kafka.producer.node.request.latency.avg", "", False) == (
        "kbroker_client_producer_node_request_latency_avg_seconds", 1e-3)
    assert family_name("org.apache.kafka.consumer.coordinator.rebalance.latency.total", "",
                       True)[0] == "kbroker_client_consumer_coordinator_rebalance_latency_seconds"
    assert family_name("org.apache.kafka.producer.io.wait.time.ns.avg", "", False) == (
        "kbroker_client_producer_io_wait_time_avg_seconds", 1e-9)
    assert family_name("org.apache.kafka.consumer.poll.idle.ratio.avg", "", False) == (
        "kbroker_client_consumer_poll_idle_ratio_avg", 1.0)
    assert family_name("org.apache.kafka.producer.connection.creation.total", "", True)[0] == \
        "kbroker_client_producer_connection_creation"
