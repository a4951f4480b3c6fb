"""What the services' gRPC hops alone cost per GB, beside what the reference broker spends in
all per GB, in one run: the floor under kbroker's produce and fetch throughput on this machine.

    python bench/transport_floor.py [--sizes 780000,65536] [--messages 1500]
                                    [--n 400000] [--size 1000] [--partitions 3]

Two measurements, one after the other:

- one hop: a process writes SIZE-byte messages on a gRPC stream (grpc.aio on uvloop, the
  services' channel and server options from ``services/common/channels.py`` and their TCP
  transport from ``services/common/grpc_transport.py``) to a server in
  another process, which answers each with two bytes, one message at a time, as a produce
  request crosses frontend -> handler and handler -> log node (a fetch answer the other way).
  Each side's user and system CPU per MB moved (``getrusage``: every thread, gRPC's included).
  780,000 bytes is the size of a Produce in bench/throughput.py's load (200 MB in about 770
  requests, as bench/profile.py counts them); 65,536 the smallest message whose record batches
  are spliced beside the protobuf;
- the reference broker (Tansu, in memory; see bench/throughput.py) under bench/throughput.py's
  workload (N records of SIZE bytes, acks=1, produced then consumed with manual assignment):
  its process's CPU per GB moved (produced plus consumed), and the client's in each phase
  (``time.process_time`` of the client process: librdkafka's threads included).

A record crosses two such hops on kbroker's produce path and two on its fetch path, besides the
Kafka socket every broker serves. Prints one JSON line per measurement, then the floor: the two
hops' CPU per GB beside the reference broker's whole CPU per GB, and for each phase the
throughput the two hops alone would allow on the machine's cores once the client has its share
in that phase (``cores / (client + hops)``, in MB/s), beside the reference's measured one.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

# The services' TCP transport, chosen before anything loads grpc.
import services.common.grpc_transport  # noqa: E402,F401

# isort: split
from fetch_sessions import cpu_seconds  # noqa: E402
from throughput import WORKLOAD, reference_binary, reference_process  # noqa: E402

from services.common.channels import CHANNEL_OPTIONS, SERVER_OPTIONS  # noqa: E402

METHOD = "/bench.Hop/Stream"
HOPS_PER_PATH = 2  # frontend -> handler -> log node, and back for a fetch


def _cpu() -> tuple[float, float]:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime, usage.ru_stime


async def _serve(port_file: str, size: int, messages: int) -> None:
    import grpc

    server = grpc.aio.server(options=SERVER_OPTIONS)

    async def stream(requests, context):  # type: ignore[no-untyped-def]
        user0, system0 = _cpu()
        count = 0
        async for _ in requests:
            count += 1
            await context.write(b"ok")
            if count == messages:
                user, system = _cpu()
                mb = size * messages / 1e6
                print(json.dumps({"receiver_user_ms_per_MB": round(1e3 * (user - user0) / mb, 3),
                                  "receiver_sys_ms_per_MB": round(1e3 * (system - system0) / mb,
                                                                  3)}), flush=True)

    handler = grpc.method_handlers_generic_handler(
        "bench.Hop", {"Stream": grpc.stream_stream_rpc_method_handler(stream)})
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    with open(port_file, "w") as out:  # noqa: ASYNC230 (once, before anything is measured)
        out.write(str(port))
    await server.wait_for_termination()


async def _send(port: int, size: int, messages: int) -> dict:
    import grpc

    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=CHANNEL_OPTIONS)
    call = channel.stream_stream(METHOD)()
    message = os.urandom(size)
    await call.write(message)  # the stream set up, outside the count
    await call.read()
    user0, system0 = _cpu()
    started = time.perf_counter()
    for _ in range(messages - 1):
        await call.write(message)
        await call.read()
    elapsed = time.perf_counter() - started
    user, system = _cpu()
    await call.done_writing()
    await channel.close()
    mb = size * (messages - 1) / 1e6
    return {"size": size, "MBps": round(mb / elapsed, 1),
            "sender_user_ms_per_MB": round(1e3 * (user - user0) / mb, 3),
            "sender_sys_ms_per_MB": round(1e3 * (system - system0) / mb, 3)}


def measure_hop(size: int, messages: int, workdir: Path) -> dict:
    """One hop's CPU per MB on each side, the receiver a separate process."""
    port_file = workdir / f"hop-{size}.port"
    port_file.unlink(missing_ok=True)
    receiver = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(port_file), "--size", str(size),
         "--messages", str(messages)], stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text()):
            if time.monotonic() > deadline or receiver.poll() is not None:
                raise RuntimeError("the receiver did not start")
            time.sleep(0.05)
        sent = _run(_send(int(port_file.read_text()), size, messages))
        assert receiver.stdout is not None
        received = json.loads(receiver.stdout.readline())
    finally:
        receiver.kill()
        receiver.wait(timeout=10)
    result = {**sent, **received}
    result["hop_ms_per_MB"] = round(sum(v for k, v in result.items() if k.endswith("_per_MB")), 3)
    return result


def _run(coroutine):  # type: ignore[no-untyped-def]
    import uvloop

    return uvloop.run(coroutine)


def measure_reference(args: argparse.Namespace) -> dict:
    """The reference broker's CPU per GB over bench/throughput.py's workload (produce, then
    consume), and the client's in each phase."""
    with reference_process(reference_binary()) as (bootstrap, process):
        broker0 = cpu_seconds([process.pid])
        done = subprocess.run(
            [sys.executable, "-c", WORKLOAD, bootstrap, str(args.n), str(args.size),
             str(args.partitions), "1"],
            capture_output=True, text=True, timeout=900, check=True)
        broker = cpu_seconds([process.pid]) - broker0
    result = json.loads(done.stdout.strip().splitlines()[-1])
    gb = args.n * args.size / 1e9
    return {"reference_produce_MBps": result["produce_MBps"],
            "reference_consume_MBps": result["consume_MBps"],
            # Over both phases (and the workload's set-up): per GB moved, produced plus consumed.
            "reference_broker_s_per_GB": round(broker / (2 * gb), 2),
            "client_s_per_GB": {phase: round(seconds / gb, 2)
                                for phase, seconds in result["client_cpu_s"].items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="780000,65536")
    parser.add_argument("--messages", type=int, default=1500)
    parser.add_argument("--n", type=int, default=400_000)
    parser.add_argument("--size", type=int, default=1000)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        _run(_serve(args.serve, args.size, args.messages))
        return

    workdir = Path(os.environ.get("TMPDIR", "/tmp"))
    hops = []
    for size in (int(s) for s in args.sizes.split(",")):
        hop = measure_hop(size, args.messages, workdir)
        print(json.dumps({"measurement": "one gRPC hop", **hop}), flush=True)
        hops.append(hop)
    reference = measure_reference(args)
    print(json.dumps({"measurement": "reference broker", **reference}), flush=True)

    cores = os.cpu_count() or 1
    floor = HOPS_PER_PATH * hops[0]["hop_ms_per_MB"]  # ms per MB is s per GB
    summary: dict = {"message_size": hops[0]["size"], "two_hops_s_per_GB": round(floor, 2),
                     "reference_broker_s_per_GB": reference["reference_broker_s_per_GB"],
                     "cores": cores}
    for phase in ("produce", "consume"):
        client = reference["client_s_per_GB"][phase]
        summary[phase] = {"client_s_per_GB": client,
                          "MBps_the_two_hops_alone_allow": round(1e3 * cores / (client + floor)),
                          "reference_MBps": reference[f"reference_{phase}_MBps"]}
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
