"""A chaos run: a supervised local cluster with proxies in front of its internal gRPC ports
and a tmpfs per log node, a topic (RF=3, min.insync.replicas=2), the workload, and the
injector; after each fault it waits until the cluster has settled (every replica back in its
ISR, every partition acknowledging again) before the next one. Shared by tests/chaos and
bench/chaos.py.

Use it as a context manager from the thread that runs the test (the supervisor restarts
services from it): leaving it continues stopped processes, restores links, stops the clients
and every service, closes the proxies and unmounts the disks, whatever happened.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

import grpc
from confluent_kafka.admin import AdminClient, NewTopic

from kbroker.replicator.v1 import replicator_pb2, replicator_pb2_grpc
from services.local_cluster import ClusterSpec, LocalCluster
from services.supervision import Backoff
from tests.chaos.checker import Fault, Report, check
from tests.chaos.disks import FullDisks
from tests.chaos.faults import FaultInjector, FaultSettings
from tests.chaos.links import Links
from tests.chaos.workload import Workload


@dataclasses.dataclass(slots=True, kw_only=True)
class ChaosSettings:
    partitions: int = 6
    producers: int = 2
    consumers: int = 2
    rate: float = 150.0  # records/s per producer
    log_nodes: int = 3
    handlers: int = 2
    # Services with a proxy in front (partitions): names, or "*" for every internal service.
    links: tuple[str, ...] = ("*",)
    # A tmpfs of this many MiB over each log node's data folder (0: no full-disk faults).
    disk_mb: int = 0
    stuck_after: float = 30.0
    # How long the cluster may take to settle after a fault.
    settle_timeout: float = 60.0
    faults: FaultSettings = dataclasses.field(default_factory=FaultSettings)
    backoff: Backoff = dataclasses.field(
        default_factory=lambda: Backoff(initial=0.5, cap=5.0, reset_after=20.0))
    replica_lag_time_max_ms: int = 3000
    log_level: str = "INFO"


class ChaosRun:
    def __init__(self, data_dir: Path, settings: ChaosSettings,
                 log: Callable[[str], None] = print) -> None:
        self.settings = settings
        self.log = log
        spec = ClusterSpec(
            data_dir=data_dir, kafka_port=0, base_port=0, handlers=settings.handlers,
            log_nodes=settings.log_nodes, num_partitions=1, default_replication_factor=3,
            replica_lag_time_max_ms=settings.replica_lag_time_max_ms,
            group_initial_rebalance_delay_ms=500, group_min_session_timeout_ms=3000,
            log_level=settings.log_level)
        self.cluster = LocalCluster(spec)
        self.topic = f"chaos-{uuid.uuid4().hex[:8]}"
        self.links: Links | None = None
        self.disks: FullDisks | None = None
        self.injector: FaultInjector | None = None
        self.workload: Workload | None = None

    # -- life cycle -------------------------------------------------------------------------

    def __enter__(self) -> ChaosRun:
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _start(self) -> None:
        settings, cluster = self.settings, self.cluster
        internal = [n for n in cluster.services if n != "frontend"]
        names = internal if "*" in settings.links else [n for n in settings.links if n]
        if names:
            self.links = Links(cluster, names)
        if settings.disk_mb:
            self.disks = FullDisks({name: cluster.data_dir / name for name in cluster.services
                                    if name.startswith("log-")}, settings.disk_mb)
            self.disks.mount()
        started = time.monotonic()
        cluster.start(timeout=180)
        cluster.supervise(settings.backoff)
        self.log(f"cluster up in {time.monotonic() - started:.1f}s at {cluster.bootstrap}")
        self.injector = FaultInjector(cluster, settings.faults, links=self.links,
                                      disks=self.disks, log=self.log)
        self._create_topic()
        self.workload = Workload(cluster.bootstrap, self.topic, settings.partitions,
                                 producers=settings.producers, consumers=settings.consumers,
                                 rate=settings.rate, log=self.log,
                                 client_logs=self.cluster.data_dir / "clients")
        self.workload.start()
        self.settle(since=time.monotonic(), what="the workload's start")

    def _create_topic(self) -> None:
        admin = AdminClient({"bootstrap.servers": self.cluster.bootstrap})
        futures = admin.create_topics([NewTopic(
            self.topic, num_partitions=self.settings.partitions, replication_factor=3,
            config={"min.insync.replicas": "2"})], request_timeout=30)
        futures[self.topic].result(timeout=60)

    def close(self) -> None:
        if self.injector is not None:
            self.injector.release()
        if self.workload is not None:
            self.workload.stop()
        self.cluster.stop()
        if self.links is not None:
            self.links.close()
        if self.disks is not None:
            self.disks.unmount()

    # -- faults -------------------------------------------------------------------------------

    def inject(self, kind: str, target: str) -> Fault:
        """Inject one fault and wait until the cluster has settled after it."""
        assert self.injector is not None
        fault = self.injector.inject(kind, target)
        self.settle(since=fault.end or time.monotonic(), what=fault.label)
        return fault

    def in_sync(self) -> bool:
        """Whether every partition of every topic (the internal ones too: an operator waits
        for no under-replicated partition in the whole cluster) has a leader and its whole
        replica set in the ISR."""
        try:
            with self.cluster.health_channel("replicator") as channel:
                metadata = replicator_pb2_grpc.ReplicatorStub(channel).GetMetadata(
                    replicator_pb2.GetMetadataRequest(), timeout=2)
        except grpc.RpcError:
            return False
        if self.topic not in {t.name for t in metadata.topics}:
            return False
        return all(sorted(p.isr) == sorted(p.replicas) and p.leader >= 0
                   for t in metadata.topics for p in t.partitions)

    def settle(self, since: float, what: str) -> None:
        """Wait until every replica is in sync, every partition was acknowledged after
        ``since`` and every client (the group's consumers too) progressed after it; raise with
        the service logs when not within the settle timeout. The next fault starts from a
        cluster in full work, and a client's pause is never the sum of two faults' (nor of the
        group's first rebalance and a fault)."""
        assert self.injector is not None and self.workload is not None
        deadline = time.monotonic() + self.settings.settle_timeout
        partitions = set(range(self.settings.partitions))
        while True:
            acked = self.workload.acked_after(since)
            idle = self.workload.idle_since(since)
            synced = self.in_sync()
            if synced and acked >= partitions and not idle:
                return
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"after {what}: not settled within {self.settings.settle_timeout}s "
                    f"(in sync: {synced}; partitions acknowledged since: {sorted(acked)}; "
                    f"clients without progress since: {idle})\n{self.logs()}")
            self.injector.hold(0.2)

    def logs(self, lines: int = 15) -> str:
        return "\n".join(f"--- {name} ---\n{self.cluster.tail(name, lines)}"
                         for name in self.cluster.services)

    # -- the end ---------------------------------------------------------------------------

    def finish(self, drain_timeout: float = 60.0) -> Report:
        """Stop producing, let the group read everything, read every partition once more from
        the start, and check the history."""
        assert self.workload is not None and self.injector is not None
        workload = self.workload
        workload.stop_producers()
        deadline = time.monotonic() + drain_timeout
        while workload.unread_by_group() and time.monotonic() < deadline:
            self.injector.hold(0.2)
        workload.stop_consumers()
        workload.read_everything()
        workload.history.faults = list(self.injector.faults)
        return check(workload.history, stuck_after=self.settings.stuck_after)
