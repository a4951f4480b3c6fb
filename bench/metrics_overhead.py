"""Overhead of the metrics on produce: CPU the metric updates of one produce request cost,
against the CPU the services spend per produce request.

    python bench/metrics_overhead.py [--n 100000] [--size 1000] [--acks 1] [--batch-size N]

1. Cost: the metric updates one acks=1 produce request makes on its way through the services,
   replayed in a private registry with the same families, labels and buckets, timed over many
   iterations:
     frontend   requests, request/response bytes (3 counters), total/local/remote/send
                (4 histogram observations)
     gRPC       per RPC: started, handled{code}, handling seconds (x2 RPCs: frontend->handler,
                handler->log)
     handler    requests{api,code}, request seconds{api}
     log        append requests/bytes/batches{topic}, append seconds (per partition append)
2. Spend: a local cluster (free ports, temporary folder) takes N records from confluent-kafka
   in a separate process; the services' CPU time (utime+stime from /proc) and the frontend's
   Produce request counter before and after give CPU seconds per produce request.

Overhead = cost / spend, printed as JSON. A side-by-side run with the metrics switched off would
measure the same thing end to end; that needs a switch in services/common/metrics.py, which this
script does not assume. Background work (replication, health checks) counts in the spend, so the
percentage leans low when produce traffic is light.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from prometheus_client import CollectorRegistry, Counter, Histogram  # noqa: E402

from services.cluster import ClusterSpec, LocalCluster  # noqa: E402
from services.common.metrics import LATENCY_BUCKETS  # noqa: E402

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
for i in range(n):
    while True:
        try:
            p.produce(topic, payload, key=str(i % 1000).encode()); break
        except BufferError:
            p.poll(0.01)
p.flush(120)
'''


def metric_cost_per_request(iterations: int) -> float:
    """Seconds of metric updates per acks=1 produce request (see the module docstring)."""
    reg = CollectorRegistry()
    b = LATENCY_BUCKETS
    fe_req = Counter("fe_requests", "", ["api"], registry=reg).labels("Produce")
    fe_in = Counter("fe_in_bytes", "", ["api"], registry=reg).labels("Produce")
    fe_out = Counter("fe_out_bytes", "", ["api"], registry=reg).labels("Produce")
    fe_total = Histogram("fe_total", "", ["api"], buckets=b, registry=reg).labels("Produce")
    phase = Histogram("fe_phase", "", ["api", "phase"], buckets=b, registry=reg)
    fe_phases = [phase.labels("Produce", p) for p in ("local", "remote", "response_send")]
    started = Counter("g_started", "", ["s", "m", "t"], registry=reg)
    handled = Counter("g_handled", "", ["s", "m", "t", "c"], registry=reg)
    seconds = Histogram("g_seconds", "", ["s", "m", "t"], buckets=b, registry=reg)
    h_req = Counter("h_requests", "", ["api", "code"], registry=reg)
    h_sec = Histogram("h_seconds", "", ["api"], buckets=b, registry=reg)
    l_req = Counter("l_requests", "", ["topic"], registry=reg)
    l_bytes = Counter("l_bytes", "", ["topic"], registry=reg)
    l_batches = Counter("l_batches", "", ["topic"], registry=reg)
    l_sec = Histogram("l_seconds", "", buckets=b, registry=reg)
    rpcs = [("kbroker.handler.v1.Handler", "Produce"), ("kbroker.log.v1.Log", "Append")]
    perf = time.perf_counter
    start = perf()
    for _ in range(iterations):
        fe_req.inc()
        fe_in.inc(1100)
        fe_out.inc(60)
        fe_total.observe(0.002)
        for child in fe_phases:
            child.observe(0.0005)
        for service, method in rpcs:
            started.labels(service, method, "unary").inc()
            t0 = perf()
            handled.labels(service, method, "unary", "OK").inc()
            seconds.labels(service, method, "unary").observe(perf() - t0)
        h_req.labels("Produce", "0").inc()
        h_sec.labels("Produce").observe(0.001)
        l_req.labels("bench").inc()
        l_bytes.labels("bench").inc(1000)
        l_batches.labels("bench").inc()
        l_sec.observe(0.0002)
    return (perf() - start) / iterations


def cpu_seconds(pids: list[int]) -> float:
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / tick


def produce_requests(metrics_port: int) -> float:
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as reply:
        for line in reply.read().decode().splitlines():
            if line.startswith('kbroker_frontend_requests_total{api="Produce"}'):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=1000)
    parser.add_argument("--acks", default="1")
    parser.add_argument("--batch-size", type=int, default=1_000_000,
                        help="producer batch.size: smaller means more, smaller requests")
    parser.add_argument("--iterations", type=int, default=200_000)
    args = parser.parse_args()

    cost = metric_cost_per_request(args.iterations)
    with tempfile.TemporaryDirectory(prefix="kbroker-overhead-") as data:
        cluster = LocalCluster(ClusterSpec(data_dir=Path(data), kafka_port=0, base_port=0,
                                           num_partitions=3, log_level="WARNING"))
        cluster.start()
        try:
            pids = [s.proc.pid for s in cluster.services.values() if s.proc is not None]
            port = cluster.services["frontend"].metrics_port
            cpu0, req0, t0 = cpu_seconds(pids), produce_requests(port), time.perf_counter()
            subprocess.run([sys.executable, "-c", PRODUCE, cluster.bootstrap, str(args.n),
                            str(args.size), args.acks, str(args.batch_size)], check=True)
            elapsed = time.perf_counter() - t0
            cpu, requests = cpu_seconds(pids) - cpu0, produce_requests(port) - req0
        finally:
            cluster.stop()
    spend = cpu / max(requests, 1)
    print(json.dumps({
        "records": args.n, "record_bytes": args.size, "acks": args.acks,
        "batch_size": args.batch_size,
        "produce_requests": int(requests), "elapsed_s": round(elapsed, 3),
        "records_per_s": round(args.n / elapsed), "service_cpu_s": round(cpu, 3),
        "service_cpu_us_per_request": round(spend * 1e6, 1),
        "metrics_cpu_us_per_request": round(cost * 1e6, 2),
        "metrics_overhead_pct": round(100 * cost / spend, 2) if spend else None,
    }))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
