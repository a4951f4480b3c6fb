"""``kbroker up`` as an operator runs it, in a subprocess: start-up progress per service, one
clear line per start-up failure, a killed service restarted by itself under a producer, and
no service outliving a launcher killed with SIGKILL."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer

from services.local_cluster import free_port_range

from .test_confluent_kafka import create_topic

SERVICES = ["purgatory", "log-0", "log-1", "log-2", "replicator", "handler-0", "handler-1",
            "frontend"]
STATUS = re.compile(r"^(\S+)\s+(running|stopped)\s+pid (\d+)\s+restarts (\d+)", re.M)


class Launcher:
    """One ``kbroker up`` process, its output in files; :meth:`stop` ends it by PID."""

    def __init__(self, folder: Path, *flags: str, data_dir: Path | None = None,
                 kafka_port: int | None = None) -> None:
        self.kafka_port = kafka_port or free_port_range("127.0.0.1", 3)
        data_dir = data_dir or folder / "data"
        self.out = folder / "kbroker-up.out"
        self.err = folder / "kbroker-up.err"
        with open(self.out, "wb") as out, open(self.err, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "services.cli", "up", "--data-dir", str(data_dir),
                 "--kafka-port", str(self.kafka_port), *flags],
                stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                cwd=Path(__file__).resolve().parents[2])
        self.service_pids: dict[str, int] = {}

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.kafka_port}"

    def output(self) -> str:
        return self.out.read_text(errors="replace")

    def errors(self) -> str:
        return self.err.read_text(errors="replace")

    def wait_for(self, pattern: str, timeout: float, stream: str = "out") -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while True:
            text = self.output() if stream == "out" else self.errors()
            match = re.search(pattern, text, re.M)
            if match:
                return match
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"no {pattern!r} in kbroker up's output:\n"
                                     f"{self.output()}\n{self.errors()}")
            time.sleep(0.1)

    def wait_up(self, timeout: float = 180.0) -> None:
        self.wait_for(r"^Kafka clients: bootstrap\.servers=", timeout)
        self.service_pids = {name: int(pid) for name, _, pid, _ in
                             STATUS.findall(self.output())}

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        # Whatever the test did, no service it started outlives it.
        for pid in self.service_pids.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture()
def launchers() -> Iterator[list[Launcher]]:
    started: list[Launcher] = []
    try:
        yield started
    finally:
        for launcher in started:
            launcher.stop()


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not reaped by its new parent, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_start_up_shows_each_service_and_the_services_die_with_a_killed_launcher(
        tmp_path: Path, launchers: list[Launcher]):
    launcher = Launcher(tmp_path, "--base-port", "0")
    launchers.append(launcher)
    launcher.wait_up()
    healthy = re.findall(r"^\s+(\S+)\s+healthy\s+pid (\d+)", launcher.output(), re.M)
    assert sorted(name for name, _ in healthy) == sorted(SERVICES)
    order = [name for name, _ in healthy]
    assert max(order.index(n) for n in ("purgatory", "log-0", "log-1", "log-2")) \
        < order.index("replicator") < min(order.index("handler-0"), order.index("handler-1")) \
        < order.index("frontend")
    assert sorted(launcher.service_pids) == sorted(SERVICES)
    assert {name: int(pid) for name, pid in healthy} == launcher.service_pids
    assert all(alive(pid) for pid in launcher.service_pids.values())

    launcher.proc.kill()
    launcher.proc.wait(timeout=10)
    deadline = time.monotonic() + 5
    while any(alive(pid) for pid in launcher.service_pids.values()) and \
            time.monotonic() < deadline:
        time.sleep(0.1)
    assert {name: pid for name, pid in launcher.service_pids.items() if alive(pid)} == {}


def assert_one_line_failure(launcher: Launcher, expected: str) -> None:
    assert launcher.proc.wait(timeout=60) == 1
    errors = launcher.errors()
    assert errors.splitlines() == [errors.strip()], errors
    assert errors.startswith("start-up failed: ")
    assert expected in errors, errors
    assert "Traceback" not in errors + launcher.output()
    assert "healthy" not in launcher.output()


def test_a_kafka_port_in_use_is_one_line(tmp_path: Path, launchers: list[Launcher]):
    port = free_port_range("127.0.0.1", 3)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port + 1))
        taken.listen()
        launcher = Launcher(tmp_path, "--base-port", "0", kafka_port=port)
        launchers.append(launcher)
        assert_one_line_failure(launcher, f"Kafka port 127.0.0.1:{port + 1} is in use")


def test_a_grpc_port_in_use_is_one_line(tmp_path: Path, launchers: list[Launcher]):
    base = free_port_range("127.0.0.1", 211)
    with socket.socket() as taken:
        # The purgatory's gRPC port (base + 210), the first the launcher checks.
        taken.bind(("127.0.0.1", base + 210))
        taken.listen()
        launcher = Launcher(tmp_path, "--base-port", str(base))
        launchers.append(launcher)
        assert_one_line_failure(
            launcher, f"gRPC port 127.0.0.1:{base + 210} of purgatory is in use")


def test_an_unwritable_data_folder_is_one_line(tmp_path: Path, launchers: list[Launcher]):
    # A file where the data folder's parent should be (chmod does not stop root).
    (tmp_path / "plain-file").write_text("")
    launcher = Launcher(tmp_path, "--base-port", "0",
                        data_dir=tmp_path / "plain-file" / "data")
    launchers.append(launcher)
    assert_one_line_failure(
        launcher, f"data folder {tmp_path / 'plain-file' / 'data'} is not writable")


def test_a_killed_log_node_is_restarted_under_an_idempotent_producer(
        tmp_path: Path, launchers: list[Launcher]):
    launcher = Launcher(tmp_path, "--base-port", "0")
    launchers.append(launcher)
    launcher.wait_up()
    topic = "supervised"
    create_topic(launcher.bootstrap, topic, partitions=3)

    producer = Producer({"bootstrap.servers": launcher.bootstrap, "acks": "all",
                         "enable.idempotence": True, "linger.ms": 5})
    leaders = {part.leader for part in
               producer.list_topics(topic, timeout=10).topics[topic].partitions.values()}
    assert 1 in leaders  # the victim, log-1 (broker 1), leads a partition the producer writes
    failures: list[str] = []
    delivered: list[bytes] = []

    def on_delivery(err, msg) -> None:
        if err is not None:
            failures.append(str(err))
        else:
            delivered.append(msg.value())

    total = 3000
    sent = threading.Event()

    def produce() -> None:
        for i in range(total):
            producer.produce(topic, value=b"%d" % i, key=b"%d" % i, on_delivery=on_delivery)
            producer.poll(0)
            time.sleep(0.002)
        sent.set()

    thread = threading.Thread(target=produce, name="producer", daemon=True)
    thread.start()
    time.sleep(1.0)
    victim = launcher.service_pids["log-1"]
    os.kill(victim, signal.SIGKILL)
    launcher.wait_for(rf"^log-1 \(pid {victim}\) exited with signal SIGKILL", 10, "err")
    launcher.wait_for(r"^log-1 restarted \(restart 1\), pid \d+", 10, "err")
    assert sent.wait(60)
    thread.join(timeout=10)
    assert producer.flush(90) == 0
    assert failures == []
    assert sorted(delivered) == sorted(b"%d" % i for i in range(total))

    consumer = Consumer({"bootstrap.servers": launcher.bootstrap, "group.id": "supervised",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    consumed: list[bytes] = []
    deadline = time.monotonic() + 60
    try:
        while len(consumed) < total and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                consumed.append(msg.value())
    finally:
        consumer.close()
    assert sorted(consumed) == sorted(b"%d" % i for i in range(total))

    launcher.stop()
    final = {name: (state, int(restarts)) for name, state, _, restarts in
             STATUS.findall(launcher.output().split("stopping...", 1)[1])}
    assert final == {name: ("stopped", 1 if name == "log-1" else 0) for name in SERVICES}
    assert "stopping the cluster" not in launcher.errors()


# A launcher without the parent-death signal (as on systems that have none): it starts the
# purgatory with its own pid in KBROKER_PARENT_PID, prints the purgatory's pid, and waits.
BARE_LAUNCHER = """
import os, subprocess, sys
env = dict(os.environ, KBROKER_PARENT_PID=str(os.getpid()))
child = subprocess.Popen([sys.executable, "-m", "services.purgatory", "--grpc-address",
                          sys.argv[1]], env=env, start_new_session=True)
print(child.pid, flush=True)
child.wait()
"""


def test_a_service_stops_when_the_launcher_in_its_environment_is_gone(tmp_path: Path):
    port = free_port_range("127.0.0.1", 1)
    with open(tmp_path / "purgatory.log", "wb") as log:
        launcher = subprocess.Popen(
            [sys.executable, "-c", BARE_LAUNCHER, f"127.0.0.1:{port}"], stdout=subprocess.PIPE,
            stderr=log, cwd=Path(__file__).resolve().parents[2])
    assert launcher.stdout is not None
    service = int(launcher.stdout.readline())
    try:
        deadline = time.monotonic() + 30
        while b"ready: gRPC" not in (tmp_path / "purgatory.log").read_bytes():
            assert time.monotonic() < deadline and alive(service)
            time.sleep(0.1)
        assert alive(service)
        launcher.kill()
        launcher.wait(timeout=10)
        deadline = time.monotonic() + 5
        while alive(service) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(service)
        assert b"is gone; stopping" in (tmp_path / "purgatory.log").read_bytes()
    finally:
        launcher.kill()
        launcher.wait(timeout=10)
        launcher.stdout.close()
        with contextlib.suppress(ProcessLookupError):
            os.kill(service, signal.SIGKILL)
