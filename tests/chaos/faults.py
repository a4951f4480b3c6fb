"""The fault injector: faults of one kind at a time on one service of a running, supervised
local cluster (:meth:`services.local_cluster.LocalCluster.supervise`), each injected, held for
a bounded time and healed, with the supervisor driven meanwhile.

Kinds:

- ``kill``: SIGKILL; the supervisor restarts the service after its backoff.
- ``pause``: SIGSTOP, then SIGCONT after ``pause_seconds`` (a process that hangs: a long GC,
  a stalled disk, a throttled container).
- ``restart``: SIGTERM, a graceful stop; the supervisor starts it again.
- ``full-disk`` (log nodes): the node's disk filled for ``full_disk_seconds``, then freed and
  the node restarted gracefully, as Kafka brings a failed log directory back (see
  :mod:`tests.chaos.disks`).
- ``partition``: nothing moves on the service's inbound gRPC streams for
  ``partition_seconds`` (packets dropped), then traffic flows again;
- ``disconnect``: the service's inbound gRPC streams are reset, and new ones refused, for
  ``partition_seconds`` (see :mod:`tests.chaos.links` for both).

A fault is healed when the service is running and answers its health check again. The
injector also counts the exits each fault may cause (one per kill, restart and full disk), so
that restarts beyond them are crashes (:meth:`FaultInjector.unexpected_restarts`).

Call it from the thread that started the cluster: restarted services die with the thread
that started them (parent-death signal).
"""

from __future__ import annotations

import dataclasses
import signal
import time
from collections import Counter
from collections.abc import Callable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.local_cluster import LocalCluster
from tests.chaos.checker import Fault
from tests.chaos.disks import FullDisks
from tests.chaos.links import Links

ROLES = ("frontend", "handler", "log", "purgatory", "replicator")
KINDS = ("kill", "pause", "restart", "full-disk", "partition", "disconnect")
# Kinds after which the target has exited once and been restarted by the supervisor.
_EXITING = ("kill", "restart", "full-disk")


class FaultNotHealedError(AssertionError):
    """A fault did not heal within its bound."""


@dataclasses.dataclass(slots=True, kw_only=True)
class FaultSettings:
    pause_seconds: float = 2.0
    partition_seconds: float = 3.0
    full_disk_seconds: float = 3.0
    # How long a service may take to be healthy again after its fault.
    heal_timeout: float = 60.0
    # How long a graceful stop may take before the service is killed.
    stop_timeout: float = 15.0


class FaultInjector:
    def __init__(self, cluster: LocalCluster, settings: FaultSettings, *,
                 links: Links | None = None, disks: FullDisks | None = None,
                 log: Callable[[str], None] = print) -> None:
        if cluster.supervisor is None:
            raise ValueError("the cluster must be supervised (LocalCluster.supervise())")
        self.cluster = cluster
        self.settings = settings
        self.links = links
        self.disks = disks
        self.log = log
        self.faults: list[Fault] = []
        self.expected_restarts: Counter[str] = Counter()
        self._stopped: set[str] = set()

    def targets(self, kind: str) -> list[str]:
        """The services a fault of ``kind`` can hit."""
        names = list(self.cluster.services)
        if kind == "full-disk":
            return [n for n in names if self.disks is not None and n in self.disks.folders]
        if kind in ("partition", "disconnect"):
            return [n for n in names if self.links is not None and n in self.links.links]
        return names

    # -- driving the supervisor ------------------------------------------------------------

    def supervise(self) -> None:
        for line in self.cluster.supervise_step():
            self.log(f"supervisor: {line}")

    def hold(self, seconds: float) -> None:
        """Wait ``seconds`` while supervising."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            self.supervise()
            time.sleep(min(0.1, left))

    def healthy(self, name: str) -> bool:
        svc = self.cluster.services[name]
        if not svc.running:
            return False
        try:
            with self.cluster.health_channel(name) as channel:
                reply = health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(), timeout=1.0)
        except grpc.RpcError:
            return False
        return reply.status == health_pb2.HealthCheckResponse.SERVING

    def wait_healthy(self, name: str, fault: str) -> None:
        deadline = time.monotonic() + self.settings.heal_timeout
        while not self.healthy(name):
            if time.monotonic() > deadline:
                raise FaultNotHealedError(f"{fault}: {name} not healthy again within "
                                   f"{self.settings.heal_timeout}s\n{self.cluster.tail(name)}")
            self.hold(0.1)

    # -- faults -----------------------------------------------------------------------------

    def inject(self, kind: str, target: str) -> Fault:
        """Inject ``kind`` on ``target``, hold it, heal it and wait until ``target`` is
        healthy; return the fault with its times."""
        if target not in self.targets(kind):
            raise ValueError(f"{kind} cannot hit {target}")
        fault = Fault(kind=kind, target=target, start=time.monotonic())
        self.faults.append(fault)
        restarts_before = self.cluster.restarts(target)
        self.log(f"fault: {fault.label}")
        getattr(self, "_" + kind.replace("-", "_"))(target, fault.label)
        self.wait_healthy(target, fault.label)
        fault.end = time.monotonic()
        if kind in _EXITING:
            # A full disk may make the node stop on its own: each exit during it is the fault's.
            self.expected_restarts[target] += max(1, self.cluster.restarts(target)
                                                  - restarts_before)
        self.log(f"healed: {fault.label} after {fault.end - fault.start:.2f}s")
        return fault

    def _kill(self, target: str, _label: str) -> None:
        self.cluster.kill(target)

    def _pause(self, target: str, _label: str) -> None:
        proc = self.cluster.services[target].proc
        assert proc is not None
        proc.send_signal(signal.SIGSTOP)
        self._stopped.add(target)
        try:
            self.hold(self.settings.pause_seconds)
        finally:
            proc.send_signal(signal.SIGCONT)
            self._stopped.discard(target)

    def _restart(self, target: str, label: str) -> None:
        if not self.cluster.stop_service(target, self.settings.stop_timeout):
            self.log(f"{label}: no graceful stop within {self.settings.stop_timeout}s; killed")
        self.supervise()

    def _full_disk(self, target: str, label: str) -> None:
        assert self.disks is not None
        taken = self.disks.fill(target)
        self.log(f"{label}: {taken} bytes taken, disk full")
        try:
            self.hold(self.settings.full_disk_seconds)
        finally:
            self.disks.free(target)
        svc = self.cluster.services[target]
        if svc.running:
            self._restart(target, label)
        self.wait_healthy(target, label)

    def _partition(self, target: str, _label: str, cut: str = "blackhole") -> None:
        assert self.links is not None
        link = self.links[target]
        link.cut(cut)
        try:
            self.hold(self.settings.partition_seconds)
        finally:
            link.restore()

    def _disconnect(self, target: str, label: str) -> None:
        self._partition(target, label, cut="reset")

    # -- accounting and teardown ------------------------------------------------------------

    def unexpected_restarts(self) -> dict[str, int]:
        """Restarts by the supervisor beyond those the injected faults explain: crashes."""
        return {name: extra for name in self.cluster.services
                if (extra := self.cluster.restarts(name) - self.expected_restarts[name]) > 0}

    def not_running(self) -> list[str]:
        return [name for name, svc in self.cluster.services.items() if not svc.running]

    def release(self) -> None:
        """Undo what is still in effect (teardown): continue stopped processes, restore
        links, free disks."""
        for name in list(self._stopped):
            proc = self.cluster.services[name].proc
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
        self._stopped.clear()
        if self.links is not None:
            self.links.restore_all()
        if self.disks is not None:
            for name in list(self.disks.full):
                self.disks.free(name)
