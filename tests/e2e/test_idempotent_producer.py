"""Idempotent producers through connections that break: a TCP proxy in front of every broker
port cuts connections mid-request and drops responses (so batches the log stored are sent
again), and a log node is killed (SIGKILL) and restarted mid-stream; every record must still be
stored exactly once, in order per partition.

The cluster is a dedicated one whose frontend advertises the proxy's ports, so clients reach
every broker through the proxy after bootstrap too.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import time
from collections.abc import Iterator

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaConnectionError
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from kafka import KafkaProducer
from kafka.errors import KafkaError as KafkaPythonError

from services.local_cluster import ClusterSpec, LocalCluster, free_port_range

from .test_confluent_kafka import create_topic

PARTITIONS = 3
LOG_NODES = 3


class CuttingProxy:
    """Forwards ``listen port + i`` to ``target port + i`` on loopback (i < ``count``) and
    breaks connections on purpose while ``cutting`` is on: each connection forwards a random
    number of client bytes (at most ``max_client_bytes``), so a request is cut off in the
    middle, and every ``drop_every``-th response chunk is dropped (a fixed rate, so that every
    run drops some whatever the timing), the connection then reset, so a request the broker
    handled goes unanswered. Runs its own event loop in a thread; :meth:`close` stops it."""

    def __init__(self, target_port: int, count: int, *, seed: int,
                 max_client_bytes: int = 30_000, drop_every: int = 12) -> None:
        self.target_port = target_port
        self.count = count
        self.max_client_bytes = max_client_bytes
        self.drop_every = drop_every
        self._response_chunks = 0
        self.cutting = True
        self.connections = 0
        self.cut_requests = 0
        self.dropped_responses = 0
        self._random = random.Random(seed)
        self._loop = asyncio.new_event_loop()
        self._servers: list[asyncio.Server] = []
        self._thread = threading.Thread(target=self._loop.run_forever, name="cutting-proxy",
                                        daemon=True)
        self.port = free_port_range("127.0.0.1", count)

    def start(self) -> CuttingProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(timeout=10)
        return self

    async def _listen(self) -> None:
        for i in range(self.count):
            server = await asyncio.start_server(
                lambda r, w, i=i: self._serve(r, w, self.target_port + i),
                "127.0.0.1", self.port + i)
            self._servers.append(server)

    async def _serve(self, client_reader: asyncio.StreamReader,
                     client_writer: asyncio.StreamWriter, target: int) -> None:
        self.connections += 1
        try:
            broker_reader, broker_writer = await asyncio.open_connection("127.0.0.1", target)
        except OSError:
            client_writer.transport.abort()
            return
        budget = self._random.randint(1, self.max_client_bytes)

        def reset() -> None:
            client_writer.transport.abort()
            broker_writer.transport.abort()

        async def requests() -> None:
            nonlocal budget
            while data := await client_reader.read(65536):
                if self.cutting and len(data) >= budget:
                    broker_writer.write(data[:budget])  # half a request reaches the broker
                    await broker_writer.drain()
                    self.cut_requests += 1
                    reset()
                    return
                budget -= len(data) if self.cutting else 0
                broker_writer.write(data)
                await broker_writer.drain()
            broker_writer.close()

        async def responses() -> None:
            while data := await broker_reader.read(65536):
                self._response_chunks += 1
                if self.cutting and self._response_chunks % self.drop_every == 0:
                    self.dropped_responses += 1
                    reset()
                    return
                client_writer.write(data)
                await client_writer.drain()
            client_writer.close()

        pipes = [asyncio.ensure_future(requests()), asyncio.ensure_future(responses())]
        try:
            await asyncio.gather(*pipes)
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            for pipe in pipes:
                pipe.cancel()
            await asyncio.gather(*pipes, return_exceptions=True)
            reset()

    def close(self) -> None:
        async def shut() -> None:
            for server in self._servers:
                server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(shut(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()


@pytest.fixture(scope="module")
def proxied_cluster(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[LocalCluster, CuttingProxy]]:
    """A cluster of its own whose brokers are advertised at the proxy's ports."""
    kafka_port = free_port_range("127.0.0.1", LOG_NODES)
    proxy = CuttingProxy(kafka_port, LOG_NODES, seed=20240607)
    data_dir = tmp_path_factory.mktemp("proxied-cluster")
    spec = ClusterSpec(data_dir=data_dir, kafka_port=kafka_port, base_port=0,
                       advertised_port=proxy.port, handlers=2, log_nodes=LOG_NODES,
                       num_partitions=PARTITIONS)
    cluster = LocalCluster(spec)
    proxy.start()
    try:
        cluster.start()
        try:
            yield cluster, proxy
        finally:
            cluster.stop()
    finally:
        proxy.close()


