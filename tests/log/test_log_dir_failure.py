"""A failed log directory (services.log.log_dir_failure) on real files: a write error takes
every replica of the directory offline (KAFKA_STORAGE_ERROR), once and logged once, with no
half-written batch left visible; the free-space floor refuses writes before a real file system
(a small tmpfs) is full; a restart with space serves again."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import REGISTRY

from kbroker.log.v1 import log_pb2_grpc
from services.common.channels import insecure_channel
from services.common.errors import ErrorCode, KafkaError
from services.log.log_dir_failure import DiskUsage, FreeSpaceFloor, LogDirFailureChannel
from services.log.server import SERVICE_NAME, LogService

from ..record_batches import build_batch
from .test_service import REPO, append, create, describe, read, run_node

STORAGE_ERROR = ErrorCode.kafka_storage_error.value


def test_the_first_failure_is_kept_and_reported_once() -> None:
    reported: list[str] = []
    channel = LogDirFailureChannel(Path("/data"), on_failure=reported.append)
    channel.check_online()
    assert channel.fail(OSError(errno.EIO, "Input/output error", "/data/t-0/0.log"), "Append")
    assert not channel.fail(OSError(errno.ENOSPC, "No space left on device"), "Append")
    assert reported == ["Append: EIO: Input/output error (/data/t-0/0.log)"]
    with pytest.raises(KafkaError) as caught:
        channel.check_online()
    assert caught.value.code == ErrorCode.kafka_storage_error


def test_the_floor_refuses_writes_that_would_go_below_it() -> None:
    written = [0]  # bytes written to the simulated disk of 100,000 with 10,000 free
    reads = []

    def usage(_: Path) -> DiskUsage:
        reads.append(written[0])
        free = 10_000 - written[0]
        return DiskUsage(total=100_000, free=free, used=100_000 - free)

    now = [0.0]
    floor = FreeSpaceFloor(min_bytes=1_000, min_percent=2)  # 2% of 100,000: 2,000 wins
    assert floor.bytes_for(100_000) == 2_000
    channel = LogDirFailureChannel(Path("/data"), floor, usage=usage, clock=lambda: now[0])

    def write(size: int) -> None:
        channel.reserve(size)
        written[0] += size

    for _ in range(5):
        write(1_000)  # far from the floor: free space is read once
    assert len(reads) == 1
    now[0] += 1.5
    write(1_000)  # a second later: read again
    assert len(reads) == 2
    write(1_000)  # 3,000 left by the estimate, within twice the floor: read each time
    write(1_000)
    assert len(reads) == 4
    with pytest.raises(OSError) as caught:
        write(1)  # 2,000 free: one more byte goes below the floor
    assert caught.value.errno == errno.ENOSPC
    assert written[0] == 8_000
    assert not FreeSpaceFloor().enabled
    with pytest.raises(ValueError):
        FreeSpaceFloor(min_percent=100)


# Run in a process of its own: RLIMIT_FSIZE makes writes past the limit fail with EFBIG (with
# SIGXFSZ ignored), a real write error of the file system call, mid-batch.
_FILE_SIZE_LIMIT_SCRIPT = r"""
import asyncio, json, logging, resource, signal, sys
from pathlib import Path
from kbroker.log.v1 import log_pb2
from services.log.log_manager import LogManager
from services.log.replica_manager import ReplicaManager
from services.log.servicer import LogServicer
from services.log.topic_config import TopicConfig
from tests.record_batches import build_batch

records = []
class Keep(logging.Handler):
    def emit(self, record):
        records.append((record.levelname, record.getMessage(), bool(record.exc_info)))
logging.getLogger().addHandler(Keep())
logging.getLogger().setLevel(logging.INFO)

def request(topic, batch):
    return log_pb2.AppendRequest(partitions=[
        log_pb2.PartitionAppend(topic=topic, partition=0, records=batch)])

async def main(data_dir):
    manager = LogManager(data_dir, TopicConfig())
    manager.load()
    servicer = LogServicer(manager, ReplicaManager(manager, 0))
    out = {}
    for topic in ("big", "small"):
        manager.create(topic, 0, "tid", {})
        assert (await servicer.Append(request(topic, build_batch([b"first"])), None)
                ).results[0].error_code == 0
    segment = manager.get("big", 0).segments[-1]
    out["size_before"] = segment.size
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (segment.size + 100, hard))
    failed = (await servicer.Append(request("big", build_batch([b"x" * 2000])), None)).results[0]
    out["failed"] = [failed.error_code, failed.base_offset]
    resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
    out["file_size_after"] = segment.log_path.stat().st_size
    out["log_end_offset"] = manager.find("big", 0).log_end_offset
    out["again"] = [r.error_code for r in (await servicer.Append(
        request("big", build_batch([b"y"])), None)).results]
    out["other"] = [r.error_code for r in (await servicer.Append(
        request("small", build_batch([b"y"])), None)).results]
    out["read"] = [r.error_code for r in (await servicer.Read(log_pb2.ReadRequest(partitions=[
        log_pb2.PartitionRead(topic="small", partition=0, offset=0, max_bytes=1000)]),
        None)).message.results]
    out["offline_replicas"] = manager.offline_replicas()
    manager.close()
    out["log"] = records
    print(json.dumps(out))

