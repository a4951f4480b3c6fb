"""Long polling against a real cluster: a fetch on an idle partition is answered after its max
wait (not at once, not much later), and a parked fetch is woken by a produce, not by its max
wait. Measured with raw Kafka requests at the frontend (the broker's own answer time) and with
a librdkafka consumer (fetch.wait.max.ms=800). Each is measured three times: the best of them
must be on time (a wake takes a few milliseconds on an idle machine), each of them within
bounds that leave room for two busy cores shared with other clusters. A wake that waits for a
timer tick, or an answer held past the max wait, still fails them."""

from __future__ import annotations

import datetime
import socket
import threading
import time

from confluent_kafka import Consumer, Producer, TopicPartition
from kio.schema.fetch.v12.request import FetchPartition, FetchRequest, FetchTopic
from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData
from kio.static.primitive import i8, i16, i32, i32Timedelta, i64

from tests.handler.batches import record_batch

from .test_confluent_kafka import create_topic
from .wire import encode_request, read_response

MAX_WAIT_MS = 800


def connect(cluster, topic: str | None = None, partition: int = 0) -> socket.socket:
    """A connection to broker 0 or, given a topic, to the broker leading its ``partition``
    (broker N is served on the bootstrap port + N): a Produce is appended only there."""
    host, port = cluster.bootstrap.split(":")
    broker = 0
    if topic is not None:
        from confluent_kafka.admin import AdminClient

        metadata = AdminClient({"bootstrap.servers": cluster.bootstrap}).list_topics(
            topic, timeout=15)
        broker = metadata.topics[topic].partitions[partition].leader
    return socket.create_connection((host, int(port) + broker), timeout=15)


def fetch_request(topic: str, offset: int, max_wait_ms: int) -> FetchRequest:
    return FetchRequest(
        replica_id=i32(-1),
        max_wait=i32Timedelta.parse(datetime.timedelta(milliseconds=max_wait_ms)),
        min_bytes=i32(1), max_bytes=i32(50 * 1024 * 1024), isolation_level=i8(0),
        session_id=i32(0), session_epoch=i32(-1),
        topics=(FetchTopic(topic=topic, partitions=(FetchPartition(
            partition=i32(0), current_leader_epoch=i32(-1), fetch_offset=i64(offset),
            log_start_offset=i64(-1), partition_max_bytes=i32(1024 * 1024)),)),),
        forgotten_topics_data=(), rack_id="",
    )


def produce_request(topic: str, value: bytes) -> ProduceRequest:
    return ProduceRequest(
        transactional_id=None, acks=i16(1),
        timeout=i32Timedelta.parse(datetime.timedelta(seconds=10)),
        topic_data=(TopicProduceData(name=topic, partition_data=(
            PartitionProduceData(index=i32(0), records=record_batch([value])),)),),
    )


def timed_fetch(sock: socket.socket, request: FetchRequest, correlation_id: int
                ) -> tuple[float, float, object]:
    """Send a fetch; (sent at, answered at, response)."""
    sent = time.monotonic()
    sock.sendall(encode_request(request, correlation_id))
    cid, response = read_response(sock, FetchRequest)
    answered = time.monotonic()
    assert cid == correlation_id
    return sent, answered, response


def only_partition(response):
    assert response.error_code == 0, response
    (topic,) = response.responses
    (partition,) = topic.partitions
    return partition


def test_an_idle_fetch_is_answered_after_its_max_wait(cluster, topic_name):
    create_topic(cluster.bootstrap, topic_name, partitions=1)
    with connect(cluster) as sock:
        # The first fetch may pay for metadata and connections; measure the ones after it.
        timed_fetch(sock, fetch_request(topic_name, 0, 0), 1)
        waits = []
        for attempt in range(3):
            sent, answered, response = timed_fetch(
                sock, fetch_request(topic_name, 0, MAX_WAIT_MS), 10 + attempt)
            partition = only_partition(response)
            assert partition.error_code == 0 and not partition.records
            assert partition.high_watermark == 0
            waits.append(answered - sent)
        assert min(waits) >= 0.750 and min(waits) <= 1.100 and max(waits) <= 3.0, waits


