"""Client quotas observed by real clients against a real cluster: a producer with a small
producer_byte_rate is throttled (librdkafka reports the broker's throttle time in its
statistics) and its throughput stays near the quota while a producer with another client id
runs unslowed beside it; a consumer with a small consumer_byte_rate is throttled
(kafka-python's throttle-time metrics) and reads near its quota while another consumer reads
everything at once.

The quotas are given to a frontend started in this process in front of the shared cluster's
handlers (its `quotas.update` is what the cluster metadata feeds), with three 1 s quota
windows so a new client's burst allowance (the windows but the current one) stays short."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import pytest
from confluent_kafka import KafkaError, Producer
from kafka import KafkaConsumer, TopicPartition

from kbroker.replicator.v1.replicator_pb2 import ClientQuota, QuotaEntityPart
from services.frontend.config import FrontendConfig
from services.frontend.server import FrontendService, start
from services.local_cluster import LocalCluster, free_port_range

from .test_confluent_kafka import create_topic

T = TypeVar("T")
WINDOWS = 3
PRODUCE_QUOTA = 64 * 1024  # bytes per second
FETCH_QUOTA = 128 * 1024
VALUE = b"q" * 1000


class FrontendThread:
    """A frontend on an event loop of its own thread, in front of the cluster's handlers."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        handlers = tuple(svc.grpc_address for name, svc in cluster.services.items()
                         if name.startswith("handler-"))
        brokers = cluster.spec.log_nodes
        config = FrontendConfig(
            listen_port=free_port_range("127.0.0.1", brokers), broker_ports=brokers,
            grpc_address="127.0.0.1:0", handlers=handlers, instance="frontend-quotas",
            quota_window_num=WINDOWS, quota_window_size_seconds=1)
        self.service: FrontendService = self.call(start(config))
        self.bootstrap = f"127.0.0.1:{self.service.kafka_port}"

    def call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(30)

    def set_quotas(self, *quotas: ClientQuota) -> None:
        async def update() -> None:
            self.service.quotas.update(quotas)
        self.call(update())

    def stop(self) -> None:
        try:
            self.call(self.service.stop(0))
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()


@pytest.fixture(scope="module")
def frontend(cluster: LocalCluster) -> Iterator[FrontendThread]:
    thread = FrontendThread(cluster)
    try:
        yield thread
    finally:
        thread.stop()


def client_quota(client_id: str, **values: float) -> ClientQuota:
    return ClientQuota(entity=[QuotaEntityPart(entity_type="client-id", name=client_id)],
                       values=values)


class ProducerRun:
    """A producer sending as fast as it can; counts what was delivered, when."""

    def __init__(self, bootstrap: str, topic: str, client_id: str,
                 settings: dict[str, object] | None = None) -> None:
        self.topic = topic
        self.delivered: list[float] = []
        self.throttle_ms: list[float] = []
        self.errors: list[str] = []
        self.producer: Producer | None = Producer({
            "bootstrap.servers": bootstrap, "client.id": client_id, "acks": 1,
            "linger.ms": 5, "batch.size": 16384, "queue.buffering.max.messages": 200,
            "statistics.interval.ms": 200, "stats_cb": self._stats, **(settings or {})})

    def _stats(self, raw: str) -> None:
        for broker in json.loads(raw).get("brokers", {}).values():
            throttle = broker.get("throttle", {})
            if throttle.get("cnt"):
                self.throttle_ms.append(throttle.get("max", 0))

    def _delivered(self, err: Any, _msg: Any) -> None:
        if err is not None:
            # What was still queued at the end is purged on purpose.
            if err.code() not in (KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT):
                self.errors.append(str(err))
        else:
            self.delivered.append(time.monotonic())

    def run(self, seconds: float, pace: float | None = None) -> None:
        """Produce for ``seconds``, at most ``pace`` value bytes per second if given."""
        started = time.monotonic()
        deadline = started + seconds
        producer = self.producer
        assert producer is not None
        sent = 0
        while (now := time.monotonic()) < deadline:
            if pace is not None and sent * len(VALUE) > (now - started) * pace:
                producer.poll(0.002)
                continue
            try:
                producer.produce(self.topic, VALUE, on_delivery=self._delivered)
                sent += 1
            except BufferError:
                producer.poll(0.05)
            producer.poll(0)
        producer.purge()
        producer.flush(10)
        self.producer = None  # closes it

    def rate(self, start: float, end: float) -> float:
        """Value bytes delivered per second between ``start`` and ``end``."""
        count = sum(1 for t in self.delivered if start <= t < end)
        return count * len(VALUE) / (end - start)


