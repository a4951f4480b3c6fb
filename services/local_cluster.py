"""A whole cluster as local processes on loopback: log nodes, purgatory, replicator, handlers and
a frontend, each ``python -m services.<svc>`` with its flags, data in one folder.

Used by ``kbroker up`` (``make run``) and by the end-to-end tests, which also kill and restart
single services through it. Start order follows dependencies: log nodes and the purgatory, then
the replicator (it needs the log nodes), then handlers (they need the replicator), then the
frontend; each is awaited until its gRPC health check answers SERVING.

Internal gRPC is plaintext on loopback unless ``ClusterSpec.internal_tls`` names a directory of
TLS material: ``ca.crt`` and, per service kind, ``<kind>.crt`` and ``<kind>.key`` (kinds
frontend, handler, log, purgatory, replicator; each certificate's CN ``kbroker-<kind>``, see
:mod:`services.common.tls`). Every service then runs with mutual TLS, and the launcher's own
health checks present the checked service's certificate, as an exec probe in its pod would.

Supervision is opt-in (:meth:`LocalCluster.supervise`, on in ``kbroker up``): a service that
exits is then restarted with backoff (:mod:`services.supervision`), as Kubernetes restarts a
crashed container. Every service dies with the process that started it, however that process
ends (Linux parent-death signal, set before the service's program starts).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.common.channels import PLAINTEXT, internal_sync_channel
from services.common.config import flag_name
from services.common.runtime import PARENT_PID_ENV
from services.common.tls import SERVICE_KINDS, InternalTls
from services.port_claims import claimed_ports
from services.supervision import Backoff, Supervisor

# Ports picked for local services lie between this and the kernel's ephemeral range.
_FIRST_PRIVATE_PORT = 20000
_random = random.SystemRandom()


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ClusterSpec:
    """What to start and where. Port 0 anywhere means: pick a free port."""

    data_dir: Path = Path("data")
    host: str = "127.0.0.1"
    kafka_port: int = 9092
    advertised_host: str = ""
    advertised_port: int = 0
    handlers: int = 2
    log_nodes: int = 3
    # gRPC ports: frontend 19090, handlers 19100.., log nodes 19200.., purgatory 19300,
    # replicator 19400 (offsets from base_port); Prometheus: gRPC port + 1000. 0: free ports.
    base_port: int = 19090
    num_partitions: int = 1
    default_replication_factor: int = 1
    log_level: str = "INFO"
    # How often log nodes run retention and the log cleaner (Kafka's
    # log.retention.check.interval.ms and log.cleaner.backoff.ms); tests shorten them.
    retention_check_interval_ms: int = 300_000
    cleaner_backoff_ms: int = 15_000
    # The replicator's replica.lag.time.max.ms; tests shorten it.
    replica_lag_time_max_ms: int = 30_000
    # Handlers' group coordinator: group.initial.rebalance.delay.ms,
    # group.min.session.timeout.ms and offsets.topic.num.partitions (None: their defaults).
    group_initial_rebalance_delay_ms: int | None = None
    group_min_session_timeout_ms: int | None = None
    offsets_topic_num_partitions: int | None = None
    # Further flags by kind of service ("frontend", "handler", "log", "replicator",
    # "purgatory"; "*": every service), by config field name: {"handler": {"x_y": 1}} passes
    # --x-y 1 to each handler. They override the planned flags of the same name.
    service_flags: Mapping[str, Mapping[str, object]] = dataclasses.field(default_factory=dict)
    # Mutual TLS between the services: a directory of ca.crt, <kind>.crt and <kind>.key
    # (None: plaintext gRPC on loopback).
    internal_tls: Path | None = None


def internal_tls_of(directory: Path | None, kind: str) -> InternalTls:
    """The TLS material of service kind ``kind`` in a ``ClusterSpec.internal_tls`` directory."""
    if directory is None:
        return PLAINTEXT
    directory = directory.resolve()
    return InternalTls(str(directory / "ca.crt"), str(directory / f"{kind}.crt"),
                       str(directory / f"{kind}.key"))


@dataclasses.dataclass(slots=True)
class ServiceProcess:
    name: str
    module: str
    args: list[str]
    grpc_port: int
    metrics_port: int
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def grpc_address(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def kind(self) -> str:
        """frontend, handler, log, purgatory or replicator."""
        return self.name.split("-")[0]

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def _ephemeral_range() -> tuple[int, int]:
    """The ports the kernel hands out for outgoing connections and port-0 binds."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port that is free now and that the kernel will not hand to someone else meanwhile."""
    return free_port_range(host, 1)


