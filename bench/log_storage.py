"""Log storage throughput, side by side with the raw disk (not a test).

    python bench/log_storage.py [--dir PATH] [--mib 2048] [--block-kib 1024]

Measures, in one run and on the same file system (``--dir``), with the same block size:

1. raw sequential write and read of ``--mib`` MiB in blocks of ``--block-kib`` KiB with plain
   ``os.write``/``os.read``;
2. the log service alone: a log node in its own process, appends of record batches of the block
   size from a gRPC client (``LogService.Append``, one batch per call, a few calls in flight),
   then sequential reads of everything back (``LogService.Read``, one block per call);
3. end to end: a local cluster (one process per service), confluent-kafka producing the same
   amount of 1 KB records (acks=1, batches of the block size) through the frontend and consuming
   it back;
4. the cost of locating an offset (offset index lookup plus header walk) in segments of
   growing size.

Writes are reported twice: into the page cache (what the call returns after; the log node
relies on the page cache as Kafka does), and carried to the disk (the same, timed until an
``fdatasync`` of the written files returns). The second is the disk's speed; the first is the
memory's until the kernel's dirty-page limit throttles writers, which is why the default volume
is larger than that limit on small machines. Reads come from the page cache. Each number is
printed with its ratio to the raw number of the same kind (target: append >= 0.7x raw write).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "proto" / "gen"))

from kbroker.log.v1 import log_pb2, log_pb2_grpc  # noqa: E402
from services.common.channels import insecure_channel  # noqa: E402
from services.common.records.record import build_batch  # noqa: E402
from services.common.records.record_batch import (  # noqa: E402
    HEADER_SIZE,
    batches_end,
    set_base_offset,
)
from services.local_cluster import ClusterSpec, LocalCluster, free_port  # noqa: E402
from services.log.segment import LogSegment  # noqa: E402

MIB = 1024 * 1024
IN_FLIGHT = 4


def batch_of(size: int, records: int = 16) -> bytes:
    """A valid v2 batch of about ``size`` bytes: ``records`` records of equal values."""
    value_size = max((size - HEADER_SIZE) // records - 12, 1)
    return build_batch([(None, bytes([65 + i % 26]) * value_size) for i in range(records)],
                       1_700_000_000_000)


def raw_disk(directory: Path, total: int, block: int) -> dict[str, float]:
    """Plain ``os.write``/``os.read`` of ``total`` bytes in ``block``-sized calls: the write
    into the page cache alone, the same write carried to the disk (``fdatasync`` at the end,
    timed with it), and the read back."""
    path = directory / "raw.bin"
    data = os.urandom(block)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    started = time.perf_counter()
    for _ in range(total // block):
        os.write(fd, data)
    cached_s = time.perf_counter() - started
    os.fdatasync(fd)
    synced_s = time.perf_counter() - started
    os.close(fd)
    fd = os.open(path, os.O_RDONLY)
    started = time.perf_counter()
    while os.read(fd, block):
        pass
    read_s = time.perf_counter() - started
    os.close(fd)
    path.unlink()
    return {"write": total / cached_s / MIB, "write_synced": total / synced_s / MIB,
            "read": total / read_s / MIB}


def sync_tree(directory: Path) -> None:
    """``fdatasync`` every segment file under ``directory``: carries what a service wrote
    into the page cache to the disk, as the raw measurement's final ``fdatasync`` does."""
    for path in directory.rglob("*.log"):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
        finally:
            os.close(fd)


