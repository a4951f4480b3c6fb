"""``python -m services.purgatory``: serves gRPC and Prometheus, stops cleanly on SIGTERM."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kbroker.purgatory.v1 import purgatory_pb2 as pb
from kbroker.purgatory.v1 import purgatory_pb2_grpc

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_serving(channel: grpc.Channel, proc: subprocess.Popen[bytes], log: Path) -> None:
    stub = health_pb2_grpc.HealthStub(channel)
    deadline = time.monotonic() + 30
    while True:
        assert proc.poll() is None, log.read_text()
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=1)
            if reply.status == health_pb2.HealthCheckResponse.SERVING:
                return
        except grpc.RpcError:
            pass
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.05)


@pytest.mark.processes
def test_process_serves_and_stops_on_sigterm(tmp_path: Path):
    grpc_port, metrics_port = free_port(), free_port()
    address = f"127.0.0.1:{grpc_port}"
    log = tmp_path / "purgatory.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "services.purgatory", "--grpc-address", address,
             "--metrics-port", str(metrics_port)],
            cwd=ROOT, stdout=out, stderr=out,
        )
    try:
        with grpc.insecure_channel(address) as channel:
            wait_serving(channel, proc, log)
            stub = purgatory_pb2_grpc.PurgatoryStub(channel)
            answer = stub.Await(pb.AwaitRequest(kind=pb.OPERATION_KIND_FETCH, timeout_ms=10,
                                                keys=[pb.WatchedKey(key="k", threshold=1)]),
                                timeout=5)
            assert answer.outcome == pb.OUTCOME_EXPIRED
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as r:
            text = r.read().decode()
        assert 'kbroker_purgatory_expired_total{kind="fetch"} 1.0' in text
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
