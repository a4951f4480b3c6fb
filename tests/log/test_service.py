"""Service tests: a real LogService gRPC server on 127.0.0.1 port 0 with its data in tmp_path,
and a minimal in-test purgatory to receive high watermark notifications."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kbroker.log.v1 import log_pb2, log_pb2_grpc
from kbroker.purgatory.v1 import purgatory_pb2, purgatory_pb2_grpc
from services.common.channels import insecure_channel
from services.common.errors import ErrorCode
from services.common.file_records import FileRecordsReader, local_host_key
from services.common.records.record_batch import iter_batches
from services.log.config import LogConfig
from services.log.server import LogService, start

from ..record_batches import build_batch, values

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 60.0

Body = Callable[[log_pb2_grpc.LogServiceStub, LogService], Awaitable[None]]


def run_node(tmp_path: Path, body: Body, **settings: object) -> None:
    """Run ``body`` against a fresh log node, stopping it afterwards whatever happens."""

    async def main() -> None:
        config = LogConfig(data_dir=str(tmp_path / "data"), grpc_address="127.0.0.1:0",
                           **settings)  # type: ignore[arg-type]
        service = await start(config)
        channel = insecure_channel(f"127.0.0.1:{service.port}")
        try:
            await body(log_pb2_grpc.LogServiceStub(channel), service)
        finally:
            await channel.close()
            await service.stop(0)

    asyncio.run(asyncio.wait_for(main(), TIMEOUT))


async def create(stub: log_pb2_grpc.LogServiceStub, topic: str, partition: int = 0,
                 **configs: str) -> None:
    response = await stub.CreatePartitions(log_pb2.CreatePartitionsRequest(partitions=[
        log_pb2.PartitionSpec(topic=topic, partition=partition, topic_id="tid",
                              configs={k.replace("_", "."): v for k, v in configs.items()})
    ]))
    assert [r.error_code for r in response.results] == [0]


async def append(stub: log_pb2_grpc.LogServiceStub, topic: str, records: bytes,
                 partition: int = 0) -> log_pb2.PartitionAppendResult:
    response = await stub.Append(log_pb2.AppendRequest(partitions=[
        log_pb2.PartitionAppend(topic=topic, partition=partition, records=records)
    ]))
    [result] = response.results
    return result


async def read(stub: log_pb2_grpc.LogServiceStub, topic: str, offset: int,
               max_bytes: int = 1 << 20, partition: int = 0) -> log_pb2.PartitionReadResult:
    response = await stub.Read(log_pb2.ReadRequest(partitions=[
        log_pb2.PartitionRead(topic=topic, partition=partition, offset=offset,
                              max_bytes=max_bytes)
    ]))
    [result] = response.results
    return result


async def describe(stub: log_pb2_grpc.LogServiceStub, topic: str,
                   partition: int = 0) -> log_pb2.PartitionState:
    response = await stub.DescribePartitions(log_pb2.DescribePartitionsRequest(
        partitions=[log_pb2.TopicPartition(topic=topic, partition=partition)]))
    [state] = response.partitions
    return state


def spans(records: bytes) -> list[tuple[int, int]]:
    return [(b.header.base_offset, b.header.last_offset) for b in iter_batches(records)]


def test_a_waiting_read_of_no_partitions_is_answered_at_once(tmp_path: Path) -> None:
    # Found by tests/fuzz: asyncio.wait of no waiters raised, a crash of the Read RPC.
    async def body(stub: log_pb2_grpc.LogServiceStub, service: LogService) -> None:
        started = time.monotonic()
        response = await stub.Read(log_pb2.ReadRequest(max_wait_ms=5000), timeout=10)
        assert list(response.results) == []
        assert time.monotonic() - started < 2.5

    run_node(tmp_path, body)


def test_append_read_and_list_offsets(tmp_path: Path) -> None:
    async def body(stub: log_pb2_grpc.LogServiceStub, service: LogService) -> None:
        await create(stub, "orders")
        first = await append(stub, "orders", build_batch(values(3), base_timestamp=1000))
        second = await append(stub, "orders", build_batch(values(4), base_timestamp=5000))
        assert (first.error_code, first.base_offset, first.log_end_offset) == (0, 0, 3)
        assert (second.base_offset, second.high_watermark, second.log_start_offset) == (3, 7, 0)
        assert second.log_append_time_ms == -1

        middle = await read(stub, "orders", 5)
        assert middle.error_code == 0
        assert spans(middle.records) == [(3, 6)]  # the whole batch holding offset 5
        assert (middle.high_watermark, middle.last_stable_offset) == (7, 7)
        assert (middle.log_start_offset, middle.log_end_offset) == (0, 7)
        assert spans((await read(stub, "orders", 0)).records) == [(0, 2), (3, 6)]

        response = await stub.ListOffsets(log_pb2.ListOffsetsRequest(partitions=[
            log_pb2.PartitionTimestamp(topic="orders", partition=0, timestamp=t)
            for t in (-1, -2, -3, 1001, 4000, 9999)
        ]))
        assert [(r.error_code, r.offset, r.timestamp) for r in response.results] == [
            (0, 7, -1), (0, 0, -1), (0, 6, 5003), (0, 1, 1001), (0, 3, 5000), (0, -1, -1),
        ]

        state = await describe(stub, "orders")
        assert (state.error_code, state.log_end_offset, state.high_watermark) == (0, 7, 7)
        assert state.segments == 1 and state.size_bytes == len(
            build_batch(values(3))) + len(build_batch(values(4)))

    run_node(tmp_path, body)


def test_keyless_records_on_a_compacted_topic_are_named_in_the_record_errors(
        tmp_path: Path) -> None:
    async def body(stub: log_pb2_grpc.LogServiceStub, service: LogService) -> None:
        await create(stub, "table", cleanup_policy="compact")
        refused = await append(stub, "table", build_batch(values(4), keys=[b"a", None, b"c",
                                                                           None]))
        assert refused.error_code == ErrorCode.invalid_record.value
        assert [(e.batch_index, "table-0" in e.message and "key" in e.message)
                for e in refused.record_errors] == [(1, True), (3, True)]
        assert "2 record(s) rejected" in refused.error_message
        assert (await describe(stub, "table")).log_end_offset == 0

    run_node(tmp_path, body)


def test_a_flipped_byte_is_corrupt_message_and_stores_nothing(tmp_path: Path) -> None:
    async def body(stub: log_pb2_grpc.LogServiceStub, service: LogService) -> None:
        await create(stub, "t", 0)
        await create(stub, "t", 1)
        corrupt = bytearray(build_batch(values(3)))
        corrupt[40] ^= 0x10
        response = await stub.Append(log_pb2.AppendRequest(partitions=[
            log_pb2.PartitionAppend(topic="t", partition=0,
                                    records=build_batch(values(2)) + bytes(corrupt)),
            log_pb2.PartitionAppend(topic="t", partition=1, records=build_batch(values(2))),
        ]))
        bad, good = response.results
        assert bad.error_code == ErrorCode.corrupt_message.value
        assert bad.error_message and bad.base_offset == -1
        assert (good.error_code, good.log_end_offset) == (0, 2)
        state = await describe(stub, "t", 0)
        assert (state.log_end_offset, state.size_bytes) == (0, 0)
        assert (await read(stub, "t", 0)).records == b""

    run_node(tmp_path, body)


def test_a_batch_over_max_message_bytes_is_too_large(tmp_path: Path) -> None:
    async def body(stub: log_pb2_grpc.LogServiceStub, service: LogService) -> None:
        await create(stub, "small", max_message_bytes="200")
        result = await append(stub, "small", build_batch(values(5, size=50)))
        assert result.error_code == ErrorCode.message_too_large.value
        assert (await describe(stub, "small")).log_end_offset == 0
        # The node default applies to topics without an override.
        await create(stub, "other")
        assert (await append(stub, "other", build_batch(values(5, size=50)))).error_code == (
            ErrorCode.message_too_large.value)
        assert (await append(stub, "small", build_batch(values(1)))).error_code == 0

    run_node(tmp_path, body, max_message_bytes=300)


def test_unknown_partitions_are_reported(tmp_path: Path) -> None:
    async def body(stub: log_pb2_grpc.LogServiceStub, service: LogService) -> None:
        await create(stub, "t", 0)
        unknown = ErrorCode.unknown_topic_or_partition.value
        assert (await append(stub, "t", build_batch(values(1)), partition=1)).error_code == unknown
        assert (await read(stub, "nope", 0)).error_code == unknown
        listed = await stub.ListOffsets(log_pb2.ListOffsetsRequest(partitions=[
            log_pb2.PartitionTimestamp(topic="nope", partition=0, timestamp=-1)]))
        assert [(r.error_code, r.offset) for r in listed.results] == [(unknown, -1)]
        assert (await describe(stub, "t", 7)).error_code == unknown
        everything = await stub.DescribePartitions(log_pb2.DescribePartitionsRequest())
        assert [(p.topic, p.partition) for p in everything.partitions] == [("t", 0)]
        deleted = await stub.DeletePartitions(log_pb2.DeletePartitionsRequest(partitions=[
            log_pb2.TopicPartition(topic="t", partition=0),
            log_pb2.TopicPartition(topic="never", partition=0),
        ]))
        assert [r.error_code for r in deleted.results] == [0, 0]
        assert (await read(stub, "t", 0)).error_code == unknown
        assert [p for p in (tmp_path / "data").iterdir() if p.is_dir()] == []

    run_node(tmp_path, body)


def test_offsets_out_of_range(tmp_path: Path) -> None:
    async def body(stub: log_pb2_grpc.LogServiceStub, service: LogService) -> None:
        await create(stub, "t")
        await append(stub, "t", build_batch(values(3)))
        at_end = await read(stub, "t", 3)
        assert (at_end.error_code, at_end.records, at_end.high_watermark) == (0, b"", 3)
        for offset in (4, -1):
            beyond = await read(stub, "t", offset)
            assert beyond.error_code == ErrorCode.offset_out_of_range.value
            assert (beyond.records, beyond.log_end_offset) == (b"", 3)

    run_node(tmp_path, body)


def test_the_request_byte_limit_spans_partitions(tmp_path: Path) -> None:
    batch = build_batch(values(2, size=100))

    async def body(stub: log_pb2_grpc.LogServiceStub, service: LogService) -> None:
        for partition in (0, 1, 2):
            await create(stub, "t", partition)
            for _ in range(3):
                await append(stub, "t", batch, partition=partition)

        async def read_all(request_max: int, partition_max: int) -> list[int]:
            response = await stub.Read(log_pb2.ReadRequest(
                max_bytes=request_max,
                limit=log_pb2.READ_LIMIT_HIGH_WATERMARK,
                partitions=[log_pb2.PartitionRead(topic="t", partition=p, offset=0,
                                                  max_bytes=partition_max) for p in (0, 1, 2)],
            ))
            return [len(r.records) // len(batch) for r in response.results]

        assert await read_all(0, 1 << 20) == [3, 3, 3]
        assert await read_all(len(batch) * 4, 1 << 20) == [3, 1, 0]
        # Only the first partition returning data may go over a limit, by one whole batch.
        assert await read_all(10, 1 << 20) == [1, 0, 0]
        assert await read_all(1 << 20, 10) == [1, 0, 0]

    run_node(tmp_path, body)


def test_a_reader_on_this_host_gets_ranges_of_segment_files(tmp_path: Path) -> None:
    """Named by local_reader, the node's own host key: each partition's batches come as a
    range of its segment file, decided exactly as the batches would be (limits included);
    any other key gets the batches themselves."""
    batch = build_batch(values(2, size=100))

    async def body(stub: log_pb2_grpc.LogServiceStub, service: LogService) -> None:
        for partition in (0, 1, 2):
            await create(stub, "t", partition)
            for _ in range(3):
                await append(stub, "t", batch, partition=partition)

        async def read_all(reader: str) -> list[log_pb2.PartitionReadResult]:
            response = await stub.Read(log_pb2.ReadRequest(
                max_bytes=len(batch) * 4, local_reader=reader,
                limit=log_pb2.READ_LIMIT_HIGH_WATERMARK,
                partitions=[log_pb2.PartitionRead(topic="t", partition=p, offset=o,
                                                  max_bytes=1 << 20)
                            for p, o in ((0, 2), (1, 0), (2, 0))]))
            return list(response.results)

        carried = await read_all("another-host/mnt:[1]")
        assert [len(r.records) // len(batch) for r in carried] == [2, 2, 0]
        assert not any(r.HasField("file_records") for r in carried)
        ranges = await read_all(local_host_key())
        reader = FileRecordsReader()
        for inline, named in zip(carried, ranges, strict=True):
            assert named.records == b""
            assert named.high_watermark == inline.high_watermark == 6
            if not inline.records:
                assert not named.HasField("file_records")
                continue
            files = named.file_records
            assert files.size == len(inline.records)
            assert Path(files.path).is_absolute() and files.path.endswith(".log")
            assert reader.read(files.path, files.inode, files.position,
                               files.size) == inline.records
        reader.close()

    run_node(tmp_path, body)


def spool_file(directory: Path, data: bytes) -> Path:
    """A frontend's spool file (services.frontend.records_spool) holding ``data``."""
    path = directory / f"kbroker-records-{os.getpid()}-{os.urandom(8).hex()}.spool"
    path.write_bytes(data)
    return path