def free_port_range(host: str, count: int, attempts: int = 100) -> int:
    """The first of ``count`` consecutive ports that are free now and that the kernel will not
    hand to someone else meanwhile.

    A service binds its port only after it started, so a port the kernel chose (port 0) could
    be given to an outgoing connection in between ("Address already in use"). Ports below the
    ephemeral range are never chosen by the kernel, so they are picked at random there and
    checked; where that range is too small, the kernel's choice is checked instead. Every port
    handed out is claimed for the launchers of the whole machine (:mod:`services.port_claims`),
    so that two launchers starting at once do not pick the same one."""
    low, _ = _ephemeral_range()
    with claimed_ports() as claims:
        for _ in range(attempts):
            if low > _FIRST_PRIVATE_PORT + 1000:
                first = _random.randrange(_FIRST_PRIVATE_PORT, low - count)
            else:
                with socket.socket() as s:
                    s.bind((host, 0))
                    first = int(s.getsockname()[1])
            ports = range(first, first + count)
            if (first + count <= 65536 and _HANDED_OUT.isdisjoint(ports)
                    and claims.free(ports)
                    and all(_bindable(host, port) for port in ports)):
                _HANDED_OUT.update(ports)
                claims.claim(ports)
                return first
    raise OSError(f"no {count} consecutive free ports on {host}")


class StartupError(Exception):
    """The cluster cannot start, for a reason an operator fixes (a port in use, a data folder
    that cannot be written); the message is one line naming it."""