asyncio.run(main(Path(sys.argv[1])))
"""


@pytest.mark.processes
def test_a_write_error_mid_batch_takes_the_log_dir_offline_and_leaves_nothing_behind(
        tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    done = subprocess.run([sys.executable, "-c", _FILE_SIZE_LIMIT_SCRIPT, str(data_dir)],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["failed"] == [STORAGE_ERROR, -1]
    # The partial write was cut back: the log end and the file are as before.
    assert out["log_end_offset"] == 1
    assert out["file_size_after"] == out["size_before"]
    # Every replica of the directory is offline from then on.
    assert out["again"] == out["other"] == out["read"] == [STORAGE_ERROR]
    assert out["offline_replicas"] == 2
    errors = [message for level, message, _ in out["log"] if level == "ERROR"]
    assert len(errors) == 1 and "EFBIG" in errors[0], out["log"]
    assert not any(traceback for _, _, traceback in out["log"])

    async def restarted(stub: log_pb2_grpc.LogServiceStub, service: LogService) -> None:
        for topic in ("big", "small"):
            state = await describe(stub, topic)
            assert (state.error_code, state.log_end_offset) == (0, 1)
            assert (await append(stub, topic, build_batch([b"after"]))).base_offset == 1

    run_node(tmp_path, restarted)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs as the log node's data folder (tests run as root); unmounted after."""
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(data_dir)],
                             capture_output=True, text=True, timeout=30)
    assert mounted.returncode == 0, f"cannot mount a tmpfs (run as root): {mounted.stderr}"
    try:
        yield data_dir
    finally:
        subprocess.run(["umount", "-l", str(data_dir)], capture_output=True, timeout=30)
        assert not os.path.ismount(data_dir), f"{data_dir} is still mounted"


def test_the_free_space_floor_takes_the_log_dir_offline_before_the_disk_is_full(
        tmp_path: Path, small_disk: Path) -> None:
    floor = 2 * 1024 * 1024
    batch = build_batch([os.urandom(1000) for _ in range(64)])  # ~64 KiB
    log_dir = {"log_dir": str(small_disk)}

    async def body(stub: log_pb2_grpc.LogServiceStub, service: LogService) -> None:
        await create(stub, "t")
        total = REGISTRY.get_sample_value("kbroker_log_dir_total_bytes", log_dir)
        assert total == 4 * 1024 * 1024
        assert REGISTRY.get_sample_value("kbroker_log_dir_min_free_bytes", log_dir) == floor
        assert REGISTRY.get_sample_value("kbroker_log_offline_log_dirs", log_dir) == 0
        stored = 0
        for _ in range(64):
            result = await append(stub, "t", batch)
            if result.error_code:
                break
            stored += 1
        assert result.error_code == STORAGE_ERROR
        assert result.base_offset == -1
        free = os.statvfs(small_disk).f_bavail * os.statvfs(small_disk).f_frsize
        # Refused at the floor, well before the file system was full.
        assert floor - len(batch) <= free < floor + 2 * len(batch), (free, stored)
        assert stored >= 20
        assert (await read(stub, "t", 0)).error_code == STORAGE_ERROR
        assert REGISTRY.get_sample_value("kbroker_log_offline_log_dirs", log_dir) == 1
        assert REGISTRY.get_sample_value("kbroker_log_offline_replicas", log_dir) == 1
        assert REGISTRY.get_sample_value("kbroker_log_dir_free_bytes", log_dir) == free
        held = REGISTRY.get_sample_value("kbroker_log_dir_partition_bytes", log_dir)
        assert held == stored * len(batch)
        used = REGISTRY.get_sample_value("kbroker_log_dir_used_bytes", log_dir)
        assert held <= used <= total - free
        async with insecure_channel(f"127.0.0.1:{service.port}") as channel:
            reply = None
            for _ in range(50):
                reply = await health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(service=SERVICE_NAME))
                if reply.status == health_pb2.HealthCheckResponse.NOT_SERVING:
                    break
                await asyncio.sleep(0.02)
            assert reply is not None
            assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING

    run_node(tmp_path, body, log_dir_min_free_bytes=floor)

    async def restarted(stub: log_pb2_grpc.LogServiceStub, service: LogService) -> None:
        assert (await append(stub, "t", batch)).error_code == 0  # a lower floor: space again

    run_node(tmp_path, restarted, log_dir_min_free_bytes=floor // 4)