def spooled(path: Path, position: int, size: int) -> log_pb2.FileRecords:
    return log_pb2.FileRecords(path=str(path), inode=os.stat(path).st_ino, position=position,
                               size=size)


async def append_spooled(stub: log_pb2_grpc.LogServiceStub, reader: str,
                         *partitions: log_pb2.PartitionAppend) -> log_pb2.AppendResponse:
    return await stub.Append(log_pb2.AppendRequest(local_reader=reader, partitions=partitions))


def test_an_append_reads_batches_named_in_a_spool_file_of_this_host(tmp_path: Path) -> None:
    """Ranges of a spool file, beside batches carried, are appended as if carried; from
    another host, or when one range cannot be read as named, nothing is appended and the
    answer says so."""
    first, second = build_batch(values(3, size=50)), build_batch(values(2, size=70))
    path = spool_file(tmp_path, b"\xff" * 10 + first + second)

    async def body(stub: log_pb2_grpc.LogServiceStub, service: LogService) -> None:
        await create(stub, "t", 0)
        await create(stub, "t", 1)
        both = (log_pb2.PartitionAppend(topic="t", partition=0,
                                        file_records=spooled(path, 10, len(first))),
                log_pb2.PartitionAppend(topic="t", partition=1, records=second))
        refused = await append_spooled(stub, "another-host/mnt:[1]", *both)
        assert refused.records_unreadable and not refused.results
        gone = spooled(path, 10 + len(first), len(second) + 1)  # past the file's end
        refused = await append_spooled(stub, local_host_key(), both[1], log_pb2.PartitionAppend(
            topic="t", partition=0, file_records=gone))
        assert refused.records_unreadable and not refused.results
        assert (await describe(stub, "t", 0)).log_end_offset == 0
        assert (await describe(stub, "t", 1)).log_end_offset == 0

        appended = await append_spooled(stub, local_host_key(), *both)
        assert not appended.records_unreadable
        assert [(r.error_code, r.base_offset) for r in appended.results] == [(0, 0), (0, 0)]
        stored = (await read(stub, "t", 0)).records
        assert spans(stored) == [(0, 2)]
        # Past what the log sets (base offset, length, leader epoch):
        assert stored[16:] == first[16:]
        assert (await read(stub, "t", 0, partition=1)).records[16:] == second[16:]

    run_node(tmp_path, body)