@pytest.fixture()
def proxy(proxied_cluster: tuple[LocalCluster, CuttingProxy]) -> Iterator[CuttingProxy]:
    """The proxy, cutting, with its counters reset; the test's topic is created without
    cuts."""
    _, proxy = proxied_cluster
    proxy.cut_requests = proxy.dropped_responses = 0
    proxy.cutting = True
    yield proxy
    proxy.cutting = False


def _create_topic(cluster: LocalCluster, proxy: CuttingProxy, topic: str) -> None:
    proxy.cutting = False
    try:
        create_topic(cluster.bootstrap, topic)
    finally:
        proxy.cutting = True


def _check_stored(proxy: CuttingProxy, topic: str, total: int,
                  delivered: dict[int, int]) -> None:
    """Every record id 0..total-1 stored exactly once, in order per partition, at the offset
    its delivery report gave; and the proxy really broke requests and responses."""
    assert len(delivered) == total
    assert proxy.cut_requests >= 3 and proxy.dropped_responses >= 3, (
        proxy.cut_requests, proxy.dropped_responses)
    proxy.cutting = False
    ids = _consume(f"127.0.0.1:{proxy.port}", topic, total)
    for partition, stored in ids.items():
        assert stored == list(range(partition, total, PARTITIONS)), (
            f"partition {partition}: {len(stored)} records, "
            f"{len(stored) - len(set(stored))} duplicates")
        assert [delivered[i] for i in stored] == list(range(len(stored)))


def _value(i: int) -> bytes:
    return f"record-{i:06d}-".encode() + b"x" * (i % 200)


def _id_of(value: bytes) -> int:
    return int(value.split(b"-")[1])


