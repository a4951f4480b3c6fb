"""Replication under faults, end to end, on a cluster of its own (5 log nodes, RF=3,
min.insync.replicas=2, replica.lag.time.max.ms shortened, the default node session timeout).
Five log nodes, so that with two of a partition's replicas stopped a majority of the nodes
holding the cluster metadata log is still up, and the controller can shrink the ISR.

An idempotent acks=all producer (confluent-kafka) sends numbered records to 6 partitions
without pause while a consumer reads them; meanwhile the log node leading some partitions is
killed with SIGKILL, later restarted on the same data until it is back in every ISR, and the
replicator is killed with SIGKILL once and restarted. At the end every acknowledged record is
in the log exactly once, at the offset it was acknowledged with, in send order per partition,
and nothing the consumer saw differs from the final log at that offset (no consumer ever read
a record that was later taken back). Then: with one replica left in the ISR, acks=all writes
fail with NOT_ENOUGH_REPLICAS and none of them is ever stored. Last: the replicator is killed
with SIGKILL under acks=all load and restarted by the launcher's supervision; acknowledgements
never pause for more than 2 s (followers fetch from their leaders and leaders commit without
it) and none is lost.

Bounded: every wait has a deadline, and the whole module stays well within 90 s on two busy
cores. A failure message carries the tails of the service logs.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import grpc
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from kbroker.log.v1 import log_pb2, log_pb2_grpc
from kbroker.replicator.v1 import replicator_pb2, replicator_pb2_grpc
from services.local_cluster import ClusterSpec, LocalCluster

from .test_replication import replica_bytes

LAG_MS = 1500
PARTITIONS = 6
LOG_NODES = 5
# Acknowledged records to wait for between two faults (each fault must not stop the flow).
PROGRESS = 150


@pytest.fixture(scope="module")
def faulty(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    spec = ClusterSpec(
        data_dir=tmp_path_factory.mktemp("faults"), kafka_port=0, base_port=0, handlers=1,
        log_nodes=LOG_NODES, num_partitions=PARTITIONS, default_replication_factor=3,
        replica_lag_time_max_ms=LAG_MS,
        log_level=os.environ.get("KBROKER_TEST_LOG_LEVEL", "INFO"),
    )
    cluster = LocalCluster(spec)
    cluster.start()
    try:
        yield cluster
    finally:
        for svc in cluster.services.values():
            if svc.proc is not None and svc.proc.poll() is None:
                svc.proc.send_signal(signal.SIGCONT)  # a failed test may leave one stopped
        cluster.stop()


def logs_of(cluster: LocalCluster, lines: int = 25) -> str:
    return "\n".join(f"--- {name} ---\n{cluster.tail(name, lines)}" for name in cluster.services)


def wait_until(cluster: LocalCluster, condition: Callable[[], bool], within: float,
               message: str) -> None:
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{message}: not reached within {within}s\n{logs_of(cluster)}")
        time.sleep(0.1)


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=3,
                  config={"min.insync.replicas": "2"})], request_timeout=15)
    futures[name].result(timeout=20)


def topic_metadata(cluster: LocalCluster, topic: str) -> list[replicator_pb2.PartitionMetadata]:
    """The partitions as the replicator has them (empty while it does not answer)."""
    try:
        with grpc.insecure_channel(cluster.services["replicator"].grpc_address) as channel:
            stub = replicator_pb2_grpc.ReplicatorStub(channel)
            metadata = stub.GetMetadata(replicator_pb2.GetMetadataRequest(topics=[topic]),
                                        timeout=5)
    except grpc.RpcError:
        return []
    return list(metadata.topics[0].partitions) if metadata.topics else []


def all_in_sync(cluster: LocalCluster, topic: str) -> bool:
    partitions = topic_metadata(cluster, topic)
    return bool(partitions) and all(sorted(p.isr) == sorted(p.replicas) for p in partitions)


def handler_isr(bootstrap: str, topic: str, partition: int) -> list[int]:
    """The ISR as the handlers' metadata (what clients are told) has it."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    metadata = admin.list_topics(topic, timeout=10)
    return sorted(metadata.topics[topic].partitions[partition].isrs)


