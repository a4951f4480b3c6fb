"""Log compaction seen by real clients against a real local cluster: a consumer reading a
compacted topic from the start ends up seeing only the latest value of each key (at its
original offset) plus what is still in the active segment; tombstones are seen, then vanish
after delete.retention.ms; a record without a key is refused with INVALID_RECORD.

The cluster's log nodes run the cleaner every 300 ms (see tests/conftest.py). Segments roll by
segment.ms, and only on appends, so the tests keep producing a filler key while they wait: the
records under test then leave the active segment and become cleanable."""

from __future__ import annotations

import time
import uuid

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KafkaTopicPartition

TIMEOUT = 60
FILLER = b"filler"
Record = tuple[int, bytes | None, bytes | None]


def create_topic(bootstrap: str, name: str, **configs: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    settings = {"cleanup.policy": "compact", "segment.ms": "100",
                "min.cleanable.dirty.ratio": "0.01", **configs}
    futures = admin.create_topics([NewTopic(name, num_partitions=1, replication_factor=1,
                                            config=settings)], request_timeout=15)
    futures[name].result(timeout=20)


def read_from_start(bootstrap: str, topic: str) -> list[Record]:
    """Everything a fresh consumer reads from the beginning up to the high watermark."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"r-{uuid.uuid4().hex}",
                         "enable.auto.commit": False, "enable.partition.eof": True,
                         "fetch.wait.max.ms": 50})
    records: list[Record] = []
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    return records
                raise AssertionError(str(msg.error()))
            records.append((msg.offset(), msg.key(), msg.value()))
    finally:
        consumer.close()
    raise AssertionError(f"did not reach the end of {topic} in time")


class KeyedProducer:
    """A confluent-kafka producer that remembers the offset of every delivered record."""

    def __init__(self, bootstrap: str, topic: str, **config: object) -> None:
        self.topic = topic
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5,
                                  "retries": 0, **config})
        self.delivered: list[Record] = []
        self.errors: list[KafkaError] = []

    def send(self, key: bytes | None, value: bytes | None) -> None:
        def on_delivery(err, msg) -> None:  # type: ignore[no-untyped-def]
            if err is not None:
                self.errors.append(err)
            else:
                self.delivered.append((msg.offset(), msg.key(), msg.value()))

        self.producer.produce(self.topic, key=key, value=value, on_delivery=on_delivery)

    def flush(self) -> None:
        assert self.producer.flush(30) == 0


def latest(records: list[Record]) -> dict[bytes | None, Record]:
    out = {}
    for record in records:
        out[record[1]] = record
    return out


def wait_for(producer: KeyedProducer, bootstrap: str, done, what: str) -> list[Record]:  # type: ignore[no-untyped-def]
    """Keep the segments rolling (a filler record every round) and read the topic from the
    start until ``done(records)``."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        producer.send(FILLER, b"x")
        producer.flush()
        records = read_from_start(bootstrap, producer.topic)
        if done(records):
            return records
        assert time.monotonic() < deadline, f"{what}; last read: {records}"
        time.sleep(0.2)


def test_a_consumer_from_the_start_sees_the_latest_value_per_key(cluster, topic_name):
    create_topic(cluster.bootstrap, topic_name)
    producer = KeyedProducer(cluster.bootstrap, topic_name, **{"compression.type": "lz4"})
    keys = [b"k%d" % i for i in range(5)]
    for round_ in range(8):
        for i in range(6):
            for key in keys:
                producer.send(key, b"%s-%d-%d" % (key, round_, i))
        producer.flush()
        time.sleep(0.12)  # past segment.ms: the next append rolls a segment
    assert producer.errors == []
    final = latest(producer.delivered)
    expected = sorted(final[key] for key in keys)
    assert len(producer.delivered) == 8 * 6 * 5

    records = wait_for(
        producer, cluster.bootstrap,
        lambda got: [r for r in got if r[1] != FILLER] == expected,
        "the topic never compacted down to one record per key")
    # Offsets never change: the survivors are where the producer was told they went.
    assert [r for r in records if r[1] != FILLER] == expected
    fillers = [r for r in records if r[1] == FILLER]
    assert fillers and fillers[-1] == latest(producer.delivered)[FILLER]
    assert len(records) < len(producer.delivered) // 4


def test_tombstones_are_seen_then_removed_after_delete_retention(cluster, topic_name):
    create_topic(cluster.bootstrap, topic_name, **{"delete.retention.ms": "6000"})
    producer = KeyedProducer(cluster.bootstrap, topic_name)
    for i in range(5):
        producer.send(b"gone", b"v%d" % i)
        producer.send(b"kept", b"v%d" % i)
    producer.flush()
    producer.send(b"gone", None)
    producer.flush()
    time.sleep(0.12)
    tombstone = latest(producer.delivered)[b"gone"]
    assert tombstone[2] is None

    def only_the_tombstone(records: list[Record]) -> bool:
        return [r for r in records if r[1] == b"gone"] == [tombstone] and [
            r for r in records if r[1] == b"kept"] == [latest(producer.delivered)[b"kept"]]

    seen_at = time.monotonic()
    wait_for(producer, cluster.bootstrap, only_the_tombstone,
             "the tombstone was never the only record of its key")
    records = wait_for(producer, cluster.bootstrap,
                       lambda got: all(r[1] != b"gone" for r in got),
                       "the tombstone was never removed")
    # Kept for delete.retention.ms after the pass that first kept it.
    assert time.monotonic() - seen_at > 5.0
    assert latest(records)[b"kept"] == latest(producer.delivered)[b"kept"]
    assert producer.errors == []


def test_a_record_without_a_key_is_refused_with_invalid_record(cluster, topic_name):
    create_topic(cluster.bootstrap, topic_name)
    producer = KeyedProducer(cluster.bootstrap, topic_name)
    producer.send(None, b"no key")
    producer.flush()
    assert [err.code() for err in producer.errors] == [KafkaError.INVALID_RECORD]
    producer.errors.clear()
    producer.send(b"key", b"with a key")
    producer.flush()
    assert producer.errors == [] and len(producer.delivered) == 1
    assert read_from_start(cluster.bootstrap, topic_name) == producer.delivered


def test_keyless_records_in_a_batch_fail_exactly_with_their_own_error(cluster, topic_name):
    """KIP-467: the batch is refused whole, the answer names the keyless records by index, and
    librdkafka fails those with INVALID_RECORD, the others with its 'part of a batch with
    invalid records' error. Nothing is stored."""
    create_topic(cluster.bootstrap, topic_name)
    # One batch for the five records: a linger that no stall of this process between two
    # produce calls comes near (with 500 ms, a stall of 0.7 s after the first call sends that
    # record alone, and it is stored); flush sends at once, whatever the linger.
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "linger.ms": 60_000,
                         "enable.idempotence": False, "retries": 0})
    reports: list[tuple[bytes, KafkaError | None]] = []
    keys = [b"a", None, b"c", None, b"e"]
    for i, key in enumerate(keys):
        producer.produce(topic_name, key=key, value=b"v%d" % i, partition=0,
                         on_delivery=lambda err, msg: reports.append((msg.value(), err)))
    assert producer.flush(TIMEOUT) == 0
    assert sorted(value for value, _ in reports) == [b"v%d" % i for i in range(5)]
    by_value = dict(reports)
    for i, key in enumerate(keys):
        error = by_value[b"v%d" % i]
        assert error is not None, f"record {i} was stored"
        if key is None:
            assert error.code() == KafkaError.INVALID_RECORD
        else:
            assert error.code() == KafkaError._INVALID_DIFFERENT_RECORD, error
    assert read_from_start(cluster.bootstrap, topic_name) == []