def _consume(bootstrap: str, topic: str, expected: int) -> dict[int, list[int]]:
    """Record ids per partition, in offset order, read with a manual assignment."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{topic}",
                         "enable.auto.commit": False, "enable.partition.eof": True})
    ids: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        eof: set[int] = set()
        deadline = time.monotonic() + 60
        while (sum(map(len, ids.values())) < expected or len(eof) < PARTITIONS) and (
            time.monotonic() < deadline
        ):
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    eof.add(msg.partition())
                    continue
                raise KafkaException(msg.error())
            eof.discard(msg.partition())
            ids[msg.partition()].append(_id_of(msg.value()))
    finally:
        consumer.close()
    return ids


def test_confluent_idempotent_producer_stores_no_duplicates_through_cuts_and_a_restart(
    proxied_cluster: tuple[LocalCluster, CuttingProxy], proxy: CuttingProxy, topic_name: str,
) -> None:
    cluster, _ = proxied_cluster
    _create_topic(cluster, proxy, topic_name)
    total = 3000
    producer = Producer({
        "bootstrap.servers": f"127.0.0.1:{proxy.port}",
        "enable.idempotence": True,
        "acks": "all",
        "max.in.flight.requests.per.connection": 5,
        "linger.ms": 2,
        "batch.num.messages": 25,
        "message.timeout.ms": 120_000,
        "retry.backoff.ms": 50,
        "reconnect.backoff.ms": 10,
        "reconnect.backoff.max.ms": 200,
    })
    delivered: dict[int, int] = {}
    failures: list[str] = []

    def on_delivery(err, msg) -> None:
        if err is not None:
            failures.append(str(err))
        else:
            delivered[_id_of(msg.value())] = msg.offset()

    restarted = False
    outstanding_at_restart = 0
    deadline = time.monotonic() + 150

    def restart_midway() -> None:
        nonlocal restarted, outstanding_at_restart
        if not restarted and len(delivered) >= total // 3:
            outstanding_at_restart = total - len(delivered)
            # Mid-stream: a log node (leading one partition) dies at once and comes back.
            cluster.kill("log-1")
            time.sleep(0.5)
            cluster.start_service("log-1")
            restarted = True

    for i in range(total):
        producer.produce(topic_name, value=_value(i), partition=i % PARTITIONS,
                         on_delivery=on_delivery)
        producer.poll(0)
        if i % 50 == 49:
            producer.flush(0.05)
        restart_midway()
        assert time.monotonic() < deadline, "producing took too long"
    while not restarted and len(delivered) < total:
        producer.poll(0.05)
        restart_midway()
        assert time.monotonic() < deadline, "producing took too long"
    remaining = producer.flush(max(1.0, deadline - time.monotonic()))
    del producer  # closes its connections before the cluster stops
    assert remaining == 0, f"{remaining} records undelivered"
    assert failures == [] and restarted
    print(f"outstanding at restart {outstanding_at_restart}, cut requests {proxy.cut_requests}, "
          f"dropped responses {proxy.dropped_responses}")
    assert outstanding_at_restart >= total // 2
    _check_stored(proxy, topic_name, total, delivered)


def test_aiokafka_idempotent_producer_stores_no_duplicates_through_cuts(
    proxied_cluster: tuple[LocalCluster, CuttingProxy], proxy: CuttingProxy, topic_name: str,
) -> None:
    cluster, _ = proxied_cluster
    _create_topic(cluster, proxy, topic_name)
    total = 1500

    async def produce() -> dict[int, int]:
        producer = AIOKafkaProducer(
            bootstrap_servers=f"127.0.0.1:{proxy.port}", enable_idempotence=True, acks="all",
            linger_ms=2, max_batch_size=2048, request_timeout_ms=10_000,
            retry_backoff_ms=50, metadata_max_age_ms=5_000)
        # The first connections may be cut too.
        for _ in range(50):
            try:
                await producer.start()
                break
            except KafkaConnectionError:
                await asyncio.sleep(0.1)
        else:
            raise AssertionError("aiokafka could not start through the proxy")
        try:
            futures = [await producer.send(topic_name, value=_value(i), partition=i % PARTITIONS)
                       for i in range(total)]
            results = await asyncio.wait_for(asyncio.gather(*futures), 120)
        finally:
            await producer.stop()
        return {i: r.offset for i, r in enumerate(results)}

    _check_stored(proxy, topic_name, total, asyncio.run(produce()))


def test_kafka_python_idempotent_producer_stores_no_duplicates_through_cuts(
    proxied_cluster: tuple[LocalCluster, CuttingProxy], proxy: CuttingProxy, topic_name: str,
) -> None:
    cluster, _ = proxied_cluster
    _create_topic(cluster, proxy, topic_name)
    total = 1500
    producer = None
    for _ in range(50):  # the first connections may be cut too
        try:
            producer = KafkaProducer(
                bootstrap_servers=f"127.0.0.1:{proxy.port}", enable_idempotence=True,
                acks="all", linger_ms=2, batch_size=2048, request_timeout_ms=10_000,
                retry_backoff_ms=50, reconnect_backoff_ms=10, reconnect_backoff_max_ms=200)
            break
        except KafkaPythonError:
            time.sleep(0.1)
    assert producer is not None, "kafka-python could not start through the proxy"
    try:
        futures = [producer.send(topic_name, value=_value(i), partition=i % PARTITIONS)
                   for i in range(total)]
        producer.flush(120)
        delivered = {i: f.get(timeout=10).offset for i, f in enumerate(futures)}
    finally:
        producer.close(timeout=10)
    _check_stored(proxy, topic_name, total, delivered)
