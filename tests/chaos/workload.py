"""The chaos workload: idempotent acks=all producers and a consumer group (confluent-kafka),
each client in a thread of its own, recording into one :class:`tests.chaos.checker.History`.

Each producer numbers its records (one sequence over all partitions; key and value
``<producer>:<sequence>``) and sends them round-robin over the topic's partitions at a steady
rate, keeping at most ``in_flight_per_partition`` unacknowledged records per partition: a
partition that stalls (its leader gone) does not hold back the others, so each partition's
acknowledgements show its own pause. The consumers subscribe as one group and record every
record they are shown. :func:`read_everything` reads every partition from the start at the end
(a verifying reader outside the group).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer, TopicPartition

from tests.chaos.checker import Acked, ClientSpan, History, Read

PRODUCER_CONFIG = {
    "acks": "all", "enable.idempotence": True, "linger.ms": 5,
    # Long enough that no fault makes a record fail: the application should never see one.
    # request.timeout.ms stays at the client's default (30 s): a produce request that times
    # out has an unknown outcome, and librdkafka then bumps the producer epoch and sends its
    # records again under new sequence numbers, which no broker can recognise as duplicates.
    "message.timeout.ms": 300_000, "retry.backoff.ms": 100,
    "retry.backoff.max.ms": 1000, "topic.metadata.refresh.interval.ms": 5000,
    "reconnect.backoff.max.ms": 1000,
}
CONSUMER_CONFIG = {
    "auto.offset.reset": "earliest", "enable.auto.commit": True,
    "auto.commit.interval.ms": 1000, "session.timeout.ms": 10_000,
    "heartbeat.interval.ms": 1000, "fetch.wait.max.ms": 200,
    "topic.metadata.refresh.interval.ms": 5000, "reconnect.backoff.max.ms": 1000,
}


def parse(value: bytes) -> tuple[str, int]:
    producer, sequence = value.decode().rsplit(":", 1)
    return producer, int(sequence)


class Workload:
    """``producers`` producers at ``rate`` records/s each and ``consumers`` consumers in group
    ``group`` on ``topic`` (``partitions`` partitions)."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, *, producers: int = 2,
                 consumers: int = 2, rate: float = 150.0, in_flight_per_partition: int = 40,
                 group: str | None = None, log: Callable[[str], None] = print,
                 client_logs: Path | None = None) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.partitions = partitions
        self.rate = rate
        self.in_flight_per_partition = in_flight_per_partition
        self.group = group or f"chaos-{topic}"
        self.log = log
        self.client_logs = client_logs
        self.history = History()
        self.lock = threading.Lock()
        self.errors: list[str] = []
        self.unflushed = 0
        self._stop_producing = threading.Event()
        self._stop_consuming = threading.Event()
        self._producers = [threading.Thread(target=self._produce, args=(f"p{i}",),
                                            name=f"chaos-p{i}", daemon=True)
                           for i in range(producers)]
        self._consumer_names = [f"c{i}" for i in range(consumers)]
        self._consumers = [threading.Thread(target=self._consume, args=(name,),
                                            name=f"chaos-{name}", daemon=True)
                           for name in self._consumer_names]

    def start(self) -> None:
        for thread in self._producers + self._consumers:
            thread.start()

    def _client_logging(self, name: str, debug: str) -> dict[str, object]:
        """librdkafka's own log of client ``name`` (``debug`` contexts), into
        ``client_logs/<name>.log``: what a stuck client was doing."""
        if self.client_logs is None:
            return {}
        self.client_logs.mkdir(parents=True, exist_ok=True)
        logger = logging.getLogger(f"chaos.{self.topic}.{name}")
        logger.propagate = False
        logger.setLevel(logging.DEBUG)
        handler = logging.FileHandler(self.client_logs / f"{name}.log")
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        logger.addHandler(handler)
        return {"logger": logger, "debug": debug}

    def client_log(self, name: str, lines: int = 60) -> str:
        """The last ``lines`` lines of client ``name``'s librdkafka log."""
        if self.client_logs is None or not (self.client_logs / f"{name}.log").exists():
            return ""
        return "\n".join((self.client_logs / f"{name}.log").read_text(
            errors="replace").splitlines()[-lines:])

    def _span(self, name: str) -> ClientSpan:
        with self.lock:
            span = ClientSpan(name=name, start=time.monotonic())
            self.history.clients[name] = span
            return span

    # -- producing ----------------------------------------------------------------------------

    def _produce(self, name: str) -> None:
        # The eos context: every producer id, epoch and sequence change, which says why a
        # record was stored twice.
        producer = Producer({"bootstrap.servers": self.bootstrap, "client.id": name,
                             **PRODUCER_CONFIG, **self._client_logging(name, "eos")})
        span = self._span(name)
        in_flight = [0] * self.partitions
        history = self.history

        def delivered(err, msg) -> None:
            now = time.monotonic()
            in_flight[msg.partition()] -= 1
            if err is not None:
                with self.lock:
                    history.failed.append(f"{name} {msg.partition()} {msg.value()!r}: {err}")
                return
            _, sequence = parse(msg.value())
            with self.lock:
                history.acked.append(Acked(producer=name, sequence=sequence, topic=self.topic,
                                           partition=msg.partition(), offset=msg.offset(),
                                           at=now))
                span.progress.append(now)

        sequence = 0
        partition = 0
        interval = 1.0 / self.rate
        next_send = time.monotonic()
        try:
            while not self._stop_producing.is_set():
                producer.poll(max(0.0, min(0.05, next_send - time.monotonic())))
                if time.monotonic() < next_send:
                    continue
                next_send += interval
                # The next partition with room (all full: skip this slot).
                for _ in range(self.partitions):
                    partition = (partition + 1) % self.partitions
                    if in_flight[partition] < self.in_flight_per_partition:
                        break
                else:
                    continue
                value = f"{name}:{sequence}".encode()
                try:
                    producer.produce(self.topic, key=value, value=value, partition=partition,
                                     on_delivery=delivered)
                except (BufferError, KafkaException) as exc:
                    with self.lock:
                        self.errors.append(f"{name} produce: {exc}")
                    continue
                in_flight[partition] += 1
                sequence += 1
        finally:
            span.end = time.monotonic()
            remaining = producer.flush(120)
            with self.lock:
                self.unflushed += remaining

    # -- consuming ----------------------------------------------------------------------------

    def _consume(self, name: str) -> None:
        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": self.group,
                             "client.id": name, **CONSUMER_CONFIG,
                             **self._client_logging(name, "cgrp,topic,fetch")})
        span = self._span(name)
        try:
            consumer.subscribe([self.topic])
            while not self._stop_consuming.is_set():
                msg = consumer.poll(0.2)
                if msg is None:
                    continue
                if msg.error():
                    with self.lock:
                        self.errors.append(f"{name}: {msg.error()}")
                    continue
                self._record(name, msg, group=True, span=span)
        finally:
            consumer.close()
            for handler in logging.getLogger(f"chaos.{self.topic}.{name}").handlers:
                handler.close()

    def _record(self, name: str, msg, *, group: bool, span: ClientSpan | None) -> None:
        now = time.monotonic()
        producer, sequence = parse(msg.value())
        with self.lock:
            self.history.reads.append(Read(consumer=name, producer=producer, sequence=sequence,
                                           topic=msg.topic(), partition=msg.partition(),
                                           offset=msg.offset(), at=now, group=group))
            if span is not None:
                span.progress.append(now)

    # -- ending ---------------------------------------------------------------------------------

    def acked_count(self) -> int:
        with self.lock:
            return len(self.history.acked)

    def acked_after(self, since: float) -> set[int]:
        """The partitions with an acknowledgement after ``since``."""
        with self.lock:
            return {a.partition for a in reversed(self.history.acked) if a.at > since}

    def idle_since(self, since: float) -> list[str]:
        """The running clients (producers and consumers) without progress after ``since``."""
        with self.lock:
            return sorted(name for name, span in self.history.clients.items()
                          if span.end is None and not (span.progress and span.progress[-1] > since))

    def unread_by_group(self) -> int:
        with self.lock:
            read = {r.record for r in self.history.reads if r.group}
            return sum(1 for a in self.history.acked if a.record not in read)

    def stop_producers(self) -> None:
        """Stop producing; every producer flushes what it has in flight (bounded)."""
        self._stop_producing.set()
        for thread in self._producers:
            thread.join(timeout=150)
        # From here on the consumers may run dry: they are expected to progress until now.
        stopped = time.monotonic()
        with self.lock:
            for name in self._consumer_names:
                if name in self.history.clients:
                    self.history.clients[name].end = stopped

    def drain(self, timeout: float) -> bool:
        """Wait until the group read every acknowledged record (False: not within
        ``timeout``)."""
        deadline = time.monotonic() + timeout
        while self.unread_by_group():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)
        return True

    def stop_consumers(self) -> None:
        self._stop_consuming.set()
        for thread in self._consumers:
            thread.join(timeout=30)

    def stop(self) -> None:
        """Stop every client (teardown; idempotent)."""
        self._stop_producing.set()
        self._stop_consuming.set()
        for thread in self._producers + self._consumers:
            if thread.is_alive():
                thread.join(timeout=150)

    def read_everything(self, timeout: float = 60.0) -> None:
        """Read every partition from the start up to its high watermark, outside the group,
        into the history."""
        reader = Consumer({"bootstrap.servers": self.bootstrap, "group.id": f"{self.group}-check",
                           "enable.auto.commit": False, "fetch.wait.max.ms": 100})
        try:
            ends = {p: reader.get_watermark_offsets(TopicPartition(self.topic, p), timeout=15)[1]
                    for p in range(self.partitions)}
            reader.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING)
                           for p in range(self.partitions)])
            position = dict.fromkeys(range(self.partitions), 0)
            deadline = time.monotonic() + timeout
            while any(position[p] < ends[p] for p in ends):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the verifying read stopped at {position}, ends {ends}")
                msg = reader.poll(0.5)
                if msg is None or msg.error():
                    continue
                position[msg.partition()] = msg.offset() + 1
                self._record("verifier", msg, group=False, span=None)
        finally:
            reader.close()
        with self.lock:
            self.history.end = time.monotonic()