def test_kafka_python_with_gzip_sees_compaction(cluster, topic_name):
    create_topic(cluster.bootstrap, topic_name)
    producer = KafkaProducer(bootstrap_servers=cluster.bootstrap, compression_type="gzip",
                             linger_ms=5, acks=1)
    offsets: dict[bytes, int] = {}
    try:
        for round_ in range(6):
            futures = [(key, producer.send(topic_name, key=key, value=b"%s-%d" % (key, round_)))
                       for key in (b"a", b"b", b"c") for _ in range(10)]
            producer.flush(30)
            for key, future in futures:
                offsets[key] = future.get(timeout=10).offset
            time.sleep(0.12)
        deadline = time.monotonic() + TIMEOUT
        while True:
            producer.send(topic_name, key=FILLER, value=b"x").get(timeout=10)
            got = _kafka_python_read(cluster.bootstrap, topic_name)
            keyed = [(offset, key, value) for offset, key, value in got if key != FILLER]
            if keyed == [(offsets[k], k, b"%s-5" % k) for k in sorted(offsets,
                                                                      key=offsets.get)]:
                break
            assert time.monotonic() < deadline, got
            time.sleep(0.2)
    finally:
        producer.close(timeout=10)


def _kafka_python_read(bootstrap: str, topic: str) -> list[Record]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                             auto_offset_reset="earliest", fetch_max_wait_ms=50)
    partition = KafkaTopicPartition(topic, 0)
    try:
        consumer.assign([partition])
        consumer.seek_to_beginning(partition)
        end = consumer.end_offsets([partition])[partition]
        got: list[Record] = []
        deadline = time.monotonic() + 20
        while consumer.position(partition) < end:
            assert time.monotonic() < deadline
            for records in consumer.poll(timeout_ms=500).values():
                got.extend((r.offset, r.key, r.value) for r in records)
        return got
    finally:
        consumer.close()