def partition_epoch(cluster: LocalCluster, node: int, topic: str, partition: int) -> int:
    """The partition epoch of one log node's replica state (the metadata version of the ISR
    it has)."""
    with grpc.insecure_channel(cluster.services[f"log-{node}"].grpc_address) as channel:
        stub = log_pb2_grpc.LogServiceStub(channel)
        described = stub.DescribePartitions(log_pb2.DescribePartitionsRequest(partitions=[
            log_pb2.TopicPartition(topic=topic, partition=partition)]), timeout=5)
    return described.partitions[0].partition_epoch


def log_ends(cluster: LocalCluster, node: int, topic: str) -> dict[int, int]:
    """Each partition's log end offset on one log node."""
    with grpc.insecure_channel(cluster.services[f"log-{node}"].grpc_address) as channel:
        stub = log_pb2_grpc.LogServiceStub(channel)
        described = stub.DescribePartitions(log_pb2.DescribePartitionsRequest(partitions=[
            log_pb2.TopicPartition(topic=topic, partition=p) for p in range(PARTITIONS)]),
            timeout=5)
    return {d.partition: d.log_end_offset for d in described.partitions}


def acks_1_producer(bootstrap: str, topic: str, partitions: list[int]) -> Producer:
    """An acks=1 producer that has written once to each of ``partitions`` (its metadata known
    and its connections to their leader open), so that its next writes take milliseconds."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "1", "linger.ms": 0,
                         "retries": 0, "message.timeout.ms": 10_000})
    for partition in partitions:
        producer.produce(topic, value=f"warm-up:{partition}".encode(), partition=partition)
    assert producer.flush(20) == 0
    return producer


def write_acks_1(producer: Producer, topic: str, partitions: list[int], count: int = 5
                 ) -> list[bytes]:
    """``count`` acks=1 writes to each of ``partitions``, one produce request each."""
    values, failures = [], []
    for i in range(count):
        for partition in partitions:
            value = f"uncommitted:{partition}:{i}".encode()
            values.append(value)
            producer.produce(topic, value=value, partition=partition,
                             on_delivery=lambda err, _m: err and failures.append(err))
        assert producer.flush(10) == 0
    assert failures == [], failures
    return values


def value_of(partition: int, sequence: int) -> bytes:
    return f"{partition}:{sequence}".encode()


@dataclass
class ProducerLoop:
    """Sends numbered records round-robin over the partitions until stopped, and records what
    was acknowledged: per partition, (sequence, offset) in delivery order. The offset is None
    for a record librdkafka acknowledged without one, as it does now and then after faults that
    close connections (the chaos checker counts these as ``without_offset``): such a record
    must still be in the log, once."""

    bootstrap: str
    topic: str
    acked: dict[int, list[tuple[int, int]]] = field(
        default_factory=lambda: {p: [] for p in range(PARTITIONS)})
    # When each acknowledgement arrived (time.monotonic()), in arrival order.
    ack_times: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    sent: int = 0
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    unflushed: int = 0

    @property
    def acknowledged(self) -> int:
        with self.lock:
            return sum(len(v) for v in self.acked.values())

    def run(self) -> None:
        producer = Producer({
            "bootstrap.servers": self.bootstrap, "acks": "all", "enable.idempotence": True,
            "linger.ms": 5, "message.timeout.ms": 60_000, "request.timeout.ms": 10_000,
            "retry.backoff.ms": 50, "topic.metadata.refresh.interval.ms": 1000,
        })
        sequences = [0] * PARTITIONS

        def delivered(err, msg) -> None:
            if err is not None:
                self.errors.append(f"{msg.partition()}:{msg.value()!r}: {err}")
                return
            partition, sequence = (int(v) for v in msg.value().decode().split(":"))
            with self.lock:
                self.acked[partition].append((sequence, msg.offset()))
                self.ack_times.append(time.monotonic())

        n = 0
        while not self.stop.is_set():
            partition = n % PARTITIONS
            sequence = sequences[partition]
            sequences[partition] += 1
            producer.produce(self.topic, key=f"{partition}-{sequence}".encode(),
                             value=value_of(partition, sequence), partition=partition,
                             on_delivery=delivered)
            n += 1
            self.sent = n
            # Keep a bounded number in flight, at a pace two busy cores can follow.
            producer.poll(0.002)
            while len(producer) > 300 and not self.stop.is_set():
                producer.poll(0.05)
        self.unflushed = producer.flush(90)


@dataclass
class ConsumerLoop:
    """Reads every partition from the start, continuously, recording every
    (partition, offset, value) it is shown."""

    bootstrap: str
    topic: str
    seen: list[tuple[int, int, bytes]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": f"live-{self.topic}",
                             "enable.auto.commit": False, "fetch.wait.max.ms": 100,
                             "topic.metadata.refresh.interval.ms": 1000})
        try:
            consumer.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING)
                             for p in range(PARTITIONS)])
            while not self.stop.is_set():
                msg = consumer.poll(0.2)
                if msg is None:
                    continue
                if msg.error():
                    self.errors.append(str(msg.error()))
                    continue
                self.seen.append((msg.partition(), msg.offset(), msg.value()))
        finally:
            consumer.close()


def final_log(bootstrap: str, topic: str, ends: dict[int, int]) -> dict[int, dict[int, bytes]]:
    """Every partition read from the start up to ``ends``: offset -> value."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"final-{topic}",
                         "enable.auto.commit": False})
    logs: dict[int, dict[int, bytes]] = {p: {} for p in range(PARTITIONS)}
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        deadline = time.monotonic() + 30
        while any(max(logs[p], default=-1) + 1 < ends[p] for p in logs):
            assert time.monotonic() < deadline, "the final read did not reach the ends"
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            assert msg.offset() not in logs[msg.partition()], "an offset was read twice"
            logs[msg.partition()][msg.offset()] = msg.value()
    finally:
        consumer.close()
    return logs


