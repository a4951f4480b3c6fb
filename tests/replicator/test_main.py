"""``python -m services.replicator``: serves gRPC and Prometheus, stops cleanly on SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import socket
import sys
import time
import urllib.request
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kbroker.replicator.v1 import replicator_pb2 as pb
from kbroker.replicator.v1 import replicator_pb2_grpc

from .fake_log_node import FakeLogNode

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tail(log: Path) -> str:
    return log.read_text(errors="replace")[-3000:]


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return r.read().decode()


async def wait_serving(channel: grpc.aio.Channel, proc: asyncio.subprocess.Process,
                       log: Path) -> None:
    stub = health_pb2_grpc.HealthStub(channel)
    deadline = time.monotonic() + 30
    while True:
        assert proc.returncode is None, tail(log)
        try:
            reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=1)
            if reply.status == health_pb2.HealthCheckResponse.SERVING:
                return
        except grpc.aio.AioRpcError:
            pass
        assert time.monotonic() < deadline, tail(log)
        await asyncio.sleep(0.05)


@pytest.mark.processes
def test_process_serves_and_stops_on_sigterm(tmp_path: Path):
    async def scenario() -> None:
        node = FakeLogNode(0)
        await node.start()
        grpc_port, metrics_port = free_port(), free_port()
        address = f"127.0.0.1:{grpc_port}"
        log = tmp_path / "replicator.log"
        with log.open("wb") as out:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "services.replicator", "--grpc-address", address,
                "--metrics-port", str(metrics_port), "--data-dir", str(tmp_path / "r"),
                "--log-nodes", node.entry, "--num-partitions", "2",
                "--metadata-store", "file",
                cwd=ROOT, stdout=out, stderr=out,
            )
        try:
            async with grpc.aio.insecure_channel(address) as channel:
                await wait_serving(channel, proc, log)
                stub = replicator_pb2_grpc.ReplicatorStub(channel)
                reply = await stub.CreateTopics(pb.CreateTopicsRequest(topics=[
                    pb.NewTopic(name="t", num_partitions=-1, replication_factor=-1)]))
                assert reply.topics[0].error_code == 0 and reply.topics[0].num_partitions == 2
                metadata = await stub.GetMetadata(pb.GetMetadataRequest())
                assert metadata.log_nodes[0].alive and metadata.controller_id == 0
            text = await asyncio.to_thread(scrape, metrics_port)
            assert "kbroker_replicator_partitions 2.0" in text
            assert "kbroker_replicator_live_log_nodes 1.0" in text
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(proc.wait(), 15) == 0, tail(log)
            assert (tmp_path / "r" / "metadata.json").exists()
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            await node.stop()

    asyncio.run(scenario())
