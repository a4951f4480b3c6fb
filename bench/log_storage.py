"""Log storage throughput, side by side with the raw disk (not a test).

    python bench/log_storage.py [--dir PATH] [--mib 256] [--block-kib 1024]

Measures, in one run and on the same file system (``--dir``):

1. raw sequential write and read of ``--mib`` MiB in blocks of ``--block-kib`` KiB (plain
   ``os.write``/``os.read``, no fsync: the log node relies on the page cache too);
2. appends of record batches of the same block size from a gRPC client to one log node
   (``LogService.Append``, one batch per call, a few calls in flight), and sequential reads of
   everything back (``LogService.Read``, one block per call);
3. the cost of locating an offset (offset index lookup plus header walk) in segments of
   growing size.

Throughputs are printed with their ratio to the raw numbers (target: append >= 0.7x raw write).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import struct
import sys
import tempfile
import time
from pathlib import Path

from crc32c import crc32c

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "proto" / "gen"))

from kbroker.log.v1 import log_pb2, log_pb2_grpc
from services.common.channels import insecure_channel
from services.log.config import LogConfig
from services.log.segment import LogSegment
from services.log.server import start

MIB = 1024 * 1024
IN_FLIGHT = 4


def batch_of(size: int, records: int = 16) -> bytes:
    """A valid v2 batch of about ``size`` bytes: ``records`` records of equal values."""
    value_size = max((size - 61) // records - 12, 1)
    body = b""
    for i in range(records):
        value = bytes([65 + i % 26]) * value_size
        rec = (b"\x00" + _varint(0) + _varint(i) + _varint(-1) + _varint(len(value)) + value
               + _varint(0))
        body += _varint(len(rec)) + rec
    after_crc = struct.pack(">hiqqqhii", 0, records - 1, 1_700_000_000_000,
                            1_700_000_000_000, -1, -1, -1, records) + body
    head = struct.pack(">qiib", 0, len(after_crc) + 9, -1, 2)
    return head + struct.pack(">I", crc32c(after_crc)) + after_crc


def _varint(value: int) -> bytes:
    encoded = (value << 1) ^ (value >> 63)
    out = bytearray()
    while True:
        byte = encoded & 0x7F
        encoded >>= 7
        if encoded:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def raw_disk(directory: Path, total: int, block: int) -> tuple[float, float]:
    path = directory / "raw.bin"
    data = os.urandom(block)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    started = time.perf_counter()
    for _ in range(total // block):
        os.write(fd, data)
    write_s = time.perf_counter() - started
    os.close(fd)
    fd = os.open(path, os.O_RDONLY)
    started = time.perf_counter()
    while os.read(fd, block):
        pass
    read_s = time.perf_counter() - started
    os.close(fd)
    path.unlink()
    return total / write_s / MIB, total / read_s / MIB


async def log_service(directory: Path, total: int, block: int) -> tuple[float, float]:
    node = await start(LogConfig(data_dir=str(directory / "log"), grpc_address="127.0.0.1:0",
                                 max_message_bytes=block * 2))
    channel = insecure_channel(f"127.0.0.1:{node.port}")
    try:
        stub = log_pb2_grpc.LogServiceStub(channel)
        await stub.CreatePartitions(log_pb2.CreatePartitionsRequest(partitions=[
            log_pb2.PartitionSpec(topic="bench", partition=0)]))
        batch = batch_of(block)
        count = total // len(batch)
        request = log_pb2.AppendRequest(partitions=[
            log_pb2.PartitionAppend(topic="bench", partition=0, records=batch)])
        remaining = count

        async def appender() -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                response = await stub.Append(request)
                assert response.results[0].error_code == 0, response

        started = time.perf_counter()
        await asyncio.gather(*(appender() for _ in range(IN_FLIGHT)))
        append_s = time.perf_counter() - started
        written = count * len(batch)

        offset, read_bytes = 0, 0
        started = time.perf_counter()
        while read_bytes < written:
            response = await stub.Read(log_pb2.ReadRequest(partitions=[
                log_pb2.PartitionRead(topic="bench", partition=0, offset=offset,
                                      max_bytes=block)]))
            result = response.results[0]
            records = result.records
            assert result.error_code == 0 and records, result.error_code
            read_bytes += len(records)
            # The next offset: after the last batch returned (its header says where).
            last = _last_batch_end(records)
            offset = last
        read_s = time.perf_counter() - started
        return written / append_s / MIB, read_bytes / read_s / MIB
    finally:
        await channel.close()
        await node.stop(0)


def _last_batch_end(records: bytes) -> int:
    position, next_offset = 0, 0
    while position + 61 <= len(records):
        base, length = struct.unpack_from(">qi", records, position)
        delta = struct.unpack_from(">i", records, position + 23)[0]
        next_offset = base + delta + 1
        position += length + 12
    return next_offset


def index_lookups(directory: Path) -> list[tuple[int, int, float]]:
    """(segment MiB, batches, microseconds per lookup) for segments of growing size."""
    results = []
    batch = bytearray(batch_of(1024, records=4))
    for mib in (1, 16, 128):
        segment_dir = directory / f"seg{mib}"
        segment_dir.mkdir()
        segment = LogSegment.create(segment_dir, 0, 4096)
        count = mib * MIB // len(batch)
        chunk = bytearray()
        offsets = []
        for i in range(count):
            struct.pack_into(">q", batch, 0, i * 4)
            chunk += batch
            offsets.append(i * 4)
            if len(chunk) >= MIB:
                segment.append(chunk, range(0, len(chunk), len(batch)))
                chunk = bytearray()
        if chunk:
            segment.append(chunk, range(0, len(chunk), len(batch)))
        targets = [random.randrange(0, count * 4) for _ in range(20_000)]
        started = time.perf_counter()
        for target in targets:
            found = segment.find_batch(target)
            assert found is not None and found.header.base_offset <= target
        elapsed = time.perf_counter() - started
        results.append((mib, count, elapsed / len(targets) * 1e6))
        segment.close()
        shutil.rmtree(segment_dir)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=".", help="where to write (the disk under test)")
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--block-kib", type=int, default=1024)
    args = parser.parse_args()
    total, block = args.mib * MIB, args.block_kib * 1024
    with tempfile.TemporaryDirectory(prefix="kbroker-bench-", dir=args.dir) as tmp:
        directory = Path(tmp)
        raw_write, raw_read = raw_disk(directory, total, block)
        append, read = asyncio.run(log_service(directory, total, block))
        print(f"{args.mib} MiB in {args.block_kib} KiB blocks under {Path(args.dir).resolve()}")
        print(f"raw write   {raw_write:9.1f} MiB/s")
        print(f"raw read    {raw_read:9.1f} MiB/s")
        print(f"log append  {append:9.1f} MiB/s  = {append / raw_write:.2f}x raw write "
              f"(target >= 0.70x)")
        print(f"log read    {read:9.1f} MiB/s  = {read / raw_read:.2f}x raw read")
        print("offset lookup (index.interval.bytes 4096, 1 KiB batches):")
        for mib, count, micros in index_lookups(directory):
            print(f"  segment {mib:4d} MiB ({count:7d} batches): {micros:6.1f} us/lookup")


if __name__ == "__main__":
    main()