def high_watermarks(bootstrap: str, topic: str) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"hw-{topic}"})
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in range(PARTITIONS)}
    finally:
        consumer.close()


def test_kills_of_a_leader_log_node_and_the_replicator_lose_no_acknowledged_record(
        faulty, topic_name):
    create_topic(faulty.bootstrap, topic_name, PARTITIONS)
    wait_until(faulty, lambda: all_in_sync(faulty, topic_name), 20, "a fully replicated topic")
    producing = ProducerLoop(faulty.bootstrap, topic_name)
    consuming = ConsumerLoop(faulty.bootstrap, topic_name)
    threads = [threading.Thread(target=producing.run, name="producer", daemon=True),
               threading.Thread(target=consuming.run, name="consumer", daemon=True)]
    for thread in threads:
        thread.start()
    started = time.monotonic()

    def progress(within: float, step: str) -> None:
        target = producing.acknowledged + PROGRESS
        wait_until(faulty, lambda: producing.acknowledged >= target, within,
                   f"{PROGRESS} more acknowledged records {step} (errors: "
                   f"{producing.errors[:3]})")

    try:
        progress(20, "before any fault")
        before = topic_metadata(faulty, topic_name)
        victim = before[0].leader
        led = [p.partition for p in before if p.leader == victim]
        # With every other log node paused nothing is copied, committed or changed in the
        # metadata (no majority of the metadata log), so the victim dies with appends no
        # follower has: the tail its restart must cut off. acks=1 writes make that tail
        # certain (acks=all ones wait, one produce per connection at a time); at most the
        # first of them can reach a follower, through the answer to a fetch parked before the
        # pause. The pause stays well under the replica lag time (the writer is connected
        # beforehand): a longer one would have the victim ask to shrink its ISR to itself, a
        # change the controller commits once the others resume, and then no replica may lead.
        writer = acks_1_producer(faulty.bootstrap, topic_name, led)
        others = [faulty.services[f"log-{n}"].proc for n in range(LOG_NODES) if n != victim]
        for process in others:
            assert process is not None
            process.send_signal(signal.SIGSTOP)
        paused = time.monotonic()
        try:
            before_writes = log_ends(faulty, victim, topic_name)
            uncommitted = write_acks_1(writer, topic_name, led)
            tails = {p: end - before_writes[p]
                     for p, end in log_ends(faulty, victim, topic_name).items() if p in led}
            faulty.kill(f"log-{victim}")
        finally:
            for process in others:
                process.send_signal(signal.SIGCONT)
            paused = time.monotonic() - paused
        print(f"\nthe other log nodes were paused for {paused * 1000:.0f} ms")
        assert all(tail > 1 for tail in tails.values()), f"no un-replicated tail: {tails}"
        wait_until(faulty, lambda: all(p.leader != victim and victim not in p.isr
                                       for p in topic_metadata(faulty, topic_name)), 20,
                   f"new leaders for partitions {led} of killed log node {victim} (the "
                   f"others paused for {paused * 1000:.0f} ms)")
        after = {p.partition: p for p in topic_metadata(faulty, topic_name)}
        for partition in led:
            assert after[partition].leader_epoch == before[partition].leader_epoch + 1
        progress(20, f"after log node {victim} was killed")
        faulty.start_service(f"log-{victim}")
        wait_until(faulty, lambda: all_in_sync(faulty, topic_name), 30,
                   f"log node {victim} back in every ISR")
        progress(20, f"after log node {victim} came back")
        faulty.kill("replicator")
        # Leaders commit without it: acks=all produces keep completing.
        progress(20, "with the replicator killed")
        faulty.start_service("replicator")
        progress(30, "after the replicator restarted")
        assert all_in_sync(faulty, topic_name), topic_metadata(faulty, topic_name)
    finally:
        producing.stop.set()
        threads[0].join(120)
        consuming.stop.set()
        threads[1].join(30)
    elapsed = time.monotonic() - started
    assert not any(t.is_alive() for t in threads), "a client thread did not stop"
    assert producing.unflushed == 0, f"{producing.unflushed} records never delivered"
    assert producing.errors == [], producing.errors[:10]
    acked = producing.acked
    assert sum(len(v) for v in acked.values()) == producing.sent

    ends = high_watermarks(faulty.bootstrap, topic_name)
    logs = final_log(faulty.bootstrap, topic_name, ends)
    for partition in range(PARTITIONS):
        stored = logs[partition]
        values = [stored[o] for o in sorted(stored)]
        assert len(set(values)) == len(values), f"partition {partition}: a record is stored twice"
        sequences = [int(v.decode().split(":")[1]) for v in values if v[:1].isdigit()]
        assert sequences == sorted(sequences), f"partition {partition}: out of send order"
        for sequence, offset in acked[partition]:
            if offset is None:  # see ProducerLoop
                assert value_of(partition, sequence) in values, (
                    f"partition {partition}: acknowledged record {sequence} is not there")
                continue
            assert stored.get(offset) == value_of(partition, sequence), (
                f"partition {partition}: acknowledged record {sequence} at offset {offset} "
                f"is not there (found {stored.get(offset)!r})\n{logs_of(faulty)}")
        assert [s for s, _ in acked[partition]] == sorted(s for s, _ in acked[partition])
    for partition, offset, value in consuming.seen:
        assert logs[partition].get(offset) == value, (
            f"the consumer saw {value!r} at {partition}/{offset}, which the log now has as "
            f"{logs[partition].get(offset)!r}: a record read and later taken back")
    assert len(consuming.seen) > 0
    kept = {v for stored in logs.values() for v in stored.values()}
    assert len(set(uncommitted) - kept) >= len(uncommitted) - len(led), (
        "the uncommitted tail of the killed leader was not cut off")
    # The restarted node holds exactly what the new leaders have: its tail was cut off.
    for meta in topic_metadata(faulty, topic_name):
        leader_copy = replica_bytes(faulty, meta.leader, topic_name, meta.partition)
        for node in meta.replicas:
            assert replica_bytes(faulty, node, topic_name, meta.partition) == leader_copy, (
                f"partition {meta.partition}: log node {node} differs from leader {meta.leader}")
    print(f"\n{producing.sent} records acknowledged in {elapsed:.1f}s through the faults; "
          f"the live consumer saw {len(consuming.seen)}; un-replicated tails {tails}")


