"""Overhead of the metrics on produce: the same produce workload against two local clusters
running side by side, one with metrics recording on and one with it off
(``KBROKER_METRICS_ENABLED=false``), in one run.

    python bench/metrics_overhead.py [--slices 10] [--slice-records 20000] [--size 1000]
                                     [--acks 1] [--batch-size 16384]

Both clusters (free ports, temporary folders) and a confluent-kafka producer process for each
stay up for the whole run. The work is cut into slices, and the slices alternate between the
two sides (on, off, off, on, on, off, ...), so background load on a shared machine falls on
both alike instead of on whichever side ran during a busy minute. Measured per side, summed
over its slices (and, slice by slice, compared with the other side's slice next to it in
time: the medians of those paired differences are the steadier numbers on a busy machine):

    records_per_s              produce throughput seen by the client (first send to last ack)
    service_cpu_us_per_record  CPU (utime+stime from /proc) of that cluster's service processes
                               during its slices, per record: the cost of the metrics wherever
                               they are recorded

The default batch.size (Kafka's Java producer default, 16 KiB) makes many small produce
requests, where the per-request metrics weigh most; a large batch.size dilutes them.

With metrics off the metric classes are stand-ins whose calls do nothing, gRPC calls are not
intercepted, no collectors are registered and the frontend skips its arrival clock and response
walks (services/common/metrics.py, services/frontend); the call sites and the clock reads
around them remain, so "off" is the cost of recording and exposing metrics, not of the few
lines that call them. The overhead is reported both ways: throughput lost (1 - on/off) and CPU
added per record (on/off - 1), with the per-slice numbers for judging the noise.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from throughput import cpu_seconds  # noqa: E402

from services.local_cluster import ClusterSpec, LocalCluster  # noqa: E402

PRODUCE = r'''
import sys, time, uuid
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
bootstrap, size, acks, batch_size = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
topic = f"overhead-{uuid.uuid4().hex[:8]}"
admin = AdminClient({"bootstrap.servers": bootstrap})
for f in admin.create_topics([NewTopic(topic, 3, 1)]).values():
    f.result(30)
time.sleep(0.5)
p = Producer({"bootstrap.servers": bootstrap, "acks": acks, "linger.ms": 5,
              "batch.size": batch_size, "queue.buffering.max.messages": 1_000_000})
payload = b"x" * size

def produce(n):
    for i in range(n):
        while True:
            try:
                p.produce(topic, payload, key=str(i % 1000).encode()); break
            except BufferError:
                p.poll(0.01)
    assert p.flush(300) == 0

produce(2000)  # warm-up: connections, metadata, first requests (not measured)
print("ready", flush=True)
for line in sys.stdin:
    started = time.perf_counter()
    produce(int(line))
    print(time.perf_counter() - started, flush=True)
'''


def produce_requests(metrics_port: int) -> float:
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as reply:
        for line in reply.read().decode().splitlines():
            if line.startswith('kbroker_frontend_requests_total{api="Produce"}'):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


class Side:
    """A cluster with metrics on or off, and a producer process attached to it."""

    def __init__(self, enabled: bool, args: argparse.Namespace, data: Path) -> None:
        self.name = "on" if enabled else "off"
        saved = os.environ.get("KBROKER_METRICS_ENABLED")
        # The cluster's processes inherit the environment they are started with.
        os.environ["KBROKER_METRICS_ENABLED"] = "true" if enabled else "false"
        try:
            for attempt in range(3):
                self.cluster = LocalCluster(ClusterSpec(
                    data_dir=data / str(attempt), kafka_port=0, base_port=0,
                    num_partitions=3, log_level="WARNING"))
                try:
                    self.cluster.start()
                    break
                except OSError:  # a free port taken meanwhile (a shared machine): again
                    self.cluster.stop()
                    if attempt == 2:
                        raise
        finally:
            if saved is None:
                os.environ.pop("KBROKER_METRICS_ENABLED", None)
            else:
                os.environ["KBROKER_METRICS_ENABLED"] = saved
        self.pids = [s.proc.pid for s in self.cluster.services.values() if s.proc is not None]
        self.client = subprocess.Popen(
            [sys.executable, "-c", PRODUCE, self.cluster.bootstrap, str(args.size), args.acks,
             str(args.batch_size)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.client.stdout is not None and self.client.stdin is not None
        if self.client.stdout.readline().strip() != "ready":
            raise RuntimeError(f"{self.name}: the producer did not start")
        self.records = 0
        self.elapsed = 0.0
        self.cpu = 0.0
        self.slices: list[float] = []  # records per second, per slice
        self.slice_cpu: list[float] = []  # service CPU microseconds per record, per slice

    def slice(self, records: int) -> None:
        assert self.client.stdin is not None and self.client.stdout is not None
        cpu0 = cpu_seconds(self.pids)
        self.client.stdin.write(f"{records}\n")
        self.client.stdin.flush()
        elapsed = float(self.client.stdout.readline())
        cpu = cpu_seconds(self.pids) - cpu0
        self.cpu += cpu
        self.records += records
        self.elapsed += elapsed
        self.slices.append(round(records / elapsed))
        self.slice_cpu.append(round(cpu / records * 1e6, 1))

    def summary(self) -> dict[str, float | list[float]]:
        out: dict[str, float | list[float]] = {
            "records_per_s": round(self.records / self.elapsed),
            "service_cpu_us_per_record": round(self.cpu / self.records * 1e6, 2),
            "slice_records_per_s": self.slices,
            "slice_cpu_us_per_record": self.slice_cpu,
        }
        if self.name == "on":
            # Warm-up included: 2000 records more than the slices.
            out["produce_requests"] = produce_requests(self.cluster.services["frontend"]
                                                       .metrics_port)
        return out

    def close(self) -> None:
        if self.client.poll() is None:
            assert self.client.stdin is not None
            self.client.stdin.close()
            try:
                self.client.wait(30)
            except subprocess.TimeoutExpired:
                self.client.kill()
                self.client.wait()
        self.cluster.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slices", type=int, default=20, help="slices per side")
    parser.add_argument("--slice-records", type=int, default=10_000)
    parser.add_argument("--size", type=int, default=1000)
    parser.add_argument("--acks", default="1")
    parser.add_argument("--batch-size", type=int, default=16_384,
                        help="producer batch.size: smaller means more, smaller requests")
    args = parser.parse_args()

    with contextlib.ExitStack() as stack:
        folders = [Path(stack.enter_context(tempfile.TemporaryDirectory(
            prefix=f"kbroker-overhead-{name}-"))) for name in ("on", "off")]
        on = Side(True, args, folders[0])
        stack.callback(on.close)
        off = Side(False, args, folders[1])
        stack.callback(off.close)
        for i in range(args.slices):
            for side in ((on, off) if i % 2 == 0 else (off, on)):
                side.slice(args.slice_records)
        result_on, result_off = on.summary(), off.summary()
        # Slice i of each side ran back to back: compare within pairs, then take the median,
        # which a burst of background load in one pair cannot move much.
        paired_throughput = [100 * (1 - a / b) for a, b in zip(on.slices, off.slices,
                                                              strict=True)]
        paired_cpu = [100 * (a / b - 1) for a, b in zip(on.slice_cpu, off.slice_cpu,
                                                       strict=True) if b]
    print(json.dumps({
        "records_per_side": args.slices * args.slice_records, "record_bytes": args.size,
        "acks": args.acks, "batch_size": args.batch_size,
        "on": result_on, "off": result_off,
        "throughput_lost_pct": round(
            100 * (1 - result_on["records_per_s"] / result_off["records_per_s"]), 2),
        "cpu_added_pct": round(100 * (result_on["service_cpu_us_per_record"]
                                      / result_off["service_cpu_us_per_record"] - 1), 2),
        "paired_median_throughput_lost_pct": round(statistics.median(paired_throughput), 2),
        "paired_median_cpu_added_pct": round(statistics.median(paired_cpu), 2),
    }))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