def test_a_parked_fetch_is_woken_by_a_produce(cluster, topic_name):
    create_topic(cluster.bootstrap, topic_name, partitions=1)
    with connect(cluster) as fetcher, connect(cluster, topic_name) as producer:
        timed_fetch(fetcher, fetch_request(topic_name, 0, 0), 1)
        wakes = []
        for offset in range(3):
            outcome: dict[str, object] = {}

            def fetch(offset: int, outcome: dict[str, object]) -> None:
                try:
                    outcome["answer"] = timed_fetch(
                        fetcher, fetch_request(topic_name, offset, 10_000), 100 + offset)
                except Exception as exc:  # noqa: BLE001 - reported by the test thread
                    outcome["error"] = exc

            thread = threading.Thread(target=fetch, args=(offset, outcome), daemon=True)
            thread.start()
            # Let the fetch reach the purgatory and park (an idle partition answers in 10 s).
            time.sleep(0.3)
            assert thread.is_alive(), outcome
            producer.sendall(encode_request(produce_request(topic_name, b"wake %d" % offset),
                                            200 + offset))
            _cid, produced = read_response(producer, ProduceRequest)
            acked = time.monotonic()
            (partition_ack,) = produced.responses[0].partition_responses
            assert partition_ack.error_code == 0 and partition_ack.base_offset == offset
            thread.join(5)
            assert not thread.is_alive() and "error" not in outcome, outcome
            _sent, answered, response = outcome["answer"]  # type: ignore[misc]
            partition = only_partition(response)
            assert partition.high_watermark == offset + 1 and partition.records
            wakes.append(answered - acked)
        # Parked for up to 10 s each: answered at once after the produce's acknowledgement.
        assert min(wakes) <= 0.100 and max(wakes) <= 1.0, wakes


def test_a_librdkafka_consumer_long_polls_and_is_woken_by_a_record(cluster, topic_name):
    create_topic(cluster.bootstrap, topic_name, partitions=1)
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": f"g-{topic_name}",
                         "enable.auto.commit": False, "fetch.wait.max.ms": MAX_WAIT_MS,
                         "fetch.error.backoff.ms": 10})
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "linger.ms": 0, "acks": 1})
    try:
        consumer.assign([TopicPartition(topic_name, 0, 0)])
        # Fetching already (its metadata and connection in place): a first record is read.
        producer.produce(topic_name, value=b"warm-up", partition=0)
        assert producer.flush(10) == 0
        deadline = time.monotonic() + 20
        warm = None
        while warm is None and time.monotonic() < deadline:
            warm = consumer.poll(0.5)
        assert warm is not None and not warm.error() and warm.value() == b"warm-up"
        # Idle: the consumer keeps a fetch parked; nothing arrives.
        assert consumer.poll(1.5) is None
        delays = []
        for i in range(5):
            time.sleep(0.1 + 0.15 * i)  # land at different points of the 800 ms wait
            delivered: list[float] = []

            def on_delivery(err, _msg, delivered: list[float] = delivered) -> None:
                if err is None:
                    delivered.append(time.monotonic())

            producer.produce(topic_name, value=b"r%d" % i, partition=0, on_delivery=on_delivery)
            assert producer.flush(10) == 0 and delivered
            msg = consumer.poll(5)
            assert msg is not None and not msg.error(), msg and msg.error()
            assert msg.value() == b"r%d" % i
            delays.append(time.monotonic() - delivered[0])
        # Without wake-ups a record would wait for the end of the 800 ms poll (400 ms on
        # average); woken, it is consumed at once.
        assert sorted(delays)[len(delays) // 2] < 0.25 and max(delays) < 1.0, delays
    finally:
        consumer.close()
