"""Durability of a log node process: killed with SIGKILL during a storm of appends through the
real gRPC API, it restarts with every acknowledged batch intact and no partial batch visible;
a segment whose storage reports "disk full" makes appends answer KAFKA_STORAGE_ERROR while the
node keeps serving."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from kbroker.log.v1 import log_pb2, log_pb2_grpc
from services.common.channels import insecure_channel
from services.common.errors import ErrorCode
from services.common.records.record_batch import iter_batches
from services.log.log_validator import stored_batch_problem
from services.log.server import LogService

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
def test_a_full_disk_gives_storage_errors_and_the_node_stays_up(tmp_path: Path) -> None:
    """The condition is real, not simulated: the active segment file is replaced by a link to
    /dev/full, whose writes fail with ENOSPC as on a full file system. (Permission bits would
    not do: the tests may run as root, who ignores them.)"""
    if not os.path.exists("/dev/full"):
        raise AssertionError("this test needs /dev/full")

    async def body(stub: log_pb2_grpc.LogServiceStub, service: LogService) -> None:
        await create(stub, "full")
        await create(stub, "fine")
        assert (await append(stub, "full", build_batch([b"kept"], base_timestamp=1000))
                ).error_code == 0
        # The batch is old for segment.ms, so the next append rolls to a segment at offset
        # 1, whose file is now the full device.
        segment_dir = tmp_path / "data" / "full-0"
        (segment_dir / f"{1:020d}.log").symlink_to("/dev/full")

        failed = await append(stub, "full", build_batch([b"lost"]))
        assert failed.error_code == ErrorCode.kafka_storage_error.value
        assert failed.base_offset == -1
        again = await append(stub, "full", build_batch([b"lost"]))
        assert again.error_code == ErrorCode.kafka_storage_error.value
        # The node and its other replicas carry on; what was stored stays readable.
        assert (await append(stub, "fine", build_batch([b"x"]))).error_code == 0
        state = await describe(stub, "full")
        assert (state.error_code, state.log_end_offset) == (0, 1)
        kept = await read(stub, "full", 0)
        assert [b.header.base_offset for b in iter_batches(kept.records)] == [0]

    run_node(tmp_path, body, segment_ms=1)