def test_with_one_replica_in_sync_acks_all_writes_are_refused_and_never_stored(
        faulty, topic_name):
    create_topic(faulty.bootstrap, topic_name, 1)
    wait_until(faulty, lambda: all_in_sync(faulty, topic_name), 20, "a fully replicated topic")
    producer = Producer({"bootstrap.servers": faulty.bootstrap, "acks": "all", "linger.ms": 5,
                         "retries": 0, "message.timeout.ms": 5000})
    outcomes: dict[bytes, KafkaError | None] = {}

    def send(values: list[bytes]) -> None:
        for value in values:
            producer.produce(topic_name, value=value, partition=0,
                             on_delivery=lambda err, msg: outcomes.__setitem__(msg.value(), err))
        assert producer.flush(30) == 0

    before = [f"before-{i}".encode() for i in range(10)]
    send(before)
    assert [outcomes[v] for v in before] == [None] * len(before)
    [partition] = topic_metadata(faulty, topic_name)
    followers = [n for n in partition.replicas if n != partition.leader]
    processes = [faulty.services[f"log-{n}"].proc for n in followers]
    in_sync_epoch = partition_epoch(faulty, partition.leader, topic_name, 0)
    for process in processes:
        assert process is not None
        process.send_signal(signal.SIGSTOP)
    try:
        # The shrink as the handlers have it, and as the leader (which checks
        # min.insync.replicas) has it.
        wait_until(faulty, lambda: handler_isr(faulty.bootstrap, topic_name, 0) == [
            partition.leader], 20, f"the ISR shrinking to the leader {partition.leader}")
        wait_until(faulty, lambda: partition_epoch(
            faulty, partition.leader, topic_name, 0) > in_sync_epoch, 10,
                   "the leader knowing its shrunk ISR")
        refused = [f"refused-{i}".encode() for i in range(5)]
        send(refused)
        codes = [outcomes[v].code() if outcomes[v] is not None else None for v in refused]
        assert codes == [KafkaError.NOT_ENOUGH_REPLICAS] * len(refused), codes
    finally:
        for process in processes:
            process.send_signal(signal.SIGCONT)
    wait_until(faulty, lambda: all_in_sync(faulty, topic_name), 30, "the followers back in sync")
    after = [f"after-{i}".encode() for i in range(10)]
    send(after)
    assert [outcomes[v] for v in after] == [None] * len(after)
    consumer = Consumer({"bootstrap.servers": faulty.bootstrap, "group.id": f"g-{topic_name}",
                         "enable.auto.commit": False, "enable.partition.eof": True})
    stored: list[bytes] = []
    try:
        consumer.assign([TopicPartition(topic_name, 0, OFFSET_BEGINNING)])
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF and len(stored) >= len(
                        before) + len(after):
                    break
                continue
            stored.append(msg.value())
    finally:
        consumer.close()
    assert stored == before + after