def _port_user(host: str, port: int) -> str | None:
    """Why ``port`` cannot be bound on ``host`` (None: it can)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            return exc.strerror or str(exc)
        return None


# Ports this process handed out: the services of a cluster bind theirs only once started, so
# a port checked free could otherwise be handed out twice (and a health check of one service
# answered by another).
_HANDED_OUT: set[int] = set()


class LocalCluster:
    """Starts, watches and stops the processes of one local cluster."""

    def __init__(self, spec: ClusterSpec) -> None:
        self.spec = spec
        self.data_dir = spec.data_dir.resolve()
        self.log_dir = self.data_dir / "logs"
        self.kafka_port = spec.kafka_port or free_port_range(spec.host, spec.log_nodes)
        self.services: dict[str, ServiceProcess] = {}
        self.supervisor: Supervisor | None = None
        # The frontend's Kafka sockets, bound once here and handed to every frontend process
        # this cluster starts (see kafka_sockets).
        self._kafka_sockets: dict[int, socket.socket] = {}
        if spec.internal_tls is not None:
            missing = [path for kind in SERVICE_KINDS for path in
                       dataclasses.astuple(internal_tls_of(spec.internal_tls, kind))
                       if not Path(path).is_file()]
            if missing:
                raise FileNotFoundError(
                    f"internal TLS material missing in {spec.internal_tls}: "
                    f"{', '.join(sorted(set(missing)))}")
        self._plan()

    def internal_tls(self, kind: str) -> InternalTls:
        """The TLS material services of ``kind`` run with (plaintext: all empty)."""
        return internal_tls_of(self.spec.internal_tls, kind)

    # -- planning -------------------------------------------------------------------------

    def _port(self, offset: int) -> int:
        return self.spec.base_port + offset if self.spec.base_port else free_port()

    def _add(self, name: str, module: str, grpc_port: int, **flags: object) -> ServiceProcess:
        """Plan service ``name``: ``python -m module`` with a flag per keyword (the config
        field it sets; None leaves the field at the service's default)."""
        metrics_port = grpc_port + 1000 if self.spec.base_port else free_port()
        kind = name.split("-")[0]
        tls = self.internal_tls(kind)
        tls_flags = {"internal_tls_ca": tls.ca, "internal_tls_cert": tls.cert,
                     "internal_tls_key": tls.key} if tls.enabled else {}
        flags = {"grpc_address": f"127.0.0.1:{grpc_port}", "metrics_port": metrics_port,
                 **tls_flags, **flags, **self.spec.service_flags.get("*", {}),
                 **self.spec.service_flags.get(kind, {})}
        args = [item for field, value in flags.items() if value is not None
                for item in (flag_name(field), str(value))]
        svc = ServiceProcess(name=name, module=module, args=args, grpc_port=grpc_port,
                             metrics_port=metrics_port, log_path=self.log_dir / f"{name}.log")
        self.services[name] = svc
        return svc

    def _plan(self) -> None:
        spec = self.spec
        purgatory = self._add("purgatory", "services.purgatory", self._port(210),
                              instance="purgatory-0")
        # Log nodes ask the replicator for their controlled shutdown when stopped.
        replicator_port = self._port(310)
        log_nodes = [
            self._add(f"log-{i}", "services.log", self._port(110 + i), node_id=i,
                      data_dir=self.data_dir / f"log-{i}",
                      purgatory_address=purgatory.grpc_address,
                      replicator_address=f"127.0.0.1:{replicator_port}",
                      retention_check_interval_ms=spec.retention_check_interval_ms,
                      cleaner_backoff_ms=spec.cleaner_backoff_ms)
            for i in range(spec.log_nodes)]
        replicator = self._add(
            "replicator", "services.replicator", replicator_port, instance="replicator-0",
            data_dir=self.data_dir / "replicator",
            log_nodes=",".join(f"{i}={node.grpc_address}" for i, node in enumerate(log_nodes)),
            num_partitions=spec.num_partitions,
            default_replication_factor=spec.default_replication_factor,
            replica_lag_time_max_ms=spec.replica_lag_time_max_ms,
            purgatory_address=purgatory.grpc_address)
        handlers = [
            self._add(f"handler-{i}", "services.handler", self._port(10 + i),
                      replicator_address=replicator.grpc_address,
                      purgatory_address=purgatory.grpc_address, advertised=self.advertised,
                      broker_ports=spec.log_nodes, instance=f"handler-{i}",
                      group_initial_rebalance_delay_ms=spec.group_initial_rebalance_delay_ms,
                      group_min_session_timeout_ms=spec.group_min_session_timeout_ms,
                      offsets_topic_num_partitions=spec.offsets_topic_num_partitions)
            for i in range(spec.handlers)]
        self._add("frontend", "services.frontend", self._port(0), listen_host=spec.host,
                  listen_port=self.kafka_port,
                  advertised_host=spec.advertised_host or spec.host,
                  advertised_port=spec.advertised_port or self.kafka_port,
                  broker_ports=spec.log_nodes,
                  handlers=",".join(handler.grpc_address for handler in handlers),
                  replicator_address=replicator.grpc_address, instance="frontend-0")

    @property
    def advertised(self) -> str:
        host = self.spec.advertised_host or self.spec.host
        return f"{host}:{self.spec.advertised_port or self.kafka_port}"

    @property
    def bootstrap(self) -> str:
        return f"{self.spec.host}:{self.kafka_port}"

    # -- life cycle -----------------------------------------------------------------------

    def preflight(self) -> None:
        """Raise :class:`StartupError` if the data folder cannot be written or a port the
        cluster listens on is taken."""
        try:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            probe = self.log_dir / ".writable"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise StartupError(f"data folder {self.data_dir} is not writable: "
                               f"{exc.strerror or exc}") from None
        for port in range(self.kafka_port, self.kafka_port + self.spec.log_nodes):
            reason = _port_user(self.spec.host, port)
            if reason is not None:
                raise StartupError(f"Kafka port {self.spec.host}:{port} is in use ({reason}); "
                                   f"choose another with --kafka-port")
        for svc in self.services.values():
            for what, port in (("gRPC", svc.grpc_port), ("metrics", svc.metrics_port)):
                reason = _port_user("127.0.0.1", port)
                if reason is not None:
                    raise StartupError(
                        f"{what} port 127.0.0.1:{port} of {svc.name} is in use ({reason}); "
                        f"choose other ports with --base-port")

    def start(self, timeout: float = 60.0,
              progress: Callable[[ServiceProcess], None] | None = None) -> None:
        """Start every service in dependency order; raise if one does not become healthy.
        ``progress`` is called with each service as it becomes healthy."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        order = [
            [n for n in self.services if n == "purgatory" or n.startswith("log-")],
            ["replicator"],
            [n for n in self.services if n.startswith("handler-")],
            ["frontend"],
        ]
        try:
            for group in order:
                for name in group:
                    self.start_service(name, wait=False)
                for name in group:
                    self.wait_healthy(name, timeout)
                    if progress is not None:
                        progress(self.services[name])
            self._wait_kafka_port(timeout)
        except BaseException:
            self.stop()
            raise

    def start_service(self, name: str, wait: bool = True, timeout: float = 60.0) -> None:
        svc = self.services[name]
        if svc.running:
            return
        env = dict(os.environ)
        env["KBROKER_LOG_LEVEL"] = self.spec.log_level
        env["PYTHONUNBUFFERED"] = "1"
        # No orphans: the service dies with the launcher, however the launcher ends (the
        # service sets its parent-death signal itself, see services.common.runtime).
        env[PARENT_PID_ENV] = str(os.getpid())
        args, fds = list(svc.args), ()
        if svc.kind == "frontend":
            sockets = self.kafka_sockets()
            if sockets:
                fds = tuple(sock.fileno() for sock in sockets.values())
                args += [flag_name("inherited_listeners"),
                         ",".join(f"{port}={sock.fileno()}" for port, sock in sockets.items())]
        log = open(svc.log_path, "ab")  # noqa: SIM115 - handed to the child process
        try:
            svc.proc = subprocess.Popen(
                [sys.executable, "-m", svc.module, *args],
                pass_fds=fds,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                # Own process group: Ctrl-C in a terminal reaches the launcher only, which then
                # stops the children in order.
                start_new_session=True,
            )
        finally:
            log.close()
        if self.supervisor is not None:
            self.supervisor.started(name, time.monotonic())
        if wait:
            self.wait_healthy(name, timeout)

    def kafka_sockets(self) -> dict[int, socket.socket]:
        """The listening sockets of the frontend's Kafka ports (one per broker id), bound on
        first use and kept by this process until :meth:`stop`: a frontend that is killed and
        started again serves the same sockets, so clients connecting in between wait in their
        queue instead of being refused (and backing off). None for a cluster with configured
        listeners, whose frontend binds its own."""
        if self.spec.service_flags.get("frontend", {}).get("listeners"):
            return {}
        if not self._kafka_sockets:
            try:
                for port in range(self.kafka_port, self.kafka_port + self.spec.log_nodes):
                    sock = socket.socket(socket.AF_INET6 if ":" in self.spec.host
                                         else socket.AF_INET)
                    self._kafka_sockets[port] = sock
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    sock.bind((self.spec.host, port))
                    sock.listen(1024)
            except OSError:
                self._close_kafka_sockets()
                raise
        return self._kafka_sockets

    def _close_kafka_sockets(self) -> None:
        for sock in self._kafka_sockets.values():
            sock.close()
        self._kafka_sockets.clear()

    def wait_healthy(self, name: str, timeout: float = 60.0) -> None:
        svc = self.services[name]
        deadline = time.monotonic() + timeout
        with self.health_channel(name) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while True:
                if not svc.running:
                    raise RuntimeError(f"{name} exited; see {svc.log_path}:\n{self.tail(name)}")
                try:
                    reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=1.0)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.RpcError:
                    pass
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{name} not healthy after {timeout}s; see {svc.log_path}:\n"
                                       f"{self.tail(name)}")
                time.sleep(0.1)

    def health_channel(self, name: str) -> grpc.Channel:
        """A blocking channel to service ``name``'s gRPC port, with the TLS material of its
        kind when the cluster runs mutual TLS (close it after use)."""
        svc = self.services[name]
        return internal_sync_channel(svc.grpc_address, self.internal_tls(svc.kind), svc.kind)

    def _wait_kafka_port(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(OSError), socket.create_connection(
                (self.spec.host, self.kafka_port), timeout=1.0
            ):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"Kafka port {self.bootstrap} not open:\n{self.tail('frontend')}")
            time.sleep(0.1)

    # -- supervision ----------------------------------------------------------------------

    def supervise(self, backoff: Backoff | None = None) -> None:
        """From now on, :meth:`supervise_step` restarts services that exited."""
        self.supervisor = Supervisor(list(self.services), backoff)
        now = time.monotonic()
        for name, svc in self.services.items():
            if svc.running:
                self.supervisor.started(name, now)

    def supervise_step(self) -> list[str]:
        """Notice exited services and restart those whose backoff has passed; return a line per
        exit and per restart. Call it regularly (``kbroker up`` does, twice a second)."""
        supervisor = self.supervisor
        if supervisor is None:
            return []
        lines = []
        now = time.monotonic()
        for name, svc in self.services.items():
            if svc.proc is None or svc.running or supervisor.pending(name):
                continue
            delay = supervisor.exited(name, now)
            lines.append(f"{name} (pid {svc.proc.pid}) exited with "
                         f"{describe_exit(svc.proc.returncode)}; restarting in {delay:g}s "
                         f"(log {svc.log_path})")
        for name in supervisor.due(now):
            count = supervisor.restarting(name, now)
            try:
                self.start_service(name, wait=False)
            except OSError as exc:
                lines.append(f"{name} could not be restarted: {exc}")
                continue
            svc = self.services[name]
            pid = svc.proc.pid if svc.proc is not None else "-"
            lines.append(f"{name} restarted (restart {count}), pid {pid}")
        return lines

    def restarts(self, name: str) -> int:
        """How often the supervisor restarted ``name`` (0 without supervision)."""
        return self.supervisor.restarts(name) if self.supervisor is not None else 0

    def kill(self, name: str) -> None:
        """SIGKILL one service (fault tests)."""
        svc = self.services[name]
        if svc.proc is not None and svc.proc.poll() is None:
            svc.proc.kill()
            svc.proc.wait(timeout=10)

    def stop_service(self, name: str, timeout: float = 15.0) -> bool:
        """Stop one service gracefully (SIGTERM: a log node hands its leaderships over first)
        and wait for it, killing it after ``timeout`` seconds. Returns whether it stopped by
        itself (True also when it was not running)."""
        proc = self.services[name].proc
        if proc is None or proc.poll() is not None:
            return True
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
            return True
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
            return False

    def stop(self) -> None:
        """Stop everything, in reverse dependency order: first the services clients reach
        (frontend, handlers) and the log nodes, then, once the log nodes are gone, the
        replicator and the purgatory, so the log nodes' controlled shutdowns still find the
        replicator (with every log node stopping, what one hands over the others keep)."""
        order = list(reversed(list(self.services)))
        last = {"replicator", "purgatory"}
        deadline = time.monotonic() + 10
        for phase in ([n for n in order if n not in last], [n for n in order if n in last]):
            for name in phase:
                proc = self.services[name].proc
                if proc is not None and proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            for name in phase:
                proc = self.services[name].proc
                if proc is None:
                    continue
                try:
                    proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)
        self._close_kafka_sockets()

    def tail(self, name: str, lines: int = 30) -> str:
        path = self.services[name].log_path
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def kafka_listeners(self) -> list[str]:
        """The frontend's Kafka listeners as ``PROTOCOL://host:port`` (Kafka's form: the
        listener name is its security protocol)."""
        configured = self.spec.service_flags.get("frontend", {}).get("listeners")
        if configured:
            return [item.strip() for item in str(configured).split(",") if item.strip()]
        return [f"PLAINTEXT://{self.bootstrap}"]

    def security_lines(self) -> Iterator[str]:
        """What is open and how it is protected: the Kafka listeners and the internal gRPC
        ports (plaintext on loopback, or mutual TLS)."""
        last = self.kafka_port + self.spec.log_nodes - 1
        yield (f"Kafka listeners: {', '.join(self.kafka_listeners())} "
               f"(brokers on ports {self.kafka_port}-{last})")
        ports = sorted(svc.grpc_port for svc in self.services.values())
        if self.spec.internal_tls is None:
            how = "plaintext, loopback only"
        else:
            how = f"mutual TLS, certificates in {self.spec.internal_tls.resolve()}"
        yield f"internal gRPC: {len(ports)} ports on 127.0.0.1 ({how})"

    def status_lines(self) -> Iterator[str]:
        for svc in self.services.values():
            state = "running" if svc.running else "stopped"
            pid = svc.proc.pid if svc.proc else "-"
            extra = ""
            if svc.name == "frontend":
                extra = f"  kafka {', '.join(self.kafka_listeners())}"
            security = "mtls" if self.internal_tls(svc.kind).enabled else "plaintext"
            yield (
                f"{svc.name:<11} {state:<8} pid {pid!s:<7} restarts {self.restarts(svc.name):<3} "
                f"grpc {svc.grpc_address:<16} {security:<9} metrics http://127.0.0.1:{svc.metrics_port}/metrics{extra}"
            )


def describe_exit(returncode: int | None) -> str:
    """A process's exit status as an operator reads it: ``status 1`` or ``signal SIGKILL``."""
    if returncode is None:
        return "no status"
    if returncode < 0:
        try:
            return f"signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"signal {-returncode}"
    return f"status {returncode}"