def test_a_producer_over_its_quota_is_throttled_and_others_are_not(frontend, topic_name):
    create_topic(frontend.bootstrap, topic_name, partitions=1)
    frontend.set_quotas(client_quota("throttled-producer", producer_byte_rate=PRODUCE_QUOTA))
    slow = ProducerRun(frontend.bootstrap, topic_name, "throttled-producer")
    fast = ProducerRun(frontend.bootstrap, topic_name, "free-producer")
    started = time.monotonic()
    # The other producer paces itself at 16 times the quota (to spare the shared cluster).
    pace = 16 * PRODUCE_QUOTA
    threads = [threading.Thread(target=slow.run, args=(6.0,)),
               threading.Thread(target=fast.run, args=(6.0, pace))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not slow.errors and not fast.errors
    assert slow.throttle_ms and max(slow.throttle_ms) > 0, "the client saw throttle_time_ms"
    assert not any(fast.throttle_ms), "the other client id was never throttled"
    # Past the first windows' burst allowance, the throttled producer runs at its quota.
    slow_rate = slow.rate(started + 2.5, started + 6.0)
    fast_rate = fast.rate(started + 2.5, started + 6.0)
    assert 0.4 * PRODUCE_QUOTA < slow_rate < 1.3 * PRODUCE_QUOTA, slow_rate
    assert fast_rate > 0.8 * pace, (fast_rate, slow_rate)


def consume(bootstrap: str, topic: str, client_id: str, seconds: float,
            until_bytes: int) -> tuple[int, float, float]:
    """(value bytes read, seconds taken, largest throttle time the client reported)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, client_id=client_id,
                             enable_auto_commit=False, fetch_max_wait_ms=100)
    read = 0
    started = time.monotonic()
    try:
        consumer.assign([TopicPartition(topic, 0)])
        consumer.seek_to_beginning()
        while read < until_bytes and time.monotonic() - started < seconds:
            for records in consumer.poll(timeout_ms=100).values():
                read += sum(len(r.value) for r in records)
        taken = time.monotonic() - started
        throttle = max((float(value) for name, metrics in consumer.metrics().items()
                        for key, value in metrics.items()
                        if key == "throttle-time-max" and not name.startswith("producer")),
                       default=0.0)
    finally:
        consumer.close()
    return read, taken, throttle


def test_a_consumer_over_its_quota_is_throttled_and_others_are_not(frontend, topic_name):
    create_topic(frontend.bootstrap, topic_name, partitions=1)
    total = 1_500_000
    # Small batches: a Fetch returns at least one whole batch, however large.
    producer = Producer({"bootstrap.servers": frontend.bootstrap, "linger.ms": 5,
                         "batch.size": 16384})
    for _ in range(total // len(VALUE)):
        while True:
            try:
                producer.produce(topic_name, VALUE)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(20) == 0
    del producer
    frontend.set_quotas(client_quota("throttled-consumer", consumer_byte_rate=FETCH_QUOTA))

    read, taken, throttle = consume(frontend.bootstrap, topic_name, "free-consumer", 20, total)
    assert read == total and throttle == 0, (read, taken, throttle)
    assert taken < total / FETCH_QUOTA / 2, taken  # far faster than the quota allows

    read, taken, throttle = consume(frontend.bootstrap, topic_name, "throttled-consumer", 5,
                                    total)
    assert throttle > 0, "the client saw throttle_time_ms"
    # At most the burst allowance (the windows but the current one) plus the quota's worth of
    # the time taken; and it made progress.
    allowance = FETCH_QUOTA * (WINDOWS - 1)
    assert 0.5 * FETCH_QUOTA * taken < read <= allowance + FETCH_QUOTA * taken * 1.2, (
        read, taken)
