"""Durability of a log node process: killed with SIGKILL during a storm of appends through the
real gRPC API, it restarts with every acknowledged batch intact and no partial batch visible;
a segment whose storage reports "disk full" takes the log dir offline (KAFKA_STORAGE_ERROR for
every replica) while the process keeps serving health and metrics."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import REGISTRY

from kbroker.log.v1 import log_pb2, log_pb2_grpc
from services.common.channels import insecure_channel
from services.common.errors import ErrorCode
from services.common.records.record_batch import iter_batches
from services.log.log_validator import stored_batch_problem
from services.log.server import SERVICE_NAME, LogService

from ..log_records import own
from ..record_batches import build_batch
from .test_service import REPO, append, create, describe, free_port, read, run_node

STORM_SECONDS = 1.5
WRITERS = 4


def spawn_node(data_dir: Path, port: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "services.log", "--grpc-address", f"127.0.0.1:{port}",
         "--data-dir", str(data_dir)],
        cwd=REPO, stderr=subprocess.DEVNULL, text=True,
    )


@pytest.mark.processes
def test_a_node_killed_mid_storm_keeps_every_acknowledged_batch(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    port = free_port()
    process = spawn_node(data_dir, port)
    acknowledged: dict[int, bytes] = {}  # base offset -> the batch as sent

    async def writer(stub: log_pb2_grpc.LogServiceStub, number: int,
                     stop: asyncio.Event) -> None:
        sequence = 0
        while not stop.is_set():
            count = 1 + sequence % 5
            batch = build_batch([f"w{number}-{sequence}-{i}".encode() * 20 for i in range(count)])
            sequence += 1
            try:
                result = await append(stub, "storm", batch)
            except grpc.aio.AioRpcError:
                return  # the node is gone: this append was never acknowledged
            assert result.error_code == 0, result.error_message
            acknowledged[result.base_offset] = batch

    async def storm() -> None:
        channel = insecure_channel(f"127.0.0.1:{port}")
        try:
            stub = log_pb2_grpc.LogServiceStub(channel)
            await stub.DescribePartitions(log_pb2.DescribePartitionsRequest(),
                                          wait_for_ready=True, timeout=30)
            await create(stub, "storm", segment_bytes=str(64 * 1024),
                         index_interval_bytes="1024")
            stop = asyncio.Event()
            writers = [asyncio.create_task(writer(stub, n, stop)) for n in range(WRITERS)]
            await asyncio.sleep(STORM_SECONDS)
            process.kill()  # SIGKILL: no flush, no checkpoint
            await asyncio.wait_for(asyncio.gather(*writers), 30)
            stop.set()
        finally:
            await channel.close()

    try:
        asyncio.run(asyncio.wait_for(storm(), 60))
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
    assert len(acknowledged) > 20

    async def check(stub: log_pb2_grpc.LogServiceStub, service: LogService) -> None:
        state = await describe(stub, "storm")
        end = max(base + len(list(iter_batches(batch))) for base, batch in
                  acknowledged.items())
        assert state.log_end_offset >= max(acknowledged) + 1 and end > 0
        stored: dict[int, bytes] = {}
        offset = 0
        while offset < state.log_end_offset:
            records = (await read(stub, "storm", offset)).records
            assert records
            for batch in iter_batches(records):
                assert stored_batch_problem(records, batch.position, offset) is None
                assert batch.header.base_offset == offset  # no hole, nothing partial
                stored[offset] = records[batch.position:batch.position + batch.header.size]
                offset = batch.header.next_offset
        for base, sent in acknowledged.items():
            assert stored[base][8:] == sent[8:], f"batch at {base} differs"
        # The restarted node appends after what it kept.
        assert (await append(stub, "storm", build_batch([b"after"]))).base_offset == offset

    run_node(tmp_path, check)


@pytest.mark.processes
def test_a_full_disk_takes_the_log_dir_offline_and_the_node_stays_up(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The condition is real, not simulated: the active segment file is replaced by a link to
    /dev/full, whose writes fail with ENOSPC as on a full file system. (Permission bits would
    not do: the tests may run as root, who ignores them.) As in Kafka, the failure takes the
    whole log dir offline, logged once; a restart with the fault gone serves again."""
    if not os.path.exists("/dev/full"):
        raise AssertionError("this test needs /dev/full")
    storage_error = ErrorCode.kafka_storage_error.value
    segment_dir = tmp_path / "data" / "full-0"

    async def body(stub: log_pb2_grpc.LogServiceStub, service: LogService) -> None:
        await create(stub, "full")
        await create(stub, "fine")
        assert (await append(stub, "full", build_batch([b"kept"], base_timestamp=1000))
                ).error_code == 0
        # The batch is old for segment.ms, so the next append rolls to a segment at offset
        # 1, whose file is now the full device.
        (segment_dir / f"{1:020d}.log").symlink_to("/dev/full")

        failed = await append(stub, "full", build_batch([b"lost"]))
        assert failed.error_code == storage_error
        assert failed.base_offset == -1
        again = await append(stub, "full", build_batch([b"lost"]))
        assert again.error_code == storage_error
        # Every replica of the log dir is offline: appends, reads, descriptions.
        assert (await append(stub, "fine", build_batch([b"x"]))).error_code == storage_error
        assert (await read(stub, "full", 0)).error_code == storage_error
        state = await describe(stub, "full")
        assert (state.error_code, state.log_end_offset) == (storage_error, 1)
        # The process serves (health, metrics), its log service does not.
        async with insecure_channel(f"127.0.0.1:{service.port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            for _ in range(50):
                reply = await health.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME))
                if reply.status == health_pb2.HealthCheckResponse.NOT_SERVING:
                    break
                await asyncio.sleep(0.02)
            assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING
            whole = await health.Check(health_pb2.HealthCheckRequest(service=""))
            assert whole.status == health_pb2.HealthCheckResponse.SERVING
        log_dir = {"log_dir": str(tmp_path / "data")}
        assert REGISTRY.get_sample_value("kbroker_log_offline_log_dirs", log_dir) == 1
        assert REGISTRY.get_sample_value("kbroker_log_offline_replicas", log_dir) == 2

    with caplog.at_level(logging.ERROR):
        run_node(tmp_path, body, segment_ms=1)
    failures = [r for r in caplog.records if "failed" in r.getMessage()
                and r.name == "services.log.log_dir_failure"]
    assert len(failures) == 1, [r.getMessage() for r in caplog.records]
    assert not [r for r in own(caplog.records) if r.exc_info], "no traceback per append"

    (segment_dir / f"{1:020d}.log").unlink()

    async def restarted(stub: log_pb2_grpc.LogServiceStub, service: LogService) -> None:
        assert [b.header.base_offset for b in iter_batches(
            (await read(stub, "full", 0)).records)] == [0]
        after = await append(stub, "full", build_batch([b"after"]))
        assert (after.error_code, after.base_offset) == (0, 1)
        assert (await append(stub, "fine", build_batch([b"x"]))).error_code == 0

    run_node(tmp_path, restarted)
