"""Where a request's round trip goes: one request at a time, each API chosen to stop at a
different hop, on a local cluster and beside the reference broker in the same run, with what
one gRPC stream round trip between two Python processes costs as the floor of a hop.

    python bench/round_trips.py [--n 500]

Requests (the wire protocol spoken directly, as bench/scale_client.py does, so no client
library adds its own latency), N of each, one in flight:

- ApiVersions v2: answered by the frontend itself;
- Metadata v1 of one topic: frontend -> handler (its metadata cache) and back;
- Produce v8 of one 1 KB record, acks=1 and acks=-1, to a topic of replication factor 1 and to
  one of replication factor 3 (min.insync.replicas 2): frontend -> handler -> leader log node,
  and for acks=-1 with followers the replica fetches and the purgatory besides.

The floor: a grpc.aio stream echoing 100-byte messages between two processes on uvloop (a
write and a read on each side, as one hop has), on the services' TCP transport
(``services/common/grpc_transport.py``; ``GRPC_EXPERIMENTS=`` for gRPC's default one). The
reference is a single broker keeping its records in memory: its acks=-1 waits for no replica.
Prints one JSON line per broker and one for the floor, p50 and p99 in ms; for kbroker also the
CPU each kind of service spent per request (user and system time from /proc, every process of
the kind together), in µs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from kio.schema.api_versions.v2.request import ApiVersionsRequest  # noqa: E402
from kio.schema.metadata.v1.request import MetadataRequest, MetadataRequestTopic  # noqa: E402
from scale_client import Connection, frame, leaders, percentiles, produce_request  # noqa: E402
from throughput import cpu_seconds, kbroker_cluster, reference_broker  # noqa: E402

# Imported once grpc is loaded here: this process, whose launcher checks the services' health
# on blocking channels, keeps gRPC's default transport; the processes it starts (the services,
# both ends of the floor) inherit the services' choice from its environment.
import services.common.grpc_transport  # noqa: E402,F401

ECHO_METHOD = "/bench.Echo/Stream"


async def _times(connection: Connection, request: bytearray, n: int) -> list[float]:
    times = []
    for _ in range(n):
        started = time.perf_counter()
        await connection.call(request)
        times.append((time.perf_counter() - started) * 1000)
    return times


async def measure(bootstrap: str, topics: dict[str, str], n: int,
                  services: dict[str, list[int]] | None = None) -> dict[str, Any]:
    """Percentiles of each request's round trips; with ``services`` (process ids by kind of
    service), also the CPU each kind spent per request, in µs (``<request>_cpu_us``)."""
    out: dict[str, Any] = {}

    async def timed(name: str, connection: Connection, request: bytearray) -> None:
        before = {kind: cpu_seconds(pids) for kind, pids in (services or {}).items()}
        times = await _times(connection, request, n)
        out.update({k: v for k, v in percentiles(times, name).items() if "max" not in k})
        if services:
            spent = {kind: round((cpu_seconds(pids) - before[kind]) / n * 1e6)
                     for kind, pids in services.items()}
            out[f"{name}_cpu_us"] = {**spent, "all": sum(spent.values())}

    host, port = bootstrap.rsplit(":", 1)
    connection = await Connection.open(host, int(port))
    try:
        await timed("api_versions", connection, frame(ApiVersionsRequest()))
        await timed("metadata", connection, frame(MetadataRequest(
            topics=(MetadataRequestTopic(name=topics["rf1"]),))))
    finally:
        connection.close()
    for label, topic in topics.items():
        brokers, leader_of = await leaders(bootstrap, topic)
        leader = await Connection.open(*brokers[leader_of[0]])
        try:
            for acks in (1, -1):
                request, _ = produce_request(topic, [0], 1, 1000, acks)
                await timed(f"produce_{label}_acks{'_all' if acks < 0 else '1'}", leader,
                            request)
        finally:
            leader.close()
    return out


def create_topics(bootstrap: str, replication: dict[str, int]) -> dict[str, str]:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    names = {label: f"rt-{label}-{os.getpid()}" for label in replication}
    futures = admin.create_topics([
        NewTopic(names[label], 1, rf, config={"min.insync.replicas": "2"} if rf > 1 else {})
        for label, rf in replication.items()])
    for future in futures.values():
        future.result(60)
    time.sleep(1.0)
    return names


# --- the floor: one gRPC stream round trip between two processes ----------------------------

async def _echo_server(port_file: str) -> None:
    import grpc

    async def stream(requests, context):  # type: ignore[no-untyped-def]
        async for message in requests:
            await context.write(message)

    server = grpc.aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "bench.Echo", {"Stream": grpc.stream_stream_rpc_method_handler(stream)}),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    _write(port_file, str(port))
    await server.wait_for_termination()


def _write(path: str, text: str) -> None:
    Path(path).write_text(text)


async def _echo_client(port: int, n: int) -> list[float]:
    import grpc

    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.stream_stream(ECHO_METHOD)()
        times = []
        for _ in range(n):
            started = time.perf_counter()
            await call.write(b"x" * 100)
            await call.read()
            times.append((time.perf_counter() - started) * 1000)
        call.cancel()
    return times


def grpc_floor(n: int) -> dict[str, float]:
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        port_file = os.path.join(folder, "port")
        server = subprocess.Popen([sys.executable, __file__, "--echo-server", port_file])
        try:
            deadline = time.monotonic() + 30
            while not (os.path.exists(port_file) and Path(port_file).read_text()):
                if time.monotonic() > deadline:
                    raise TimeoutError("echo server did not start")
                time.sleep(0.05)
            client = subprocess.run(
                [sys.executable, __file__, "--echo-client", Path(port_file).read_text(),
                 "--n", str(n)], capture_output=True, text=True, timeout=300, check=True)
            times = json.loads(client.stdout)
        finally:
            server.kill()
            server.wait(10)
    return {k: v for k, v in percentiles(times, "grpc_stream").items() if "max" not in k}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=500)
    parser.add_argument("--echo-server", help=argparse.SUPPRESS)
    parser.add_argument("--echo-client", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.echo_server or args.echo_client:
        import uvloop
        if args.echo_server:
            uvloop.run(_echo_server(args.echo_server))
        else:
            print(json.dumps(uvloop.run(_echo_client(args.echo_client, args.n))))
        return
    with kbroker_cluster(log_nodes=3, handlers=2) as cluster:
        topics = create_topics(cluster.bootstrap, {"rf1": 1, "rf3": 3})
        services: dict[str, list[int]] = {}
        for service in cluster.services.values():
            assert service.proc is not None
            services.setdefault(service.kind, []).append(service.proc.pid)
        print(json.dumps({"broker": "kbroker", **asyncio.run(
            measure(cluster.bootstrap, topics, args.n, services))}), flush=True)
    with reference_broker() as bootstrap:
        topics = create_topics(bootstrap, {"rf1": 1})
        print(json.dumps({"broker": "reference (tansu, memory)",
                          **asyncio.run(measure(bootstrap, topics, args.n))}), flush=True)
    print(json.dumps({"floor": "grpc.aio stream, two processes", **grpc_floor(args.n * 6)}),
          flush=True)


if __name__ == "__main__":
    main()
