"""Overhead of the metrics on produce: the same produce workload against a local cluster with
metrics recording on and off (``KBROKER_METRICS_ENABLED=false``), side by side in one run.

    python bench/metrics_overhead.py [--n 200000] [--size 1000] [--acks 1] [--rounds 2]
                                     [--batch-size 16384]

The default batch.size (Kafka's Java producer default, 16 KiB) makes many small produce
requests, where the per-request metrics weigh most; a large batch.size dilutes them.

Each round starts two clusters in turn (free ports, temporary folders), metrics on and off, in
alternating order so neither side always runs first on a warming machine. Against each one a
confluent-kafka producer in its own process sends N records. Measured per side:

    records_per_s        produce throughput seen by the client (send to last ack)
    service_cpu_us_per_record
                         CPU (utime+stime from /proc) of every service process during the
                         run, per record: the cost the metrics add wherever they are recorded

With metrics off the metric classes are stand-ins whose calls do nothing, gRPC calls are not
intercepted and no collectors are registered (services/common/metrics.py); the call sites and
the clock reads around them remain, so "off" is the cost of recording and exposing metrics, not
of the few lines that call them. The overhead is reported both ways, with every round's numbers:
throughput lost (1 - on/off) and CPU added per record (on/off - 1). The machine may be shared:
compare rounds before trusting a single number.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from services.cluster import ClusterSpec, LocalCluster  # noqa: E402

PRODUCE = r'''
import sys, time, uuid
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
bootstrap, n, size, acks = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
batch_size = int(sys.argv[5])
topic = f"overhead-{uuid.uuid4().hex[:8]}"
admin = AdminClient({"bootstrap.servers": bootstrap})
for f in admin.create_topics([NewTopic(topic, 3, 1)]).values():
    f.result(30)
time.sleep(0.5)
p = Producer({"bootstrap.servers": bootstrap, "acks": acks, "linger.ms": 5,
              "batch.size": batch_size, "queue.buffering.max.messages": 1_000_000})
payload = b"x" * size
# Warm-up: connections, metadata, first requests (not measured).
for i in range(1000):
    p.produce(topic, payload)
p.flush(60)
print("ready", flush=True)
sys.stdin.readline()
started = time.perf_counter()
for i in range(n):
    while True:
        try:
            p.produce(topic, payload, key=str(i % 1000).encode()); break
        except BufferError:
            p.poll(0.01)
assert p.flush(300) == 0
print(time.perf_counter() - started, flush=True)
'''


def cpu_seconds(pids: list[int]) -> float:
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / tick


def run_side(enabled: bool, args: argparse.Namespace) -> dict[str, float]:
    """One cluster with metrics ``enabled`` or not, one measured produce run against it."""
    saved = os.environ.get("KBROKER_METRICS_ENABLED")
    os.environ["KBROKER_METRICS_ENABLED"] = "true" if enabled else "false"
    try:
        with tempfile.TemporaryDirectory(prefix="kbroker-overhead-") as data:
            cluster = LocalCluster(ClusterSpec(data_dir=Path(data), kafka_port=0, base_port=0,
                                               num_partitions=3, log_level="WARNING"))
            cluster.start()
            try:
                pids = [s.proc.pid for s in cluster.services.values() if s.proc is not None]
                client = subprocess.Popen(
                    [sys.executable, "-c", PRODUCE, cluster.bootstrap, str(args.n),
                     str(args.size), args.acks, str(args.batch_size)],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                try:
                    assert client.stdout is not None and client.stdin is not None
                    assert client.stdout.readline().strip() == "ready"
                    cpu0 = cpu_seconds(pids)
                    client.stdin.write("go\n")
                    client.stdin.flush()
                    elapsed = float(client.stdout.readline())
                    cpu = cpu_seconds(pids) - cpu0
                    if client.wait(60) != 0:
                        raise RuntimeError("the producer failed")
                finally:
                    if client.poll() is None:
                        client.kill()
                        client.wait()
            finally:
                cluster.stop()
    finally:
        if saved is None:
            os.environ.pop("KBROKER_METRICS_ENABLED", None)
        else:
            os.environ["KBROKER_METRICS_ENABLED"] = saved
    return {
        "records_per_s": round(args.n / elapsed),
        "elapsed_s": round(elapsed, 3),
        "service_cpu_s": round(cpu, 3),
        "service_cpu_us_per_record": round(cpu / args.n * 1e6, 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=1000)
    parser.add_argument("--acks", default="1")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16_384,
                        help="producer batch.size: smaller means more, smaller requests")
    args = parser.parse_args()

    rounds = []
    for r in range(args.rounds):
        order = (True, False) if r % 2 == 0 else (False, True)
        result = {("on" if enabled else "off"): run_side(enabled, args) for enabled in order}
        on, off = result["on"], result["off"]
        result["throughput_lost_pct"] = round(
            100 * (1 - on["records_per_s"] / off["records_per_s"]), 2)
        result["cpu_added_pct"] = round(
            100 * (on["service_cpu_us_per_record"] / off["service_cpu_us_per_record"] - 1), 2)
        rounds.append(result)
        print(json.dumps({"round": r + 1, **result}), flush=True)
    print(json.dumps({
        "records": args.n, "record_bytes": args.size, "acks": args.acks,
        "batch_size": args.batch_size, "rounds": args.rounds,
        "median_throughput_lost_pct": statistics.median(
            x["throughput_lost_pct"] for x in rounds),
        "median_cpu_added_pct": statistics.median(x["cpu_added_pct"] for x in rounds),
    }))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