def test_a_write_whose_isr_shrinks_below_the_minimum_while_it_waits_is_not_acknowledged(
        faulty, topic_name):
    """Appended while the ISR was whole, its followers then stop: once the leader is alone in
    its ISR its high watermark passes the write, which is stored but answered
    NOT_ENOUGH_REPLICAS_AFTER_APPEND (min.insync.replicas 2), as Kafka answers it."""
    create_topic(faulty.bootstrap, topic_name, 1)
    wait_until(faulty, lambda: all_in_sync(faulty, topic_name), 20, "a fully replicated topic")
    producer = Producer({"bootstrap.servers": faulty.bootstrap, "acks": "all", "linger.ms": 0,
                         "retries": 0, "message.timeout.ms": 20000,
                         "request.timeout.ms": 20000})
    outcomes: dict[bytes, KafkaError | None] = {}

    def record(err: KafkaError | None, msg) -> None:  # type: ignore[no-untyped-def]
        outcomes[msg.value()] = err

    producer.produce(topic_name, value=b"warm-up", partition=0, on_delivery=record)
    assert producer.flush(30) == 0 and outcomes[b"warm-up"] is None
    [partition] = topic_metadata(faulty, topic_name)
    followers = [n for n in partition.replicas if n != partition.leader]
    processes = [faulty.services[f"log-{n}"].proc for n in followers]
    for process in processes:
        assert process is not None
        process.send_signal(signal.SIGSTOP)
    try:
        producer.produce(topic_name, value=b"stranded", partition=0, on_delivery=record)
        assert producer.flush(30) == 0
        error = outcomes[b"stranded"]
        assert error is not None and error.code() == KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND, (
            error)
        assert handler_isr(faulty.bootstrap, topic_name, 0) == [partition.leader]
    finally:
        for process in processes:
            process.send_signal(signal.SIGCONT)
    # Stored all the same (Kafka keeps it too): the leader's high watermark passed it.
    consumer = Consumer({"bootstrap.servers": faulty.bootstrap, "group.id": f"hw-{topic_name}"})
    try:
        assert consumer.get_watermark_offsets(TopicPartition(topic_name, 0), timeout=10) == (0, 2)
    finally:
        consumer.close()
    wait_until(faulty, lambda: all_in_sync(faulty, topic_name), 30, "the followers back in sync")


