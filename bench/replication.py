"""acks=all with replication: produce throughput and single-record round trips, side by side
with the reference broker's acks=all, in one run.

    python bench/replication.py [--n 100000] [--size 1000] [--partitions 3]
                                [--round-trips 1000] [--background-mbps 10]
                                [--transports stream,unary] [--rounds 1] [--internal-tls]
                                [--failovers 3] [--failover-only]
                                [--failover-kinds kill,controlled]

Starts a local kbroker cluster (every service a process, 3 log nodes, free loopback ports, a
temporary data folder) and the reference broker (Tansu, in memory, installed into
bench/.venv-ref on first use, see bench/throughput.py), and runs with confluent-kafka in a
separate process:

- produce: N records of SIZE bytes with keys, acks=all, linger.ms=5, batch.size=1 MB, no
  compression, into a topic of PARTITIONS partitions;
- round trip: ROUND_TRIPS records one at a time (produce, then flush: the time until the
  acknowledgement), p50/p99/max;
- round trip under load: the same while another process produces BACKGROUND_MBPS (10) MB/s of
  SIZE-byte records, acks=all, into the same topic (paced every 10 ms), so the replication
  path is busy with other traffic; its p50/p99/max and the background rate achieved.

kbroker runs it twice: replication factor 3 with min.insync.replicas=2 (every acknowledged
record is on every in-sync replica), and replication factor 1 (the cost of replication is the
difference; the output gives RF=3 over RF=1 throughput). Then failover: with one record at a
time flowing (acks=all, RF=3), the leader's log node is stopped and the time until the first
record produced after the stop began is acknowledged is measured, FAILOVERS times per kind,
the kinds taking turns on one cluster:

- ``kill``: SIGKILL (the replicator fences a node whose process is gone as soon as its port
  refuses connections; node.session.timeout.ms bounds only a node that hangs);
- ``controlled``: SIGTERM, a controlled shutdown (the node hands its leaderships to in-sync
  followers before it stops), as a rolling restart stops each node.

Each stopped node is started again before the next run. ``--failover-only`` skips the
throughput runs and the reference broker.

With ``--internal-tls`` kbroker's services talk gRPC over mutual TLS (``ClusterSpec.
internal_tls``, certificates made at start); the bench's own calls to the replicator present a
certificate of the same CA (CN kbroker-bench), as every channel between services does.

Tansu runs a single broker, so its acks=all is acknowledged by that broker alone, with no
replica to wait for: the comparison puts kbroker's replicated acks=all beside the reference's
unreplicated one, and says so in the output. Prints one JSON line per run, then
the ratios kbroker RF=3 / reference (with ``--rounds R``, every round's and their medians).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from throughput import kbroker_cluster, reference_binary, reference_broker  # noqa: E402

from services.common.channels import internal_sync_channel  # noqa: E402
from services.common.tls import PLAINTEXT, InternalTls  # noqa: E402
from services.local_cluster import ClusterSpec, LocalCluster  # noqa: E402
from tests.tls_material import internal_tls_dir  # noqa: E402

BENCH_IDENTITY = "kbroker-bench"

FAILOVER = r'''
import json, sys, time, uuid
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
bootstrap, replicator, kill_file, root = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
sys.path.insert(0, root)
from kbroker.replicator.v1 import replicator_pb2, replicator_pb2_grpc
from services.common.channels import internal_sync_channel
from services.common.tls import InternalTls
tls = InternalTls(*sys.argv[5:8])  # CA, certificate, key ("": plaintext, loopback)
topic = f"failover-{uuid.uuid4().hex[:8]}"
admin = AdminClient({"bootstrap.servers": bootstrap})
for f in admin.create_topics([NewTopic(topic, 1, 3, config={"min.insync.replicas": "2"})]).values():
    f.result(30)
p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0,
              "enable.idempotence": True, "message.timeout.ms": 120000})
for _ in range(20):
    p.produce(topic, b"warm"); p.flush(30)
with internal_sync_channel(replicator, tls, "replicator") as channel:
    meta = replicator_pb2_grpc.ReplicatorStub(channel).GetMetadata(
        replicator_pb2.GetMetadataRequest(topics=[topic]))
print(json.dumps({"topic": topic, "leader": meta.topics[0].partitions[0].leader}), flush=True)
while True:  # the parent kills the leader and says when, through the file
    try:
        killed = float(open(kill_file).read()); break
    except (OSError, ValueError):
        time.sleep(0.01)
acked = []
p.produce(topic, b"after", on_delivery=lambda err, msg: acked.append((err, time.time())))
p.flush(120)
err, at = acked[0]
print(json.dumps({"failover_s": round(at - killed, 3), "error": str(err) if err else None}))
'''

BACKGROUND = r'''
import json, sys, threading, time
from confluent_kafka import Producer
bootstrap, topic = sys.argv[1], sys.argv[2]
rate, size = float(sys.argv[3]) * 1e6, int(sys.argv[4])
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 2,
              "compression.type": "none", "enable.idempotence": False})
payload, tick = b"b" * size, 0.01
per_tick = max(int(rate * tick / size), 1)
acked = [0]
def on_delivery(err, msg):
    if not err: acked[0] += 1
p.produce(topic, payload, on_delivery=on_delivery); p.flush(30)
print("ready", flush=True)
acked[0] = 0
start = next_at = time.perf_counter()
while not stop.is_set():
    for _ in range(per_tick):
        try:
            p.produce(topic, payload, on_delivery=on_delivery)
        except BufferError:
            p.poll(0.001)
    next_at += tick
    while (left := next_at - time.perf_counter()) > 0:
        p.poll(left)  # returns early when a delivery report is served
elapsed = time.perf_counter() - start
p.flush(30)
print(json.dumps({"background_MBps": round(acked[0] * size / 1e6 / elapsed, 1)}), flush=True)
'''

WORKLOAD = r'''
import json, statistics, subprocess, sys, time, uuid
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
bootstrap = sys.argv[1]
n, size, partitions, round_trips = (int(v) for v in sys.argv[2:6])
replication, min_insync = int(sys.argv[6]), sys.argv[7]
background_mbps, background_script = float(sys.argv[8]), sys.argv[9]
topic = f"bench-{uuid.uuid4().hex[:8]}"
admin = AdminClient({"bootstrap.servers": bootstrap})
configs = {"min.insync.replicas": min_insync} if replication > 1 else {}
for f in admin.create_topics([NewTopic(topic, partitions, replication, config=configs)]).values():
    f.result(30)
time.sleep(1.0)
payload = b"x" * size
p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5,
              "batch.size": 1_000_000, "compression.type": "none",
              "queue.buffering.max.messages": 1_000_000, "enable.idempotence": False})
errors = [0]
def on_delivery(err, msg):
    if err: errors[0] += 1
# Warm up connections and metadata before timing.
p.produce(topic, payload, key=b"warm", on_delivery=on_delivery); p.flush(30)
t0 = time.perf_counter()
for i in range(n):
    while True:
        try:
            p.produce(topic, payload, key=str(i % 1000).encode(), on_delivery=on_delivery); break
        except BufferError:
            p.poll(0.01)
    if i % 10000 == 0: p.poll(0)
left = p.flush(300)
t_produce = time.perf_counter() - t0
one = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0,
                "enable.idempotence": False})
one.produce(topic, payload, key=b"warm", partition=0); one.flush(30)
def round_trip_times():
    times = []
    for i in range(round_trips):
        t = time.perf_counter()
        one.produce(topic, payload, key=b"rt", partition=i % partitions,
                    on_delivery=on_delivery)
        one.flush(30)
        times.append((time.perf_counter() - t) * 1000)
    times.sort()
    return times
def summary(prefix, times):
    return {f"{prefix}_p50_ms": round(times[len(times) // 2], 3),
            f"{prefix}_p99_ms": round(times[int(len(times) * 0.99) - 1], 3),
            f"{prefix}_max_ms": round(times[-1], 3)}
idle = round_trip_times()
loaded = {}
if background_mbps > 0:
    background = subprocess.Popen(
        [sys.executable, "-c", background_script, bootstrap, topic, str(background_mbps),
         str(size)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert background.stdout.readline().strip() == "ready"
    time.sleep(1.0)
    loaded = summary("loaded_round_trip", round_trip_times())
    background.stdin.close()
    loaded.update(json.loads(background.stdout.readline()))
    background.wait(60)
print(json.dumps({
    "produce_MBps": round(n * size / 1e6 / t_produce, 1),
    "produce_msgps": round(n / t_produce), "delivery_errors": errors[0], "unflushed": left,
    **summary("round_trip", idle), **loaded}))
'''


def run_workload(bootstrap: str, args: argparse.Namespace, replication: int,
                 min_insync: int) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", WORKLOAD, bootstrap, str(args.n), str(args.size),
         str(args.partitions), str(args.round_trips), str(replication), str(min_insync),
         str(args.background_mbps), BACKGROUND],
        capture_output=True, text=True, timeout=1800, check=False)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_reference(binary: Path, args: argparse.Namespace) -> dict:
    with reference_broker(binary) as bootstrap:
        return run_workload(bootstrap, args, 1, 1)


def internal_tls_material(folder: Path | None) -> tuple[Path | None, InternalTls]:
    """With ``folder``: fill it for ``ClusterSpec.internal_tls`` and give the bench's own client
    certificate (CN kbroker-bench, from the same CA); without: plaintext."""
    if folder is None:
        return None, PLAINTEXT
    ca = internal_tls_dir(folder)
    leaf = ca.issue(folder, BENCH_IDENTITY, stem="bench")
    return folder, InternalTls(str(ca.cert), str(leaf.cert), str(leaf.key))


def run_kbroker(args: argparse.Namespace, replication: int, transport: str = "") -> dict:
    """One workload on a fresh 3-node cluster; ``transport``: how followers fetch (the log
    nodes' ``--replica-fetch-transport``; empty: their default)."""
    flags = {"log": {"replica_fetch_transport": transport}} if transport else {}
    with tempfile.TemporaryDirectory(prefix="kbroker-bench-tls-") as folder:
        internal_tls, _ = internal_tls_material(Path(folder) if args.internal_tls else None)
        with kbroker_cluster(log_nodes=3, internal_tls=internal_tls,
                             service_flags=flags) as cluster:
            return run_workload(cluster.bootstrap, args, replication, min(2, replication))


def wait_all_alive(replicator: str, tls: InternalTls, timeout: float = 60) -> None:
    """Until the replicator sees every log node alive (a restarted one rejoins)."""
    from kbroker.replicator.v1 import replicator_pb2, replicator_pb2_grpc

    deadline = time.monotonic() + timeout
    with internal_sync_channel(replicator, tls, "replicator") as channel:
        stub = replicator_pb2_grpc.ReplicatorStub(channel)
        while time.monotonic() < deadline:
            metadata = stub.GetMetadata(replicator_pb2.GetMetadataRequest(), timeout=5)
            if all(n.alive for n in metadata.log_nodes):
                return
            time.sleep(0.2)
    raise TimeoutError("log nodes not all alive")


def run_failover(args: argparse.Namespace) -> dict[str, list[float]]:
    """Seconds from stopping the leader (each kind of ``args.failover_kinds`` in turn) to the
    first acknowledged acks=all write, per run, by kind."""
    kinds = [k.strip() for k in args.failover_kinds.split(",") if k.strip()]
    unknown = set(kinds) - {"kill", "controlled"}
    if unknown:
        raise SystemExit(f"unknown failover kinds {sorted(unknown)} (kill, controlled)")
    times: dict[str, list[float]] = {kind: [] for kind in kinds}
    with tempfile.TemporaryDirectory(prefix="kbroker-bench-") as data:
        internal_tls, tls = internal_tls_material(
            Path(data) / "internal-tls" if args.internal_tls else None)
        cluster = LocalCluster(ClusterSpec(data_dir=Path(data), kafka_port=0, base_port=0,
                                           log_nodes=3, internal_tls=internal_tls,
                                           log_level=os.environ.get("LOG_LEVEL", "WARNING")))
        cluster.start()
        try:
            for run, kind in ((r, k) for r in range(args.failovers) for k in kinds):
                wait_all_alive(cluster.services["replicator"].grpc_address, tls)
                kill_file = Path(data) / f"stopped-{run}-{kind}"
                child = subprocess.Popen(
                    [sys.executable, "-c", FAILOVER, cluster.bootstrap,
                     cluster.services["replicator"].grpc_address, str(kill_file), str(ROOT),
                     tls.ca, tls.cert, tls.key],
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                assert child.stdout is not None
                line = child.stdout.readline()
                if not line:
                    raise RuntimeError(f"failover workload failed: {child.communicate()[1]}")
                ready = json.loads(line)
                victim = f"log-{ready['leader']}"
                proc = cluster.services[victim].proc
                assert proc is not None
                killed = time.time()
                proc.send_signal(signal.SIGKILL if kind == "kill" else signal.SIGTERM)
                kill_file.write_text(repr(killed))
                out, _ = child.communicate(timeout=300)
                result = json.loads(out.strip().splitlines()[-1])
                if result["error"]:
                    raise RuntimeError(f"failover write failed: {result['error']}")
                times[kind].append(result["failover_s"])
                print(json.dumps({"failover": kind, "run": run + 1, **result}), flush=True)
                proc.wait(timeout=60)
                cluster.start_service(victim)
        finally:
            cluster.stop()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=1000)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--round-trips", type=int, default=1000)
    parser.add_argument("--background-mbps", type=float, default=10.0,
                        help="MB/s of other acks=all traffic while the loaded round trips are "
                             "timed (0: no loaded round trips)")
    parser.add_argument("--transports", default="",
                        help="comma-separated replica fetch transports of the log nodes to run "
                             "RF=3 with, each on a cluster of its own (stream, unary; empty: "
                             "their default); the first is the one compared")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--failovers", type=int, default=3)
    parser.add_argument("--internal-tls", action="store_true",
                        help="kbroker's services talk gRPC over mutual TLS (certificates made "
                             "at start); the bench's own gRPC calls present a certificate too")
    parser.add_argument("--failover-only", action="store_true",
                        help="measure failovers only (no throughput runs, no reference broker)")
    parser.add_argument("--failover-kinds", default="kill,controlled",
                        help="how the leader's log node is stopped, taking turns: kill "
                             "(SIGKILL), controlled (SIGTERM, a controlled shutdown)")
    args = parser.parse_args()
    if not args.failover_only:
        run_comparison(args)
    if args.failovers:
        times = run_failover(args)
        print(json.dumps({"failover_stop_to_first_ack_s": times,
                          "median_s": {kind: statistics.median(values)
                                       for kind, values in times.items()},
                          "note": "the leader's log node killed (kill -9) or stopped with a "
                                  "controlled shutdown (SIGTERM), then started again; the "
                                  "reference broker is a single node and has no failover to "
                                  "compare"}))


def run_comparison(args: argparse.Namespace) -> None:
    binary = reference_binary()
    keys = ("produce_MBps", "round_trip_p50_ms", "round_trip_p99_ms",
            "loaded_round_trip_p50_ms", "loaded_round_trip_p99_ms")
    ratios: dict[str, list[float]] = {k: [] for k in keys}
    rf3_over_rf1: list[float] = []
    print(json.dumps({"note": "the reference broker (Tansu) is a single broker: its acks=all "
                              "waits for no replica; kbroker rf3 waits for 3 in-sync replicas "
                              "on 3 log nodes (min.insync.replicas=2)"}))
    transports = [t for t in args.transports.split(",") if t] or [""]
    for round_number in range(1, args.rounds + 1):
        ours = {}
        for transport in transports:
            result = run_kbroker(args, 3, transport)
            ours = ours or result  # the first transport is compared with the others
            print(json.dumps({"round": round_number, "broker": "kbroker", "replication": 3,
                              **({"transport": transport} if transport else {}), **result}),
                  flush=True)
        single = run_kbroker(args, 1)
        print(json.dumps({"round": round_number, "broker": "kbroker", "replication": 1,
                          **single}), flush=True)
        ref = run_reference(binary, args)
        print(json.dumps({"round": round_number, "broker": "tansu (single broker)",
                          "replication": 1, **ref}), flush=True)
        for key in keys:
            if key in ours and ref.get(key):
                ratios[key].append(round(ours[key] / ref[key], 3))
        rf3_over_rf1.append(round(ours["produce_MBps"] / single["produce_MBps"], 3))
    print(json.dumps({"ratios_kbroker_rf3_over_reference": ratios,
                      "medians": {k: statistics.median(v) for k, v in ratios.items() if v},
                      "kbroker_rf3_over_rf1_produce": rf3_over_rf1,
                      "kbroker_rf3_over_rf1_median": statistics.median(rf3_over_rf1)}),
          flush=True)


if __name__ == "__main__":
    main()