def start_log_node(directory: Path, block: int) -> tuple[subprocess.Popen[bytes], int]:
    """A log node in a process of its own, as it runs in a cluster."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.log", "--grpc-address", f"127.0.0.1:{port}",
         "--data-dir", str(directory), "--max-message-bytes", str(block * 2)],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**os.environ, "KBROKER_LOG_LEVEL": "WARNING"},
    )
    return proc, port


async def log_service(directory: Path, total: int, block: int) -> dict[str, float]:
    proc, port = start_log_node(directory / "log", block)
    channel = insecure_channel(f"127.0.0.1:{port}")
    try:
        await asyncio.wait_for(channel.channel_ready(), 30)
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
        sync_tree(directory / "log")
        synced_s = time.perf_counter() - started
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
            offset = batches_end(records) or 0
        read_s = time.perf_counter() - started
        return {"write": written / append_s / MIB, "write_synced": written / synced_s / MIB,
                "read": read_bytes / read_s / MIB}
    finally:
        await channel.close()
        proc.terminate()
        proc.wait(10)


def end_to_end(directory: Path, total: int, block: int) -> dict[str, float]:
    """Produce ``total`` bytes through the frontend with confluent-kafka (acks=1, batches of
    about ``block`` bytes, one partition), then consume them back, on a local cluster of one
    of each service. Runs the client in a process of its own."""
    cluster = LocalCluster(ClusterSpec(data_dir=directory / "cluster", kafka_port=0,
                                       base_port=0, handlers=1, log_nodes=1,
                                       log_level="WARNING"))
    cluster.start()
    try:
        out = subprocess.run(
            [sys.executable, "-c", E2E_CLIENT, cluster.bootstrap, str(total), str(block)],
            cwd=ROOT, capture_output=True, text=True, timeout=600, check=True,
        ).stdout
        result = json.loads(out.strip().splitlines()[-1])
        started = time.perf_counter()
        sync_tree(directory / "cluster")
        result["sync_s"] = time.perf_counter() - started
    finally:
        cluster.stop()
    written = result["bytes"]
    return {"write": written / result["produce_s"] / MIB,
            "write_synced": written / (result["produce_s"] + result["sync_s"]) / MIB,
            "read": written / result["consume_s"] / MIB}


E2E_CLIENT = r"""
import json, sys, time
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
bootstrap, total, block = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
admin = AdminClient({"bootstrap.servers": bootstrap})
admin.create_topics([NewTopic("e2e", 1, 1)])["e2e"].result(30)
value = b"v" * 1000
count = total // (len(value) + 70)
producer = Producer({"bootstrap.servers": bootstrap, "acks": 1, "linger.ms": 20,
                     "batch.size": block, "message.max.bytes": 2 * block,
                     "queue.buffering.max.kbytes": 1048576, "compression.type": "none"})
started = time.perf_counter()
for i in range(count):
    while True:
        try:
            producer.produce("e2e", value, partition=0)
            break
        except BufferError:
            producer.poll(0.01)
producer.flush(300)
produce_s = time.perf_counter() - started
consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused",
                     "enable.auto.commit": False, "fetch.max.bytes": 4 * block,
                     "max.partition.fetch.bytes": 4 * block})
consumer.assign([TopicPartition("e2e", 0, 0)])
seen, started = 0, time.perf_counter()
while seen < count and time.perf_counter() - started < 300:
    # No more than are left: a batch call waits out its timeout for a batch it cannot fill.
    for message in consumer.consume(min(10000, count - seen), 1.0):
        if message.error() is None:
            seen += 1
consume_s = time.perf_counter() - started
consumer.close()
assert seen == count, (seen, count)
print(json.dumps({"bytes": count * len(value), "produce_s": produce_s, "consume_s": consume_s}))
"""


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
            set_base_offset(batch, 0, i * 4)
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
    parser.add_argument("--mib", type=int, default=2048)
    parser.add_argument("--block-kib", type=int, default=1024)
    args = parser.parse_args()
    total, block = args.mib * MIB, args.block_kib * 1024
    with tempfile.TemporaryDirectory(prefix="kbroker-bench-", dir=args.dir) as tmp:
        directory = Path(tmp)
        raw = raw_disk(directory, total, block)
        service = asyncio.run(log_service(directory, total, block))
        e2e = end_to_end(directory, total, block)
        print(f"{args.mib} MiB in {args.block_kib} KiB blocks under {Path(args.dir).resolve()}")
        print(f"{'':40}{'MiB/s':>9}  ratio to raw")
        rows = (("write, to the page cache", "write"),
                ("write, carried to disk", "write_synced"), ("read", "read"))
        for label, key in rows:
            print(f"{'raw ' + label:40}{raw[key]:9.1f}")
        for name, numbers in (("log service", service), ("end to end", e2e)):
            for label, key in rows:
                print(f"{name + ' ' + label:40}{numbers[key]:9.1f}  "
                      f"{numbers[key] / raw[key]:.2f}x")
        print("(target: append >= 0.70x raw write)")
        print("offset lookup (index.interval.bytes 4096, 1 KiB batches):")
        for mib, count, micros in index_lookups(directory):
            print(f"  segment {mib:4d} MiB ({count:7d} batches): {micros:6.1f} us/lookup")


if __name__ == "__main__":
    main()