def test_a_node_not_reading_local_files_refuses_spooled_batches(tmp_path: Path) -> None:
    batch = build_batch(values(1, size=50))
    path = spool_file(tmp_path, batch)

    async def body(stub: log_pb2_grpc.LogServiceStub, service: LogService) -> None:
        await create(stub, "t", 0)
        refused = await append_spooled(stub, local_host_key(), log_pb2.PartitionAppend(
            topic="t", partition=0, file_records=spooled(path, 0, len(batch))))
        assert refused.records_unreadable and not refused.results
        assert (await describe(stub, "t", 0)).log_end_offset == 0

    run_node(tmp_path, body, local_files=False)


def test_log_append_time_is_stamped_by_the_node(tmp_path: Path) -> None:
    async def body(stub: log_pb2_grpc.LogServiceStub, service: LogService) -> None:
        await create(stub, "t", message_timestamp_type="LogAppendTime")
        before = int(time.time() * 1000)
        result = await append(stub, "t", build_batch(values(2), base_timestamp=5))
        assert before <= result.log_append_time_ms <= int(time.time() * 1000)
        [batch] = iter_batches((await read(stub, "t", 0)).records)
        assert batch.header.max_timestamp == result.log_append_time_ms

    run_node(tmp_path, body)


def test_a_restarted_node_serves_its_replicas(tmp_path: Path) -> None:
    async def write(stub: log_pb2_grpc.LogServiceStub, service: LogService) -> None:
        await create(stub, "t", segment_bytes="300")
        for _ in range(6):
            assert (await append(stub, "t", build_batch(values(3, size=20)))).error_code == 0

    async def check(stub: log_pb2_grpc.LogServiceStub, service: LogService) -> None:
        state = await describe(stub, "t")
        assert (state.log_end_offset, state.high_watermark) == (18, 18)
        assert state.segments > 1
        assert spans((await read(stub, "t", 16)).records) == [(15, 17)]
        assert (await append(stub, "t", build_batch(values(1)))).base_offset == 18
        channel = insecure_channel(f"127.0.0.1:{service.port}")
        try:
            answer = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service="kbroker.log.v1.LogService"))
        finally:
            await channel.close()
        assert answer.status == health_pb2.HealthCheckResponse.SERVING

    run_node(tmp_path, write)
    run_node(tmp_path, check)


