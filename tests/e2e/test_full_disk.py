"""A log node whose disk fills up, end to end, as Kafka handles a failed log directory: 3 log
nodes, RF=3, min.insync.replicas=2; log node 2's data folder is a small tmpfs.

An idempotent acks=all producer (confluent-kafka) sends numbered records of 4 KiB to 3
partitions until node 2's disk is full, or (second case) down to its free-space floor. Its log
dir fails (health: LogService NOT_SERVING;
metrics: one offline log dir, its replicas offline); the replicator moves the partitions it
led to in-sync followers and drops it from every ISR; production goes on through the new
leaders. No acknowledged record is lost: each is in the final log at the offset it was
acknowledged with. Restarted with more space, node 2 rejoins every ISR.

The ack pause (the longest wait for an acknowledgement after the log dir failed, for each
partition node 2 led: until the new leader acknowledged) is printed for the record. Bounded:
every wait has a deadline; the test tears the cluster down and unmounts the tmpfs whatever
happens.
"""

from __future__ import annotations

import datetime
import os
import re
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field

import grpc
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.local_cluster import ClusterSpec, LocalCluster

from .test_replication_faults import all_in_sync, create_topic, topic_metadata, wait_until

PARTITIONS = 3
FULL_NODE = 2
DISK = "6m"
BIGGER_DISK = "64m"
RECORD = 4096
FLOOR = 2 * 1024 * 1024
LOG_SERVICE = "kbroker.log.v1.LogService"


def _mount(path: os.PathLike[str], *options: str) -> None:
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join(options), "tmpfs", str(path)],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, f"cannot mount a tmpfs (tests run as root): {done.stderr}"


@pytest.fixture(params=[0, FLOOR], ids=["disk full", "free-space floor"])
def small_disk_cluster(request: pytest.FixtureRequest,
                       tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """The cluster, its log node 2 on the small tmpfs, with or without a free-space floor."""
    data_dir = tmp_path_factory.mktemp("full-disk")
    disk = data_dir / f"log-{FULL_NODE}"
    disk.mkdir()
    _mount(disk, f"size={DISK}")
    spec = ClusterSpec(
        data_dir=data_dir, kafka_port=0, base_port=0, handlers=1, log_nodes=3,
        num_partitions=PARTITIONS, default_replication_factor=3, replica_lag_time_max_ms=1500,
        log_level=os.environ.get("KBROKER_TEST_LOG_LEVEL", "INFO"),
        service_flags={"log": {"log_dir_min_free_bytes": request.param}},
    )
    try:
        cluster = LocalCluster(spec)
        try:
            cluster.start()
            yield cluster
        finally:
            cluster.stop()
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True, timeout=30)
        assert not os.path.ismount(disk), f"{disk} is still mounted"


def log_service_status(cluster: LocalCluster, node: int) -> int | None:
    try:
        with grpc.insecure_channel(cluster.services[f"log-{node}"].grpc_address) as channel:
            return int(health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=LOG_SERVICE), timeout=2).status)
    except grpc.RpcError:
        return None