# The longest pause of acknowledgements a kill -9 of the replicator may cause.
REPLICATOR_STALL_S = 2.0


def test_a_killed_replicator_stalls_acks_all_for_at_most_two_seconds_and_loses_nothing(
        faulty, topic_name):
    create_topic(faulty.bootstrap, topic_name, PARTITIONS)
    wait_until(faulty, lambda: all_in_sync(faulty, topic_name), 20, "a fully replicated topic")
    producing = ProducerLoop(faulty.bootstrap, topic_name)
    thread = threading.Thread(target=producing.run, name="producer", daemon=True)
    thread.start()
    faulty.supervise()
    try:
        target = PROGRESS
        wait_until(faulty, lambda: producing.acknowledged >= target, 20,
                   "acknowledged records before the kill")
        killed_at = time.monotonic()
        faulty.kill("replicator")
        restarted_at = None
        deadline = killed_at + 30
        while restarted_at is None and time.monotonic() < deadline:
            faulty.supervise_step()
            if faulty.restarts("replicator"):
                faulty.wait_healthy("replicator", timeout=30)
                restarted_at = time.monotonic()
            time.sleep(0.05)
        assert restarted_at is not None, f"the replicator was not restarted\n{logs_of(faulty)}"
        # Acknowledgements go on for two seconds past the restart.
        wait_until(faulty, lambda: producing.ack_times[-1] > restarted_at + 2.0, 20,
                   "acknowledgements after the restart")
    finally:
        faulty.supervisor = None
        producing.stop.set()
        thread.join(120)
    assert not thread.is_alive(), "the producer thread did not stop"
    assert producing.unflushed == 0 and producing.errors == [], producing.errors[:10]
    times = [t for t in producing.ack_times if killed_at - 1.0 <= t <= restarted_at + 2.0]
    stall = max(b - a for a, b in zip([killed_at, *times], [*times, restarted_at + 2.0],
                                      strict=True))
    print(f"\nreplicator killed: down {restarted_at - killed_at:.1f}s (restarted by the "
          f"supervisor), longest pause of acknowledgements {stall * 1000:.0f} ms, "
          f"{len(times)} acknowledged meanwhile")
    assert stall <= REPLICATOR_STALL_S, stall
    ends = high_watermarks(faulty.bootstrap, topic_name)
    logs = final_log(faulty.bootstrap, topic_name, ends)
    for partition in range(PARTITIONS):
        stored = set(logs[partition].values())
        for sequence, offset in producing.acked[partition]:
            if offset is None:  # acknowledged implicitly: no offset to look at
                assert value_of(partition, sequence) in stored, (
                    f"partition {partition}: acknowledged record {sequence} is not there")
                continue
            assert logs[partition].get(offset) == value_of(partition, sequence), (
                f"partition {partition}: acknowledged record {sequence} at offset {offset} "
                f"is not there")