class RecordingPurgatory(purgatory_pb2_grpc.PurgatoryServicer):
    """Only the progress reports, recording what it was told."""

    def __init__(self) -> None:
        self.positions: dict[str, int] = {}
        self.changed = asyncio.Event()
        self.streams = 0

    async def ReportProgress(self, request_iterator, context):
        self.streams += 1
        async for request in request_iterator:
            for key in request.keys:
                self.positions[key.key] = key.position
            self.changed.set()
        return purgatory_pb2.CheckAndCompleteResponse(completed=0)


def test_appends_notify_the_purgatory(tmp_path: Path) -> None:
    async def main() -> None:
        purgatory = RecordingPurgatory()
        server = grpc.aio.server()
        purgatory_pb2_grpc.add_PurgatoryServicer_to_server(purgatory, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            await notified(f"127.0.0.1:{port}", purgatory)
        finally:
            await server.stop(0)

    async def notified(address: str, purgatory: RecordingPurgatory) -> None:
        async def body(stub: log_pb2_grpc.LogServiceStub, service: LogService) -> None:
            await create(stub, "t", 0)
            await create(stub, "t", 1)
            for _ in range(5):
                await append(stub, "t", build_batch(values(2)), partition=0)
            await append(stub, "t", build_batch(values(3)), partition=1)
            while purgatory.positions != {"t-0": 10, "t-1": 3}:
                purgatory.changed.clear()
                await asyncio.wait_for(purgatory.changed.wait(), 10)
            # Every report travelled on one long-lived stream.
            assert purgatory.streams == 1

        config = LogConfig(data_dir=str(tmp_path / "data"), grpc_address="127.0.0.1:0",
                           purgatory_address=address)
        service = await start(config)
        channel = insecure_channel(f"127.0.0.1:{service.port}")
        try:
            await body(log_pb2_grpc.LogServiceStub(channel), service)
        finally:
            await channel.close()
            await service.stop(0)

    asyncio.run(asyncio.wait_for(main(), TIMEOUT))


def test_reports_resume_after_the_purgatory_restarts(tmp_path: Path) -> None:
    async def serve(port: int, purgatory: RecordingPurgatory) -> grpc.aio.Server:
        server = grpc.aio.server()
        purgatory_pb2_grpc.add_PurgatoryServicer_to_server(purgatory, server)
        assert server.add_insecure_port(f"127.0.0.1:{port}") == port
        await server.start()
        return server

    async def reported(purgatory: RecordingPurgatory, stub: log_pb2_grpc.LogServiceStub) -> None:
        """Append until ``purgatory`` hears of the latest high watermark (the first reports after
        a restart may go down with the old stream)."""
        deadline = time.monotonic() + 20
        while True:
            await append(stub, "t", build_batch(values(1)))
            high_watermark = await describe_end(stub)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(purgatory.changed.wait(), 0.5)
            purgatory.changed.clear()
            if purgatory.positions.get("t-0") == high_watermark:
                return
            assert time.monotonic() < deadline, (purgatory.positions, high_watermark)

    async def describe_end(stub: log_pb2_grpc.LogServiceStub) -> int:
        answer = await stub.DescribePartitions(log_pb2.DescribePartitionsRequest())
        return answer.partitions[0].high_watermark

    async def main() -> None:
        port = free_port()
        first = RecordingPurgatory()
        server = await serve(port, first)
        config = LogConfig(data_dir=str(tmp_path / "data"), grpc_address="127.0.0.1:0",
                           purgatory_address=f"127.0.0.1:{port}")
        service = await start(config)
        channel = insecure_channel(f"127.0.0.1:{service.port}")
        second = RecordingPurgatory()
        try:
            stub = log_pb2_grpc.LogServiceStub(channel)
            await create(stub, "t")
            await reported(first, stub)
            await server.stop(0)
            server = await serve(port, second)
            await reported(second, stub)
            assert second.streams == 1
        finally:
            await channel.close()
            await service.stop(0)
            await server.stop(0)

    asyncio.run(asyncio.wait_for(main(), TIMEOUT))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_an_unreachable_purgatory_never_fails_appends(tmp_path: Path) -> None:
    async def body(stub: log_pb2_grpc.LogServiceStub, service: LogService) -> None:
        await create(stub, "t")
        started = time.monotonic()
        for _ in range(20):
            assert (await append(stub, "t", build_batch(values(1)))).error_code == 0
        assert time.monotonic() - started < 5

    run_node(tmp_path, body, purgatory_address=f"127.0.0.1:{free_port()}")


@pytest.mark.processes
def test_the_module_runs_as_a_process(tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "KBROKER_DATA_DIR": str(tmp_path / "data")}
    process = subprocess.Popen(
        [sys.executable, "-m", "services.log", "--grpc-address", f"127.0.0.1:{port}",
         "--node-id", "3"],
        cwd=REPO, env=env, stderr=subprocess.PIPE, text=True,
    )
    try:
        async def ready() -> None:
            channel = insecure_channel(f"127.0.0.1:{port}")
            try:
                stub = log_pb2_grpc.LogServiceStub(channel)
                await stub.DescribePartitions(log_pb2.DescribePartitionsRequest(),
                                              wait_for_ready=True, timeout=30)
                await create(stub, "t")
                assert (await append(stub, "t", build_batch(values(2)))).log_end_offset == 2
            finally:
                await channel.close()

        asyncio.run(ready())
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
        assert process.returncode == 0, stderr
        assert "log node 3 serving" in stderr
        assert (tmp_path / "data" / "t-0" / f"{0:020d}.log").stat().st_size > 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_delete_records_and_config_updates(tmp_path: Path) -> None:
    async def body(stub: log_pb2_grpc.LogServiceStub, service: LogService) -> None:
        await create(stub, "t", segment_bytes="200")
        for _ in range(6):
            await append(stub, "t", build_batch(values(2, size=20), base_timestamp=1000))
        response = await stub.DeleteRecords(log_pb2.DeleteRecordsRequest(partitions=[
            log_pb2.PartitionDeleteRecords(topic="t", partition=0, offset=5),
            log_pb2.PartitionDeleteRecords(topic="t", partition=0, offset=99),
            log_pb2.PartitionDeleteRecords(topic="nope", partition=0, offset=1),
        ]))
        assert [(r.error_code, r.low_watermark) for r in response.results] == [
            (0, 5), (ErrorCode.offset_out_of_range.value, -1),
            (ErrorCode.unknown_topic_or_partition.value, -1),
        ]
        below = await read(stub, "t", 3)
        assert (below.error_code, below.log_start_offset) == (
            ErrorCode.offset_out_of_range.value, 5)
        segments = (await describe(stub, "t")).segments

        # Retention configured afterwards applies without a restart.
        updated = await stub.UpdatePartitionConfigs(log_pb2.UpdatePartitionConfigsRequest(
            partitions=[log_pb2.PartitionSpec(topic="t", partition=0,
                                              configs={"segment.bytes": "200",
                                                       "retention.ms": "1000"}),
                        log_pb2.PartitionSpec(topic="t", partition=0,
                                              configs={"retention.ms": "soon"}),
                        log_pb2.PartitionSpec(topic="nope", partition=0)]))
        assert [r.error_code for r in updated.results] == [
            0, ErrorCode.invalid_config.value, ErrorCode.unknown_topic_or_partition.value]
        assert await service.manager.enforce_retention() > 0
        state = await describe(stub, "t")
        assert state.segments == 1 < segments
        assert state.log_start_offset == state.log_end_offset - 2

    run_node(tmp_path, body)