def metric(cluster: LocalCluster, node: int, name: str) -> float | None:
    port = cluster.services[f"log-{node}"].metrics_port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    found = re.search(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else None


@dataclass
class Producing:
    """Sends numbered 4 KiB records round-robin over the partitions until stopped; records
    every acknowledgement: (wall-clock time, partition, offset, sequence)."""

    bootstrap: str
    topic: str
    acks: list[tuple[float, int, int, int]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    unflushed: int = 0

    def run(self) -> None:
        producer = Producer({
            "bootstrap.servers": self.bootstrap, "acks": "all", "enable.idempotence": True,
            "linger.ms": 5, "message.timeout.ms": 60_000, "request.timeout.ms": 10_000,
            "retry.backoff.ms": 50, "topic.metadata.refresh.interval.ms": 1000,
        })
        padding = os.urandom(RECORD)

        def delivered(err, msg) -> None:
            if err is not None:
                self.errors.append(f"{msg.partition()}: {err}")
                return
            sequence = int(msg.value()[:12])
            self.acks.append((time.time(), msg.partition(), msg.offset(), sequence))

        sequence = 0
        while not self.stop.is_set():
            producer.produce(self.topic, value=b"%012d" % sequence + padding,
                             partition=sequence % PARTITIONS, on_delivery=delivered)
            sequence += 1
            producer.poll(0.001)
            while len(producer) > 200 and not self.stop.is_set():
                producer.poll(0.05)
        self.unflushed = producer.flush(90)


def final_log(bootstrap: str, topic: str, ends: dict[int, int]) -> dict[tuple[int, int], int]:
    """(partition, offset) -> sequence of every record below ``ends`` (per partition), read
    from the start."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"final-{topic}",
                         "enable.auto.commit": False})
    stored: dict[tuple[int, int], int] = {}
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        deadline = time.monotonic() + 60
        read = dict.fromkeys(range(PARTITIONS), 0)
        while any(read[p] < ends.get(p, 0) for p in read):
            assert time.monotonic() < deadline, f"the final read stopped at {read} of {ends}"
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            stored[(msg.partition(), msg.offset())] = int(msg.value()[:12])
            read[msg.partition()] = msg.offset() + 1
    finally:
        consumer.close()
    return stored


def failure_time(cluster: LocalCluster, node: int) -> float:
    """When the node's log dir failed (wall clock), from its one log line saying so."""
    for line in cluster.services[f"log-{node}"].log_path.read_text().splitlines():
        if "services.log.log_dir_failure" in line and " failed (" in line:
            stamp = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
            return stamp.timestamp()
    raise AssertionError(f"log-{node} did not log its log dir failure")


def ack_pauses(acks: list[tuple[float, int, int, int]], partitions: set[int], failed_at: float
               ) -> dict[int, float]:
    """Per partition: the longest wait for an acknowledgement in the 15 s after the log dir
    failed (from the failure itself on): the stall until the new leader acknowledged (the
    acknowledgements just after the failure may still be of records the old leader stored
    and replicated before)."""
    pauses = {}
    for partition in partitions:
        times = [failed_at] + sorted(t for t, p, _, _ in acks
                                     if p == partition and failed_at < t < failed_at + 15)
        pauses[partition] = max(b - a for a, b in zip(times, times[1:], strict=False))
    return pauses


def test_a_full_disk_moves_leadership_loses_nothing_and_the_node_rejoins_after_restart(
        small_disk_cluster: LocalCluster, topic_name: str) -> None:
    cluster = small_disk_cluster
    create_topic(cluster.bootstrap, topic_name, PARTITIONS)
    wait_until(cluster, lambda: all_in_sync(cluster, topic_name), 20, "a fully replicated topic")
    led = {p.partition for p in topic_metadata(cluster, topic_name) if p.leader == FULL_NODE}
    assert led, "placement gives every node a partition to lead"

    producing = Producing(cluster.bootstrap, topic_name)
    thread = threading.Thread(target=producing.run, name="producer", daemon=True)
    thread.start()
    try:
        # The disk fills: the log dir fails and the node says so.
        deadline = time.monotonic() + 60
        while log_service_status(cluster, FULL_NODE) != health_pb2.HealthCheckResponse.NOT_SERVING:
            assert time.monotonic() < deadline, "node 2's disk did not fill"
            assert thread.is_alive()
            time.sleep(0.02)
        failed_at = time.time()
        acked_before = len(producing.acks)

        def moved() -> bool:
            partitions = topic_metadata(cluster, topic_name)
            return bool(partitions) and all(
                p.leader != FULL_NODE and FULL_NODE not in p.isr for p in partitions)

        wait_until(cluster, moved, 15, "leadership and ISRs without the full node")
        # Production goes on through the new leaders, on every partition.
        wait_until(cluster, lambda: {p for t, p, _, _ in producing.acks if t > failed_at}
                   == set(range(PARTITIONS)) and len(producing.acks) > acked_before + 300, 30,
                   "acknowledgements on every partition after the fault")
    finally:
        producing.stop.set()
        thread.join(120)
    assert not thread.is_alive()
    assert producing.errors == [] and producing.unflushed == 0, producing.errors[:5]

    # Health and metrics of the node with the failed log dir; it is still up.
    assert cluster.services[f"log-{FULL_NODE}"].running
    assert metric(cluster, FULL_NODE, "kbroker_log_offline_log_dirs") == 1
    assert (metric(cluster, FULL_NODE, "kbroker_log_offline_replicas") or 0) >= PARTITIONS
    free = metric(cluster, FULL_NODE, "kbroker_log_dir_free_bytes")
    floor = metric(cluster, FULL_NODE, "kbroker_log_dir_min_free_bytes")
    assert free is not None and floor is not None
    if floor:  # refused at the floor, before the disk was full
        assert floor - 256 * 1024 < free < floor + 256 * 1024, (free, floor)
    else:
        assert free < 256 * 1024
    assert metric(cluster, 0, "kbroker_log_offline_log_dirs") == 0

    # No acknowledged record is lost: each is where it was acknowledged.
    ends: dict[int, int] = {}
    for _, partition, offset, _ in producing.acks:
        ends[partition] = max(ends.get(partition, 0), offset + 1)
    stored = final_log(cluster.bootstrap, topic_name, ends)
    lost = [(p, o, s) for _, p, o, s in producing.acks if stored.get((p, o)) != s]
    assert lost == [], f"{len(lost)} acknowledged records lost, e.g. {lost[:5]}"

    pauses = ack_pauses(producing.acks, led, failure_time(cluster, FULL_NODE))
    print(f"\nack pause per partition node {FULL_NODE} led (s): "
          + ", ".join(f"{p}: {pause:.2f}" for p, pause in sorted(pauses.items())))

    # Restarted with space, the node rejoins every ISR.
    svc = cluster.services[f"log-{FULL_NODE}"]
    assert svc.proc is not None
    svc.proc.send_signal(signal.SIGTERM)
    svc.proc.wait(timeout=30)
    remount = subprocess.run(["mount", "-o", f"remount,size={BIGGER_DISK}",
                              str(cluster.data_dir / f"log-{FULL_NODE}")],
                             capture_output=True, text=True, timeout=30)
    assert remount.returncode == 0, remount.stderr
    cluster.start_service(f"log-{FULL_NODE}")
    assert log_service_status(cluster, FULL_NODE) == health_pb2.HealthCheckResponse.SERVING
    wait_until(cluster, lambda: all_in_sync(cluster, topic_name), 60,
               "the restarted node back in every ISR")
    assert metric(cluster, FULL_NODE, "kbroker_log_offline_log_dirs") == 0
