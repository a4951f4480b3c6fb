"""The load of bench/scale.py: Kafka producers and fetchers speaking the wire protocol
themselves (asyncio, one request in flight per connection), so that the client costs next to
nothing per request and a thousand connections fit in one process beside the brokers.

    python bench/scale_client.py BOOTSTRAP TOPIC --producers N --seconds S
                                 [--size 1000] [--records 256] [--fetch] [--acks 1]

Each producer opens one connection to the leader of each partition it writes (from a Metadata
request) and sends, one after the other, a Produce request (v8) with one record batch per
partition: ``--records`` records of SIZE bytes in all, spread over the partitions of that
leader (at least one per partition). The batches are built once and sent again and again (the
broker assigns offsets; a batch without producer id is appended each time). With
``--producers`` at most the topic's partitions, producers share the partitions out (each writes
its own); with more, producer i writes partition i mod P only, one connection each.

Prints a JSON line ``{"running": ...}`` once every connection is open and has been answered,
and at the end one with produced MB/s, requests, errors and request latency p50/p99/max; with
``--fetch`` then reads everything back (Fetch v11, one connection per leader, each asking for
all its partitions from where the last answer ended), with fetched MB/s and the fetch request
latency percentiles. With ``--operations`` it produces nothing: it times Metadata of every
topic, then FindCoordinator, OffsetCommit (every partition of TOPIC) and OffsetFetch for each
of ``--groups`` groups.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import io
import json
import socket
import struct
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from kio.schema.fetch.v11.request import FetchPartition, FetchRequest, FetchTopic
from kio.schema.find_coordinator.v1.request import FindCoordinatorRequest
from kio.schema.find_coordinator.v1.response import FindCoordinatorResponse
from kio.schema.metadata.v1.request import MetadataRequest, MetadataRequestTopic
from kio.schema.metadata.v1.response import MetadataResponse
from kio.schema.offset_commit.v2.request import (
    OffsetCommitRequest,
    OffsetCommitRequestPartition,
    OffsetCommitRequestTopic,
)
from kio.schema.offset_commit.v2.response import OffsetCommitResponse
from kio.schema.offset_fetch.v1.request import OffsetFetchRequest, OffsetFetchRequestTopic
from kio.schema.offset_fetch.v1.response import OffsetFetchResponse
from kio.schema.produce.v8.request import PartitionProduceData, ProduceRequest, TopicProduceData
from kio.schema.produce.v8.response import ProduceResponse
from kio.schema.request_header.v1.header import RequestHeader
from kio.schema.response_header.v0.header import ResponseHeader
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i16, i32, i64

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from services.common.runtime import tune_allocator  # noqa: E402
from tests.record_batches import build_batch  # noqa: E402

_HEADER = entity_writer(RequestHeader)
_READ_HEADER = entity_reader(ResponseHeader)
# A fetcher's max_bytes (librdkafka's default fetch.max.bytes).
FETCH_MAX_BYTES = 50 * 2**20


def frame(request: object, correlation_id: int = 0) -> bytearray:
    """A whole request frame; its correlation id (bytes 8-12) may be rewritten in place."""
    cls = type(request)
    out = io.BytesIO()
    _HEADER(out, RequestHeader(request_api_key=cls.__api_key__,  # type: ignore[attr-defined]
                               request_api_version=cls.__version__,  # type: ignore[attr-defined]
                               correlation_id=i32(correlation_id), client_id="scale"))
    entity_writer(cls)(out, request)
    body = out.getvalue()
    return bytearray(struct.pack(">i", len(body)) + body)


class Connection:
    """One Kafka connection on a non-blocking socket, driven by the event loop's socket calls.
    Each answer is read into one buffer the connection keeps and reuses: a buffer per answer
    (a stream reader's) costs the client fresh memory for every large Fetch answer, and on a
    virtual machine that returns freed memory to its host (see bench/page_cache.py) that cost
    held the fetchers of a 1,000-partition topic, answered about 50 MB at a time, to half the
    rate they reach this way (docs/performance.md, "The load's reading of large answers")."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.correlation = 0
        self._buffer = bytearray(4096)

    @classmethod
    async def open(cls, host: str, port: int) -> Connection:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            await asyncio.get_running_loop().sock_connect(sock, (host, port))
        except BaseException:
            sock.close()
            raise
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return cls(sock)

    async def call(self, request: bytearray) -> memoryview:
        """Send ``request`` (its correlation id renumbered) and return the response body after
        its header: a view of the connection's buffer, good until its next call."""
        loop = asyncio.get_running_loop()
        self.correlation += 1
        struct.pack_into(">i", request, 8, self.correlation)
        await loop.sock_sendall(self.sock, request)
        size = struct.unpack(">i", await self._read(4))[0]
        body = await self._read(size)
        header, used = _READ_HEADER(body, 0)
        if header.correlation_id != self.correlation:
            raise RuntimeError("correlation id mismatch")
        return body[used:]

    async def _read(self, size: int) -> memoryview:
        """The next ``size`` bytes of the connection, read into the start of its buffer (a
        larger one replaces it when needed: the views handed out of the old one stay valid)."""
        if size > len(self._buffer):
            self.reserve(max(size, 2 * len(self._buffer)))
        view = memoryview(self._buffer)[:size]
        loop = asyncio.get_running_loop()
        got = 0
        while got < size:
            n = await loop.sock_recv_into(self.sock, view[got:])
            if n == 0:
                raise ConnectionError("the broker closed the connection")
            got += n
        return view.toreadonly()

    def reserve(self, size: int) -> None:
        """Make the buffer hold answers of ``size`` bytes now, its pages touched: a client's
        set-up, kept out of the round trips timed later."""
        if size > len(self._buffer):
            self._buffer = bytearray(size)

    def close(self) -> None:
        self.sock.close()


async def leaders(bootstrap: str, topic: str) -> tuple[dict[int, tuple[str, int]],
                                                        dict[int, int]]:
    """(broker id -> address, partition -> leader id) of ``topic``, once every partition has
    a leader."""
    host, port = bootstrap.rsplit(":", 1)
    conn = await Connection.open(host, int(port))
    try:
        for _ in range(100):
            body = await conn.call(frame(MetadataRequest(
                topics=(MetadataRequestTopic(name=topic),))))
            answer, _ = entity_reader(MetadataResponse)(body, 0)
            brokers = {b.node_id: (b.host, b.port) for b in answer.brokers}
            found = {p.partition_index: p.leader_id for t in answer.topics if t.name == topic
                     for p in t.partitions if p.leader_id >= 0 and p.error_code == 0}
            if found and all(t.partitions and len(found) == len(t.partitions)
                             for t in answer.topics if t.name == topic):
                return brokers, found
            await asyncio.sleep(0.2)
    finally:
        conn.close()
    raise RuntimeError(f"{topic}: partitions without a leader")


def percentiles(times: list[float], prefix: str) -> dict[str, float]:
    times = sorted(times) or [0.0]
    return {f"{prefix}_p50_ms": round(times[len(times) // 2], 2),
            f"{prefix}_p99_ms": round(times[min(int(len(times) * 0.99), len(times) - 1)], 2),
            f"{prefix}_max_ms": round(times[-1], 2)}


def produce_request(topic: str, partitions: list[int], records: int, size: int,
                    acks: int) -> tuple[bytearray, int]:
    """The Produce request writing ``records`` records in all over ``partitions``, and its
    record bytes."""
    each = max(records // len(partitions), 1)
    batch = build_batch([b"x" * size] * each, keys=[str(i).encode() for i in range(each)])
    request = ProduceRequest(acks=i16(acks), timeout=datetime.timedelta(seconds=30),
                             topic_data=(TopicProduceData(name=topic, partition_data=tuple(
                                 PartitionProduceData(index=i32(p), records=batch)
                                 for p in partitions)),))
    return frame(request), each * len(partitions) * size


async def produce(args: argparse.Namespace, brokers: dict[int, tuple[str, int]],
                  leader_of: dict[int, int]) -> dict[str, object]:
    partitions = sorted(leader_of)
    plans: list[list[tuple[int, list[int]]]] = []  # per producer: (leader, its partitions)
    for i in range(args.producers):
        if args.producers <= len(partitions):
            mine = partitions[i::args.producers]
        else:
            mine = [partitions[i % len(partitions)]]
        by_leader: dict[int, list[int]] = {}
        for p in mine:
            by_leader.setdefault(leader_of[p], []).append(p)
        plans.append(sorted(by_leader.items()))
    connections: list[tuple[Connection, bytearray, int]] = []
    for plan in plans:
        for leader, mine in plan:
            request, size = produce_request(args.topic, mine, args.records, args.size, args.acks)
            conn = await Connection.open(*brokers[leader])
            connections.append((conn, request, size))
    # Every connection answered once before the clock starts.
    await asyncio.gather(*(conn.call(request) for conn, request, _ in connections))
    print(json.dumps({"running": len(connections)}), flush=True)
    reader = entity_reader(ProduceResponse)
    times: list[float] = []
    totals = {"bytes": 0, "requests": 0, "errors": 0}
    deadline = time.perf_counter() + args.seconds

    async def run(conn: Connection, request: bytearray, size: int) -> None:
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            body = await conn.call(request)
            times.append((time.perf_counter() - started) * 1000)
            answer, _ = reader(body, 0)
            failed = sum(1 for t in answer.responses for p in t.partition_responses
                         if p.error_code != 0)
            totals["errors"] += failed
            totals["requests"] += 1
            if not failed:
                totals["bytes"] += size

    started = time.perf_counter()
    await asyncio.gather(*(run(*c) for c in connections))
    elapsed = time.perf_counter() - started
    for conn, _, _ in connections:
        conn.close()
    return {"produce_MBps": round(totals["bytes"] / 1e6 / elapsed, 1),
            "produced_bytes": totals["bytes"],
            "produce_requests": totals["requests"], "produce_errors": totals["errors"],
            "connections": len(connections), **percentiles(times, "produce")}


def next_offset(records: bytes | memoryview, current: int) -> tuple[int, int]:
    """The offset after the last whole batch in ``records``, and the records read."""
    position, count = 0, 0
    while position + 61 <= len(records):
        base, length = struct.unpack_from(">qi", records, position)
        end = position + 12 + length
        if end > len(records):
            break
        last_delta = struct.unpack_from(">i", records, position + 23)[0]
        count += struct.unpack_from(">i", records, position + 57)[0]
        current = base + last_delta + 1
        position = end
    return current, count


_FETCH_HEAD = struct.Struct(">ihi")  # throttle_time_ms, error_code, session_id
_PARTITION_HEAD = struct.Struct(">ihqqq")  # index, error, high watermark, LSO, log start
_COUNT = struct.Struct(">i")
_ABORTED_SIZE = 16  # producer_id, first_offset


def fetched_records(body: memoryview) -> Iterator[tuple[int, memoryview]]:
    """Each partition of a Fetch v11 answer and its records, as views of ``body``: read with
    ``struct`` rather than kio, which copies every partition's records out of the answer (50
    MB an answer at 1,000 partitions, a large part of this client's time)."""
    position = _FETCH_HEAD.size
    (topics,) = _COUNT.unpack_from(body, position)
    position += 4
    for _ in range(topics):
        (name_length,) = struct.unpack_from(">h", body, position)
        position += 2 + name_length
        (partitions,) = _COUNT.unpack_from(body, position)
        position += 4
        for _ in range(partitions):
            index = _PARTITION_HEAD.unpack_from(body, position)[0]
            position += _PARTITION_HEAD.size
            (aborted,) = _COUNT.unpack_from(body, position)
            position += 4 + max(aborted, 0) * _ABORTED_SIZE + 4  # and preferred_read_replica
            (size,) = _COUNT.unpack_from(body, position)
            position += 4
            if size > 0:
                yield index, body[position:position + size]
                position += size


async def fetch(args: argparse.Namespace, brokers: dict[int, tuple[str, int]],
                leader_of: dict[int, int], expected_bytes: int) -> dict[str, object]:
    by_leader: dict[int, list[int]] = {}
    for p, leader in leader_of.items():
        by_leader.setdefault(leader, []).append(p)
    times: list[float] = []
    totals = {"bytes": 0, "records": 0}
    deadline = time.perf_counter() + args.fetch_seconds
    connections = {leader: await Connection.open(*brokers[leader]) for leader in by_leader}
    for conn in connections.values():
        conn.reserve(FETCH_MAX_BYTES + 2**20)  # an answer's headers besides its batches

    async def run(conn: Connection, mine: list[int]) -> None:
        offsets = dict.fromkeys(mine, 0)
        try:
            while time.perf_counter() < deadline and totals["bytes"] < expected_bytes:
                request = frame(FetchRequest(
                    max_wait=datetime.timedelta(milliseconds=100), min_bytes=i32(1),
                    max_bytes=i32(FETCH_MAX_BYTES), session_id=i32(0), session_epoch=i32(-1),
                    topics=(FetchTopic(topic=args.topic, partitions=tuple(
                        FetchPartition(partition=i32(p), fetch_offset=i64(offsets[p]),
                                       partition_max_bytes=i32(2**20)) for p in mine)),),
                    forgotten_topics_data=()))
                started = time.perf_counter()
                body = await conn.call(request)
                times.append((time.perf_counter() - started) * 1000)
                moved = False
                for index, records in fetched_records(body):
                    offsets[index], count = next_offset(records, offsets[index])
                    totals["records"] += count
                    totals["bytes"] += count * args.size
                    moved = moved or count > 0
                if not moved and totals["bytes"] >= expected_bytes:
                    break
        finally:
            conn.close()

    started = time.perf_counter()
    await asyncio.gather(*(run(connections[leader], mine)
                           for leader, mine in by_leader.items()))
    elapsed = time.perf_counter() - started
    return {"fetch_MBps": round(totals["bytes"] / 1e6 / elapsed, 1),
            "fetched_records": totals["records"], **percentiles(times, "fetch")}


async def operations(args: argparse.Namespace) -> dict[str, object]:
    """Metadata of every topic, ``--metadata`` times; FindCoordinator for each of
    ``--groups`` groups, one after the other; then each group's OffsetCommit (every partition
    of TOPIC, as a consumer group without members commits) and OffsetFetch, the groups
    concurrently (a connection each to its coordinator). Latency percentiles of each."""
    host, port = args.bootstrap.rsplit(":", 1)
    conn = await Connection.open(host, int(port))
    metadata: list[float] = []
    partitions: list[int] = []
    for _ in range(args.metadata):
        started = time.perf_counter()
        body = await conn.call(frame(MetadataRequest(topics=None)))
        metadata.append((time.perf_counter() - started) * 1000)
        answer, _ = entity_reader(MetadataResponse)(body, 0)
        partitions = [p.partition_index for t in answer.topics if t.name == args.topic
                      for p in t.partitions]
    total = 0
    if args.metadata:
        total = sum(len(t.partitions) for t in answer.topics)
    times: dict[str, list[float]] = {"find_coordinator": [], "offset_commit": [],
                                     "offset_fetch": []}
    errors = [0]

    # The first lookup on a fresh cluster creates the offsets topic: not timed.
    await conn.call(frame(FindCoordinatorRequest(key="scale-warm")))
    coordinators: dict[int, tuple[str, int]] = {}
    for number in range(args.groups):  # one at a time, on one connection
        started = time.perf_counter()
        body = await conn.call(frame(FindCoordinatorRequest(key=f"scale-group-{number}")))
        times["find_coordinator"].append((time.perf_counter() - started) * 1000)
        found, _ = entity_reader(FindCoordinatorResponse)(body, 0)
        if found.error_code != 0:
            errors[0] += 1
        else:
            coordinators[number] = (found.host, found.port)
    conn.close()

    async def group(number: int) -> None:
        name = f"scale-group-{number}"
        if number not in coordinators:
            return
        coordinator = await Connection.open(*coordinators[number])
        try:
            started = time.perf_counter()
            body = await coordinator.call(frame(OffsetCommitRequest(
                group_id=name, member_id="", topics=(OffsetCommitRequestTopic(
                    name=args.topic, partitions=tuple(OffsetCommitRequestPartition(
                        partition_index=i32(p), committed_offset=i64(number),
                        committed_metadata="") for p in partitions)),))))
            times["offset_commit"].append((time.perf_counter() - started) * 1000)
            committed, _ = entity_reader(OffsetCommitResponse)(body, 0)
            errors[0] += sum(1 for t in committed.topics for p in t.partitions
                             if p.error_code != 0)
            started = time.perf_counter()
            body = await coordinator.call(frame(OffsetFetchRequest(
                group_id=name, topics=(OffsetFetchRequestTopic(
                    name=args.topic, partition_indexes=tuple(i32(p) for p in partitions)),))))
            times["offset_fetch"].append((time.perf_counter() - started) * 1000)
            fetched, _ = entity_reader(OffsetFetchResponse)(body, 0)
            errors[0] += sum(1 for t in fetched.topics for p in t.partitions
                             if p.error_code != 0 or p.committed_offset != number)
        finally:
            coordinator.close()

    # The groups' commits and fetches run concurrently, a connection each.
    started = time.perf_counter()
    await asyncio.gather(*(group(n) for n in range(args.groups)))
    elapsed = time.perf_counter() - started
    out: dict[str, object] = {"partitions_in_cluster": total, "groups": args.groups,
                              "group_errors": errors[0],
                              "groups_seconds": round(elapsed, 2),
                              **percentiles(metadata, "metadata")}
    for name, values in times.items():
        out.update(percentiles(values, name))
    return out


async def idle(args: argparse.Namespace) -> dict[str, object]:
    """``--producers`` connections to the bootstrap broker, each answered one Metadata
    request, then left idle for SECONDS."""
    host, port = args.bootstrap.rsplit(":", 1)
    connections = []
    for _ in range(args.producers):
        conn = await Connection.open(host, int(port))
        await conn.call(frame(MetadataRequest(topics=(MetadataRequestTopic(name=args.topic),))))
        connections.append(conn)
    print(json.dumps({"running": len(connections)}), flush=True)
    await asyncio.sleep(args.seconds)
    for conn in connections:
        conn.close()
    return {"idle_connections": len(connections)}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bootstrap")
    parser.add_argument("topic")
    parser.add_argument("--producers", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--size", type=int, default=1000)
    parser.add_argument("--records", type=int, default=256)
    parser.add_argument("--acks", type=int, default=1)
    parser.add_argument("--fetch", action="store_true")
    parser.add_argument("--fetch-seconds", type=float, default=20.0)
    parser.add_argument("--operations", action="store_true",
                        help="instead of producing: Metadata and group operations")
    parser.add_argument("--idle", action="store_true",
                        help="instead of producing: PRODUCERS idle connections for SECONDS")
    parser.add_argument("--metadata", type=int, default=20)
    parser.add_argument("--groups", type=int, default=200)
    args = parser.parse_args()
    # As the services do: large buffers freed stay with the C library to be used again, rather
    # than going back to the system and coming back as fresh pages (docs/performance.md, "The
    # load's reading of large answers").
    tune_allocator()
    if args.idle:
        print(json.dumps(await idle(args)), flush=True)
        return
    if args.operations:
        print(json.dumps(await operations(args)), flush=True)
        return
    brokers, leader_of = await leaders(args.bootstrap, args.topic)
    result = await produce(args, brokers, leader_of)
    if args.fetch:
        # At least what the timed requests wrote (the first request of each connection, before
        # the clock, wrote some more).
        result.update(await fetch(args, brokers, leader_of, int(result["produced_bytes"])))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
